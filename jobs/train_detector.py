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
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout without installing

FLAGS = {"strategy": "distributed.strategy", "num_processes": "distributed.num_processes",
         "threads": "distributed.threads_per_process", "run_dir": "run_dir", "epochs": "train.epochs"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML (default conf/train_detector.yaml)")
    parser.add_argument("--strategy", help="local or ddp")
    parser.add_argument("--num-processes", type=int, help="ranks")
    parser.add_argument("--threads", type=int, help="torch threads per rank")
    parser.add_argument("--run-dir", help="output / resume directory")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override any config key (YAML value), e.g. --set train.lr=0.002")
    return parser.parse_args(argv)


def overrides_from(args: argparse.Namespace) -> dict:
    import yaml

    overrides = {key: getattr(args, flag) for flag, key in FLAGS.items() if getattr(args, flag) is not None}
    for item in args.set:
        if "=" not in item:
            raise SystemExit(f"error: --set {item!r}: write KEY=VALUE, e.g. train.epochs=3")
        key, value = item.split("=", 1)
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from pipelines.errors import UsageError
    from pipelines.training.detector_config import load_detector_train_config

    try:
        overrides = overrides_from(args)
        cfg = load_detector_train_config(args.config, overrides)
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return err.exit_code
    from pipelines.spark_session import job_session
    from pipelines.training.detector_launcher import run_detector_training
    from pipelines.training.launcher import session_conf

    spark = job_session({"master": cfg.spark.master, "app_name": cfg.spark.app_name, "conf": session_conf(cfg)})
    try:
        summary = run_detector_training(spark, cfg)
    except (ValueError, FileNotFoundError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        spark.stop()
    print(json.dumps({k: summary.get(k) for k in ("strategy", "world", "device", "speed", "state", "last_eval",
                                                  "wall_seconds")}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
