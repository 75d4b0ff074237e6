"""The command line the Spark training jobs share (jobs/train_yolact.py, jobs/train_detector.py): the same flags,
``--set KEY=VALUE`` overrides, errors mapped to exit codes by class (pipelines.errors), a Spark session for the run, a
short JSON summary.

    args = parse_train_args(__doc__, "conf/train_yolact.yaml", argv, choices=[...])
    return run_train_job(args, load_train_config, run_training, SUMMARY_KEYS)
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence

from pipelines.spark.spark_session import job_session, stop_session
from pipelines.spark.stop_signals import exit_code_of, outcome_decided, stop_on_signals
from pipelines.training.launcher import session_conf

FLAGS = {
    "strategy": "distributed.strategy",
    "num_processes": "distributed.num_processes",
    "threads": "distributed.threads_per_process",
    "run_dir": "run_dir",
    "epochs": "train.epochs",
}


def parse_train_args(
    description: str, default_config: str, argv: list[str] | None = None, **strategy_option
) -> argparse.Namespace:
    """The jobs' flags; strategy_option: argparse keywords of --strategy (choices or help)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help=f"YAML (default {default_config})")
    parser.add_argument("--strategy", **strategy_option)
    parser.add_argument("--num-processes", type=int, help="ranks")
    parser.add_argument("--threads", type=int, help="torch threads per rank")
    parser.add_argument("--run-dir", help="output / resume directory")
    parser.add_argument("--epochs", type=int)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override any config key (YAML value), e.g. --set train.lr=0.002",
    )
    return parser.parse_args(argv)


def set_overrides(items: Sequence[str]) -> dict:
    """--set KEY=VALUE items -> {dotted key: YAML value}; a malformed item exits with an error."""
    import yaml

    overrides = {}
    for item in items:
        if "=" not in item:
            raise SystemExit(f"error: --set {item!r}: write KEY=VALUE, e.g. train.epochs=3")
        key, value = item.split("=", 1)
        overrides[key.strip()] = yaml.safe_load(value)
    return overrides


def overrides_from(args: argparse.Namespace) -> dict:
    """The flags that were given, then the --set items, as dotted config overrides."""
    overrides = {key: getattr(args, flag) for flag, key in FLAGS.items() if getattr(args, flag) is not None}
    overrides.update(set_overrides(args.set))
    return overrides


def run_train_job(
    args: argparse.Namespace, load_config: Callable, run_training: Callable, summary_keys: Sequence[str]
) -> int:
    """Load the config, run_training(spark, cfg) in a job session, print the summary's summary_keys. Returns the exit
    code: a SparkSegError prints one line and exits with its code; Ctrl-C or SIGTERM stops the run (stop_on_signals)
    and exits 130 or 143 with one line; anything else is a bug (traceback, exit 1)."""
    try:
        summary = train(args, load_config, run_training)
    except BaseException as error:  # an expected error, a bug, or after a stop what the stopped run raised
        return outcome_decided(
            exit_code_of(error, "the run keeps its checkpoints; run the same command again to resume from the newest")
        )
    print(json.dumps({k: summary.get(k) for k in summary_keys}, indent=2))
    return outcome_decided(0)


def train(args: argparse.Namespace, load_config: Callable, run_training: Callable) -> dict:
    """run_train_job's work: the run's summary."""
    cfg = load_config(args.config, overrides_from(args))
    spark = job_session(cfg.spark.master, cfg.spark.app_name, session_conf(cfg))
    try:
        stop_on_signals()
        return run_training(spark, cfg)
    finally:
        stop_session(spark)
