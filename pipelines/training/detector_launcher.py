"""Driver side of a detector training run: the same Spark preparation (Parquet shards) and TorchDistributor launch
as YOLACT's (`pipelines.training.launcher`), with the detector's per-rank function; then plots, MLflow and
RUN/summary.json.

    summary = run_detector_training(spark, load_detector_train_config("conf/train_detector.yaml"))
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.training import tracking
from pipelines.training.detector_config import DetectorTrainConfig
from pipelines.training.detector_step import LOSS_KEYS
from pipelines.training.launcher import (REPO_ROOT, SUMMARY_NAME, prepare, resolve_paths, ship_packages,
                                         with_gpu_decision)
from pipelines.training.progress import DriverProgress

log = logging.getLogger(__name__)


def launch_detector(spark: SparkSession, cfg: DetectorTrainConfig) -> dict:
    """Run `detector_train_worker` on cfg.distributed.num_processes ranks (cfg.distributed.use_gpu resolved by
    `with_gpu_decision`: one GPU per rank, NCCL); returns rank 0's summary."""
    from pyspark.ml.torch.distributor import TorchDistributor

    from pipelines.training.detector_trainer import detector_train_worker

    paths = [str(REPO_ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    if cfg.distributed.omp_wait_policy:
        os.environ["OMP_WAIT_POLICY"] = cfg.distributed.omp_wait_policy.upper()
    if not cfg.distributed.local_mode:
        ship_packages(spark)
    distributor = TorchDistributor(num_processes=cfg.distributed.num_processes,
                                   local_mode=cfg.distributed.local_mode, use_gpu=bool(cfg.distributed.use_gpu))
    with DriverProgress(cfg.run_dir, enabled=cfg.tracking.progress_bar and cfg.distributed.local_mode):
        return distributor.run(detector_train_worker, cfg.to_dict())


def run_detector_training(spark: SparkSession, cfg: DetectorTrainConfig) -> dict:
    """Prepare, train, report. Returns the summary also written to RUN/summary.json."""
    cfg = with_gpu_decision(spark, resolve_paths(cfg))      # a GPU that is not there fails before preparing
    Path(cfg.run_dir).mkdir(parents=True, exist_ok=True)
    print(f"run directory: {cfg.run_dir} (checkpoints/, metrics.jsonl, summary.json, plots)", flush=True)
    class_names = cfg.model.detector_config().class_names
    started = time.time()
    report = prepare(spark, cfg, class_names)
    print(f"data: {report.usable('train')} train / {report.usable('val')} val images usable; skipped "
          f"{report.skipped()} ({'reused' if report.reused else 'prepared'} {cfg.data.prepared})", flush=True)
    summary = launch_detector(spark, cfg)
    summary["prepare"] = {"counts": report.counts, "reused": report.reused}
    summary["wall_seconds"] = round(time.time() - started, 1)
    baseline = json.loads(Path(cfg.tracking.baseline).read_text()) if cfg.tracking.baseline else None
    summary["speed"] = tracking.speed_report(summary, baseline)
    metrics = tracking.read_metrics(cfg.run_dir)
    evals = [m for m in metrics if m.get("kind") == "eval"]
    summary["last_eval"] = evals[-1] if evals else None
    artifacts = tracking.plot_curves(metrics, cfg.run_dir, LOSS_KEYS) if cfg.tracking.plots else []
    summary_path = Path(cfg.run_dir) / SUMMARY_NAME
    summary_path.write_text(json.dumps(summary, indent=2) + "\n")
    if cfg.tracking.mlflow_uri:
        params = {"strategy": cfg.distributed.strategy, "num_processes": cfg.distributed.num_processes,
                  "threads_per_process": cfg.distributed.threads_per_process, "model": cfg.model.config,
                  "use_gpu": cfg.distributed.use_gpu, **{f"train.{k}": v for k, v in dataclasses.asdict(cfg.train).items()}}
        summary["mlflow_run_id"] = tracking.log_to_mlflow(dataclasses.asdict(cfg.tracking), params, metrics,
                                                          summary, artifacts + [summary_path], LOSS_KEYS)
        summary_path.write_text(json.dumps(summary, indent=2) + "\n")
        store = tracking._mlflow_uri(cfg.tracking.mlflow_uri)
        print(f"MLflow: run {summary['mlflow_run_id']} in experiment '{cfg.tracking.experiment}' at {store} "
              f"(mlflow ui --backend-store-uri {store})", flush=True)
    print(f"run directory: {cfg.run_dir}; summary {summary_path}", flush=True)
    return summary
