"""Driver side of a training run: prepare the data once with Spark, launch the ranks with pyspark's
TorchDistributor (gloo on CPU, one GPU per rank and NCCL where ``distributed.use_gpu`` says so; local mode =
processes on the driver machine, cluster mode = Spark barrier tasks on executors), then speed figures, plots,
MLflow and RUN/summary.json.

    summary = run_training(spark, load_train_config("conf/train_yolact.yaml"))
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.io.local_paths import resolve_local
from pipelines.spark.session_kind import session_kind
from pipelines.spark.stop_signals import children_stop_on_signals
from pipelines.training import tracking
from pipelines.training.config import TrainConfig, TrainConfigError
from pipelines.training.devices import (
    GpuUnavailableError,
    cuda_available,
    local_gpu_conf,
    parse_use_gpu,
    resolve_use_gpu,
)
from pipelines.training.prepare import REPORT_NAME, PrepareSpec, prepare_training_data
from pipelines.training.progress import DriverProgress
from pipelines.training.trainer import train_worker

LOG = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
SUMMARY_NAME = "summary.json"


def resolve_paths(cfg: TrainConfig) -> TrainConfig:
    """Relative paths -> absolute (ranks may run in another working directory): the working directory's, else the
    checkout's where only there it exists (local_paths.resolve_local; the run and prepared data directories too, so
    that a run started from the checkout is found again from elsewhere)."""
    data = dataclasses.replace(
        cfg.data,
        images=resolve_local(cfg.data.images),
        annotations=resolve_local(cfg.data.annotations),
        prepared=resolve_local(cfg.data.prepared),
    )
    model = dataclasses.replace(cfg.model, init=resolve_local(cfg.model.init) if cfg.model.init else None)
    tracking_cfg = dataclasses.replace(
        cfg.tracking, baseline=resolve_local(cfg.tracking.baseline) if cfg.tracking.baseline else None
    )
    return dataclasses.replace(cfg, run_dir=resolve_local(cfg.run_dir), data=data, model=model, tracking=tracking_cfg)


def prepare(spark: SparkSession, cfg: TrainConfig, class_names: tuple[str, ...]):
    d = cfg.data
    return prepare_training_data(
        spark,
        PrepareSpec(
            d.images,
            d.annotations,
            d.prepared,
            tuple(class_names),
            d.num_shards,
            d.val_fraction,
            d.split_seed,
            d.reprepare,
        ),
    )


def launch(spark: SparkSession, cfg: TrainConfig) -> dict:
    """Run `train_worker` on cfg.distributed.num_processes ranks; returns rank 0's summary."""
    return run_ranks(spark, cfg, train_worker, decide_gpu=True)


def run_ranks(spark: SparkSession, cfg, worker: Callable[[dict], dict | None], decide_gpu: bool = False) -> dict:
    """Run worker(cfg.to_dict()) on cfg.distributed.num_processes TorchDistributor ranks (decide_gpu: resolve
    distributed.use_gpu here first, else it is resolved already); returns rank 0's summary."""
    from pyspark.ml.torch.distributor import TorchDistributor

    if not cfg.distributed.local_mode:
        ship_packages(spark)
    if decide_gpu:
        cfg = with_gpu_decision(spark, cfg)
        LOG.info(
            "training on %s (%d ranks)",
            "GPUs, NCCL" if cfg.distributed.use_gpu else "CPUs, gloo",
            cfg.distributed.num_processes,
        )
    distributor = TorchDistributor(
        num_processes=cfg.distributed.num_processes,
        local_mode=cfg.distributed.local_mode,
        use_gpu=bool(cfg.distributed.use_gpu),
    )
    with (
        rank_environment(cfg),
        children_stop_on_signals(local=cfg.distributed.local_mode),
        DriverProgress(cfg.run_dir, enabled=cfg.tracking.progress_bar and cfg.distributed.local_mode),
    ):
        return distributor.run(worker, cfg.to_dict())


@contextlib.contextmanager
def rank_environment(cfg):
    """The environment variables local-mode ranks inherit, set for the launch only: the driver's own environment is
    restored afterwards (a notebook or a test session goes on with what it had)."""
    saved = {name: os.environ.get(name) for name in ("PYTHONPATH", "OMP_WAIT_POLICY")}
    paths = [str(REPO_ROOT)] + [p for p in (saved["PYTHONPATH"] or "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))  # ranks import pipelines, model_export
    if cfg.distributed.omp_wait_policy:
        # OpenMP threads that spin at barriers stall each other when the cores are shared; passive waiting avoids
        # that. Read when the ranks start (inherited env).
        os.environ["OMP_WAIT_POLICY"] = cfg.distributed.omp_wait_policy.upper()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def with_gpu_decision(spark: SparkSession, cfg: TrainConfig) -> TrainConfig:
    """cfg with distributed.use_gpu resolved to True/False (what the ranks are told)."""
    use_gpu = gpu_decision(spark, cfg)
    return dataclasses.replace(cfg, distributed=dataclasses.replace(cfg.distributed, use_gpu=use_gpu))


def gpu_decision(spark: SparkSession, cfg: TrainConfig) -> bool:
    """distributed.use_gpu resolved on the driver (devices.resolve_use_gpu); in local mode the session must also
    give the driver one GPU per rank (spark.driver.resource.gpu.*, see session_conf), or TorchDistributor cannot
    hand them out."""
    d = cfg.distributed
    use_gpu = resolve_use_gpu(d.use_gpu, d.local_mode, spark.conf.get("spark.task.resource.gpu.amount", None))
    if use_gpu and d.local_mode:
        gpus = session_kind(spark).driver_resources("gpu")
        if gpus is None or len(gpus) < d.num_processes:
            if parse_use_gpu(d.use_gpu) == "auto":
                LOG.warning(
                    "CUDA is visible but the Spark session gives the driver no GPUs "
                    "(spark.driver.resource.gpu.amount): training on CPUs"
                )
                return False
            raise GpuUnavailableError(
                f"distributed.use_gpu with local_mode needs the session to own {d.num_processes} GPU(s): start it with "
                + ", ".join(f"{k}={v}" for k, v in local_gpu_conf(d.num_processes).items())
                + " (jobs/train_yolact.py does), or use_gpu: false"
            )
    return use_gpu


def session_conf(cfg: TrainConfig) -> dict[str, str]:
    """Spark settings of the job's session: the driver's GPUs (local mode, GPUs wanted and visible), then
    spark.conf from the config (which wins)."""
    d = cfg.distributed
    wanted = parse_use_gpu(d.use_gpu)
    gpus = {}
    if d.local_mode and wanted is not False and cuda_available():
        gpus = local_gpu_conf(d.num_processes)
    return {**gpus, **{str(k): str(v) for k, v in cfg.spark.conf.items()}}


def ship_packages(spark: SparkSession) -> None:
    """Executors need `pipelines` and `model_export` (and torch in their Python environment)."""

    kind = session_kind(spark)
    kind.ship_library()
    kind.ship_package(REPO_ROOT / "model_export")


def run_training(spark: SparkSession, cfg: TrainConfig) -> dict:
    """Prepare, train, report. Returns the summary also written to RUN/summary.json."""
    return train_and_report(
        spark, cfg, lambda c: c.model.yolact_config().class_names, launch, _mlflow_params, tracking.YOLACT_LOSS_KEYS
    )


def _mlflow_params(cfg: TrainConfig) -> dict:
    return {
        "strategy": cfg.distributed.strategy,
        "num_processes": cfg.distributed.num_processes,
        "threads_per_process": cfg.distributed.threads_per_process,
        "pipeline_stages": cfg.pipeline_stages,
        "model": cfg.model.config,
        "max_size": cfg.model.max_size,
        **{f"train.{k}": v for k, v in dataclasses.asdict(cfg.train).items()},
    }


def check_splits(cfg, report) -> None:
    """Before any rank starts: a split the run needs holds at least one usable image (else TrainConfigError, exit 2,
    saying what to change); the skipped images are named in the prepared data's prepare_report.json."""
    where = f"{cfg.data.prepared}/{REPORT_NAME} names the skipped images"
    if not report.usable("train"):
        raise TrainConfigError(
            f"no usable training image (skipped {report.skipped('train')}; {where}): check "
            "data.images and data.annotations"
        )
    if cfg.eval.every_epochs and not report.usable("val"):
        raise TrainConfigError(
            f"the val split has no usable image to evaluate on (skipped {report.skipped('val')}; "
            f"{where}): raise data.val_fraction ({cfg.data.val_fraction}) or annotate more "
            "images, or set eval.every_epochs: 0 to train without evaluation"
        )


def train_and_report(
    spark: SparkSession,
    cfg,
    class_names_of: Callable,
    launch_ranks: Callable,
    mlflow_params: Callable[..., dict],
    loss_keys: tuple[str, ...],
) -> dict:
    """Prepare the data, launch_ranks(spark, cfg), then speed, plots (loss_keys), MLflow (mlflow_params(cfg)) and
    RUN/summary.json. cfg's paths and distributed.use_gpu are resolved first (a GPU that is not there fails before
    preparing); class_names_of(cfg): the model's classes. Returns the summary."""
    cfg = with_gpu_decision(spark, resolve_paths(cfg))
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    print(f"run directory: {cfg.run_dir} (checkpoints/, metrics.jsonl, summary.json, plots)", flush=True)
    class_names = class_names_of(cfg)
    started = time.time()
    report = prepare(spark, cfg, class_names)
    print(
        f"data: {report.usable('train')} train / {report.usable('val')} val images usable; skipped "
        f"{report.skipped()} ({'reused' if report.reused else 'prepared'} {cfg.data.prepared})",
        flush=True,
    )
    check_splits(cfg, report)
    summary = launch_ranks(spark, cfg)
    summary_path = Path(cfg.run_dir) / SUMMARY_NAME
    if not summary.get("steps_this_run") and summary_path.is_file():  # a finished run started again
        print(f"nothing trained: {summary_path} and the MLflow run stay those of the run that trained", flush=True)
        return json.loads(summary_path.read_text())
    summary["prepare"] = {"counts": report.counts, "reused": report.reused}
    summary["wall_seconds"] = round(time.time() - started, 1)
    baseline = json.loads(Path(cfg.tracking.baseline).read_text()) if cfg.tracking.baseline else None
    summary["speed"] = tracking.speed_report(summary, baseline)
    metrics = tracking.read_metrics(cfg.run_dir)
    evals = [m for m in metrics if m.get("kind") == "eval"]
    summary["last_eval"] = evals[-1] if evals else None
    artifacts = tracking.plot_curves(metrics, cfg.run_dir, loss_keys) if cfg.tracking.plots else []
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.tracking.mlflow_uri:
        summary["mlflow_run_id"] = tracking.log_to_mlflow(
            dataclasses.asdict(cfg.tracking),
            mlflow_params(cfg),
            metrics,
            summary,
            artifacts + [summary_path],
            loss_keys,
        )
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        store = tracking._mlflow_uri(cfg.tracking.mlflow_uri)
        print(
            f"MLflow: run {summary['mlflow_run_id']} in experiment '{cfg.tracking.experiment}' at {store} "
            f"(mlflow ui --backend-store-uri {store})",
            flush=True,
        )
    print(f"run directory: {cfg.run_dir}; summary {summary_path}", flush=True)
    return summary
