"""Train YOLACT on Spark: images + COCO annotations from storage -> Parquet shards -> TorchDistributor ranks.

    python jobs/train_yolact.py --config conf/train_yolact.yaml --strategy ddp --num-processes 2
    spark-submit jobs/train_yolact.py --config my.yaml --set distributed.local_mode=false
    python jobs/train_yolact.py --set train.epochs=3 --set data.images=/data/roads/images ...

Strategies: local (1 process, N threads), ddp, pipeline (GPipe stages), hybrid (data-parallel pipelines).
Killed? Run the same command again: it resumes from the newest checkpoint in run_dir.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing

FLAGS = {"strategy": "distributed.strategy", "num_processes": "distributed.num_processes",
         "threads": "distributed.threads_per_process", "run_dir": "run_dir", "epochs": "train.epochs"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML (default conf/train_yolact.yaml)")
    parser.add_argument("--strategy", choices=["local", "ddp", "pipeline", "hybrid"])
    parser.add_argument("--num-processes", type=int, help="ranks")
    parser.add_argument("--threads", type=int, help="torch threads per rank")
    parser.add_argument("--run-dir", help="output / resume directory")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key (YAML value), e.g. --set train.lr=0.002")
    return parser.parse_args(argv)


def overrides_from(args: argparse.Namespace) -> dict:
    overrides = {key: getattr(args, flag) for flag, key in FLAGS.items() if getattr(args, flag) is not None}
    for item in args.set:
        if "=" not in item:
            raise SystemExit(f"error: --set {item!r}: write KEY=VALUE, e.g. train.epochs=3")
        key, value = item.split("=", 1)
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pipelines.training.config import TrainConfigError, load_train_config

    try:
        cfg = load_train_config(args.config, overrides_from(args))
    except TrainConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    from pipelines.spark_session import job_session
    from pipelines.training.launcher import run_training, session_conf

    spark = job_session({"master": cfg.spark.master, "app_name": cfg.spark.app_name, "conf": session_conf(cfg)})
    try:
        summary = run_training(spark, cfg)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(json.dumps({k: summary.get(k) for k in ("strategy", "world", "speed", "state", "last_eval",
                                                  "wall_seconds")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
