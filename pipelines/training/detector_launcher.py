"""Driver side of a detector training run: the same Spark preparation (Parquet shards) and TorchDistributor launch
as YOLACT's (`pipelines.training.launcher`), with the detector's per-rank function; then plots, MLflow and
RUN/summary.json.

    summary = run_detector_training(spark, load_detector_train_config("conf/train_detector.yaml"))
"""

from __future__ import annotations

import dataclasses
import logging

from pyspark.sql import SparkSession

from pipelines.training.detector_config import DetectorTrainConfig
from pipelines.training.detector_step import LOSS_KEYS
from pipelines.training.detector_trainer import detector_train_worker
from pipelines.training.launcher import run_ranks, train_and_report

log = logging.getLogger(__name__)


def launch_detector(spark: SparkSession, cfg: DetectorTrainConfig) -> dict:
    """Run `detector_train_worker` on cfg.distributed.num_processes ranks (cfg.distributed.use_gpu resolved by
    `with_gpu_decision`: one GPU per rank, NCCL); returns rank 0's summary."""
    return run_ranks(spark, cfg, detector_train_worker)


def run_detector_training(spark: SparkSession, cfg: DetectorTrainConfig) -> dict:
    """Prepare, train, report. Returns the summary also written to RUN/summary.json."""
    return train_and_report(
        spark, cfg, lambda c: c.model.detector_config().class_names, launch_detector, _mlflow_params, LOSS_KEYS
    )


def _mlflow_params(cfg: DetectorTrainConfig) -> dict:
    return {
        "strategy": cfg.distributed.strategy,
        "num_processes": cfg.distributed.num_processes,
        "threads_per_process": cfg.distributed.threads_per_process,
        "model": cfg.model.config,
        "use_gpu": cfg.distributed.use_gpu,
        **{f"train.{k}": v for k, v in dataclasses.asdict(cfg.train).items()},
    }
