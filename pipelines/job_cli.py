"""What every inference job script shares: arguments, config overrides, exit codes and the summary it prints.

    python jobs/infer_yolact.py ...      # -> main(argv, family="yolact")
    python jobs/infer_detector.py ...    # -> main(argv, family="detector")

Exit codes (pipelines.errors): 0 done; 2 bad input, config or model (nothing ran); 3 the job ran but failed its
error budget (summary.json written); 4 another run holds the output's lock (or broke this run's);
1 a bug (with its traceback).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from pipelines.engines.bigdl_inference import BigDLEngine  # noqa: E402
from pipelines.inference.engine import Engine  # noqa: E402
from pipelines.inference.inference_job import plan_job, run_plan  # noqa: E402
from pipelines.inference.native_engine import NativeEngine  # noqa: E402
from pipelines.inference.stream_job import check_checkpoint, run_stream  # noqa: E402
from pipelines.job_config import ConfigError, JobConfig, load_config, set_path  # noqa: E402
from pipelines.spark.spark_session import stop_session, warn_unknown_spark_settings  # noqa: E402
from pipelines.spark.stop_signals import exit_code_of, outcome_decided, stop_on_signals  # noqa: E402

OVERRIDES = {  # command-line flag -> config key
    "input": "input.uri",
    "output": "output.uri",
    "model": "model.dir",
    "partitions": "inference.partitions",
    "batch_size": "inference.batch_size",
    "precision": "inference.precision",
    "engine": "inference.engine",
    "reader": "input.reader",
    "master": "spark.master",
    "remote": "spark.remote",
    "masks": "output.masks",
    "score_threshold": "output.score_threshold",
    "frame_stride": "input.video.frame_stride",
    "fps": "input.video.fps",
    "pin_cores": "inference.pin_cores",
    "max_error_fraction": "run.max_error_fraction",
    "trigger_interval": "stream.trigger_interval",
}

# inference.engine's values -> their backends
ENGINES: dict[str, Callable[[], Engine]] = {"native": NativeEngine, "bigdl": BigDLEngine}


def choose_engine(name: str) -> Engine:
    """The backend the config's inference.engine names (job_config checked it is one of ENGINES): the one place an
    engine's name picks code; the object goes down with the plan."""
    return ENGINES[name]()


def parse_args(
    argv: list[str] | None = None, description: str | None = None, family: str = "yolact"
) -> argparse.Namespace:
    """The job's command line; --masks for YOLACT only (the detector writes boxes)."""
    parser = argparse.ArgumentParser(
        description=description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Options not given take the config's value (--config, else the embedded "
        "conf/local.yaml, whose values the brackets give).",
    )
    packaged = load_config()
    inference = packaged["inference"]
    parser.add_argument("--config", help="YAML config (conf/*.yaml); default: the embedded conf/local.yaml")
    parser.add_argument("--input", help="image/video URI: file://, hdfs://, abfss://, wasbs://, az://container/prefix")
    parser.add_argument("--output", help="output URI (detections/, masks/, errors/, summary.json)")
    parser.add_argument(
        "--model",
        help="export directory with manifest.json, or models:/NAME/VERSION or models:/NAME@ALIAS of an MLflow registry "
        "(MLFLOW_REGISTRY_URI / MLFLOW_TRACKING_URI; needs mlflow) (default: the job's bundled model, model.bundled in "
        "conf/local.yaml)",
    )
    parser.add_argument(
        "--partitions",
        type=int,
        help="tasks per wave, images spread evenly by count (0: "
        "spark.default.parallelism, more where a task would hold over inference.max_images_per_task) "
        f"[{inference['partitions']}]",
    )
    parser.add_argument(
        "--batch-size", type=int, help=f"images per Arrow batch on an executor [{inference['batch_size']}]"
    )
    parser.add_argument(
        "--precision",
        choices=["f32", "bf16", "auto"],
        help=f"OpenVINO inference precision (auto: bf16 where the CPU has it) [{inference['precision']}]",
    )
    parser.add_argument(
        "--pin-cores",
        action="store_const",
        const=True,
        help="each executor Python worker on spark.task.cpus cores of its own (inference.pin_cores; "
        "for hosts that run nothing else)",
    )
    parser.add_argument("--engine", choices=list(ENGINES), help=f"inference engine [{inference['engine']}]")
    parser.add_argument(
        "--reader", choices=["auto", "spark", "azure_sdk"], help=f"how images are read [{packaged['input']['reader']}]"
    )
    parser.add_argument("--master", help=f"Spark master when not run by spark-submit [{packaged['spark']['master']}]")
    parser.add_argument(
        "--remote", help="sc://host:port: run on that Spark Connect server (default: SPARK_REMOTE, else --master)"
    )
    if family == "yolact":
        parser.add_argument(
            "--masks",
            choices=["rle_and_png", "rle", "none"],
            help="what is written per instance: RLE masks and a PNG label map per image, RLE only, "
            f"or none (boxes only) [{packaged['output']['masks']}]",
        )
    parser.add_argument(
        "--score-threshold",
        type=float,
        metavar="S",
        help="write only instances scoring above S (default: the manifest's threshold)",
    )
    parser.add_argument(
        "--frame-stride", type=int, metavar="N", help="videos: process every N-th frame (default 1: every frame)"
    )
    parser.add_argument(
        "--fps",
        type=float,
        metavar="F",
        help="videos: process the first frame at or after every 1/F seconds (resample by timestamp)",
    )
    parser.add_argument(
        "--conf",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a Spark setting (repeatable), added to the config's spark.conf: --conf spark.executor.cores=2",
    )
    parser.add_argument(
        "--max-error-fraction",
        type=float,
        metavar="F",
        help="exit 3 (rows and summary written) when more than this fraction of the run's images "
        f"failed; 1.0: never fail on errors [{packaged['run']['max_error_fraction']}]",
    )
    parser.add_argument(
        "--break-lock",
        action="store_true",
        help="take over the output's lock even while its run looks alive (a lock whose heartbeat "
        "is older than run.lock_stale_after_s is taken over without this; see "
        "docs/operations.md)",
    )
    parser.add_argument("--force", action="store_true", help="recompute images already done for this model")
    stream = packaged["stream"]
    parser.add_argument(
        "--stream",
        action="store_true",
        help="process files as they land in the input, until SIGTERM or Ctrl-C (after the micro-batch in progress); "
        "checkpoint under <output>/_sparkseg_stream (docs/operations.md, Streaming)",
    )
    parser.add_argument(
        "--trigger-interval",
        metavar="T",
        help=f"--stream: a micro-batch at most every T (30s, 500ms, 2min) [{stream['trigger_interval']}]",
    )
    parser.add_argument(
        "--available-now",
        action="store_true",
        help="a stream that processes every file not yet done, then stops (for schedules and serverless)",
    )
    parser.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="sparkseg's own log: -v info (planning, pinning, listing choices), -vv debug; Spark's "
        "log level is the config's spark.log_level",
    )
    return parser.parse_args(argv)


def build_config(args: argparse.Namespace, family: str = "yolact") -> dict:
    """The job's config: the YAML (or the embedded default) with the command line's overrides. Raises ConfigError."""
    config = load_config(args.config)
    if args.config is None:
        config["spark"]["app_name"] = f"sparkseg-infer-{family}"
    for flag, key in OVERRIDES.items():
        if getattr(args, flag, None) is not None:
            set_path(config, key, getattr(args, flag))
    for setting in args.conf:
        key, sep, value = setting.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--conf {setting!r}: expected KEY=VALUE, e.g. --conf spark.executor.cores=2")
        config["spark"]["conf"] = {**(config["spark"]["conf"] or {}), key.strip(): value}
    if args.force:
        config["run"]["force"] = True
    if args.break_lock:
        config["run"]["break_lock"] = True
    if args.available_now:
        config["stream"]["available_now"] = True
    return config


def main(argv: list[str] | None = None, family: str = "yolact", description: str | None = None) -> int:
    """Parse `argv`, build the config, plan the job (bad input fails here, before any JVM starts), start Spark,
    run it; the exit code. Expected failures (SparkSegError) print one line; anything else is a bug and raises."""
    args = parse_args(argv, description, family)
    logging.basicConfig(level=logging.WARNING, format="sparkseg: %(levelname)s: %(message)s")
    if args.verbose:
        logging.getLogger("pipelines").setLevel(logging.INFO if args.verbose == 1 else logging.DEBUG)
    try:
        code = run_job(args, family)
    except BaseException as error:  # an expected error, a bug, or after a stop whatever the stopped context raised
        code = exit_code_of(
            error,
            "the images this run committed before it are kept; run the same command again to go on (it skips them)",
        )
    return outcome_decided(code)


def run_job(args: argparse.Namespace, family: str) -> int:
    """main's work once the arguments are parsed: 0, or the error main maps to an exit code."""
    config = JobConfig.of(build_config(args, family))
    engine = choose_engine(config.inference.engine)
    plan = plan_job(config, family, engine=engine)
    stream = args.stream or config.stream.available_now
    if stream:
        check_checkpoint(plan)  # before the JVM starts
    settings = plan.config.spark
    spark = engine.session(settings)
    try:
        stop_on_signals(spark)
        warn_unknown_spark_settings(spark, settings.conf)
        summary = run_stream(spark, plan) if stream else run_plan(spark, plan)
    finally:
        stop_session(spark)
    if summary is None:  # a stream that found nothing new
        print(f"\nsparkseg: nothing new under {plan.input_uri}; output {plan.output_uri} unchanged")
    else:
        print_summary(summary)
    return 0


def main_yolact() -> int:
    """The `sparkseg-infer-yolact` command of an installed package (= python jobs/infer_yolact.py)."""
    return main(family="yolact", description="Batch YOLACT inference on Spark (see jobs/infer_yolact.py).")


def main_detector() -> int:
    """The `sparkseg-infer-detector` command of an installed package (= python jobs/infer_detector.py)."""
    return main(family="detector", description="Batch object detection on Spark (see jobs/infer_detector.py).")


def print_summary(summary: dict) -> None:
    counts = summary["counts"]
    if counts.get("videos"):
        print(
            f"\nsparkseg: {counts['inputs']} files ({counts['videos']} videos) under {summary['input']}; "
            f"{counts['frames']} video frames done, {summary['frames_per_second']} frames/s"
        )
    else:
        print(f"\nsparkseg: {counts['inputs']} images under {summary['input']}")
    print(
        f"  done {counts['done']}, failed {counts['failed']} (see errors/), skipped {counts['skipped']} "
        f"(already done for this model), {counts['instances']} instances"
    )
    if summary.get("failed_types"):
        print("  failed by type: " + ", ".join(f"{n} {kind}" for kind, n in summary["failed_types"].items()))
    unit = "images+frames" if counts.get("videos") else "images"  # result rows, failed ones too
    print(
        f"  {summary['images_per_second']} {unit}/s over {summary['wall_seconds']} s, {summary['partitions']} "
        f"partitions; stage seconds {json.dumps(summary['stage_seconds'])}"
    )
    print(f"  model {summary['model']['name']} ({summary['model']['sha256'][:12]}), output {summary['output']}")
    if summary["model"]["note"]:
        print(f"  NOTE: {summary['model']['note']}")
    failed = summary.get("failed_images") or []
    for path in failed:
        print(f"  failed: {path}")
    if counts["failed"] > len(failed):
        print(f"  ... and {counts['failed'] - len(failed)} more failed images in {summary['output']}/errors")
    if summary.get("report"):
        print(f"  report: {summary['report']}  (open it in a browser)")


if __name__ == "__main__":  # python -m pipelines.job_cli: the YOLACT job of an installed package
    sys.exit(main_yolact())
