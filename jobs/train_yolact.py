"""Train YOLACT on Spark: images + COCO annotations from storage -> Parquet shards -> TorchDistributor ranks.

    python jobs/train_yolact.py --config conf/train_yolact.yaml --strategy ddp --num-processes 2
    spark-submit jobs/train_yolact.py --config my.yaml --set distributed.local_mode=false
    python jobs/train_yolact.py --set train.epochs=3 --set data.images=/data/roads/images ...

Strategies: local (1 process, N threads), ddp, pipeline (GPipe stages), hybrid (data-parallel pipelines).
Killed? Run the same command again: it resumes from the newest checkpoint in run_dir.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipelines.training.train_job import parse_train_args, run_train_job  # noqa: E402

SUMMARY_KEYS = ("strategy", "world", "speed", "state", "last_eval", "wall_seconds")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parse_train_args(__doc__, "conf/train_yolact.yaml", argv, choices=["local", "ddp", "pipeline", "hybrid"])


def run_training(spark, cfg) -> dict:
    # the training modules import torch (an optional dependency): loaded once a run starts, not for --help
    from pipelines.training.launcher import run_training as run_yolact_training

    return run_yolact_training(spark, cfg)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pipelines.training.config import load_train_config  # torch too, once the arguments are parsed

    return run_train_job(args, load_train_config, run_training, SUMMARY_KEYS)


if __name__ == "__main__":
    sys.exit(main())
