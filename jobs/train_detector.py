"""Train the road-distress detector (FactorNet Faster R-CNN) on Spark: images + COCO boxes from storage ->
Parquet shards -> TorchDistributor ranks (gloo on CPU, NCCL on GPUs).

    python jobs/train_detector.py --config conf/train_detector.yaml --strategy ddp --num-processes 2
    spark-submit jobs/train_detector.py --config my.yaml --set distributed.local_mode=false
    python jobs/train_detector.py --set data.images=/data/roads/images --set data.annotations=/data/roads/coco.json

Strategies: local (1 process, N threads) and ddp (pipeline and hybrid are YOLACT's: refused, exit 2).
Killed? Run the same command again: it resumes from the newest checkpoint in run_dir.
Without Spark on one machine (a GPU box with no Java): python -m pipelines.training.detector_trainer --help.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipelines.training.train_job import parse_train_args, run_train_job  # noqa: E402

SUMMARY_KEYS = ("strategy", "world", "device", "speed", "state", "last_eval", "wall_seconds")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return parse_train_args(__doc__, "conf/train_detector.yaml", argv, help="local or ddp")


def run_training(spark, cfg) -> dict:
    # the training modules import torch (an optional dependency): loaded once a run starts, not for --help
    from pipelines.training.detector_launcher import run_detector_training

    return run_detector_training(spark, cfg)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pipelines.training.detector_config import load_detector_train_config  # torch too, once parsed

    return run_train_job(args, load_detector_train_config, run_training, SUMMARY_KEYS)


if __name__ == "__main__":
    sys.exit(main())
