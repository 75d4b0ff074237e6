"""The native engine: the model runs in the executors' Python workers (OpenVINO), one Arrow batch of images at a
time (ImageInference through mapInArrow)."""

from __future__ import annotations

from contextlib import AbstractContextManager

from pyspark.sql import DataFrame, SparkSession

from pipelines.inference.executor_warmup import ExecutorWarmUp, LoadModel, load_compiled_loops
from pipelines.inference.image_inference import ImageInference
from pipelines.inference.model_manifest import ModelManifest
from pipelines.job_config import SparkSettings
from pipelines.results.result_schema import RESULT_SCHEMA
from pipelines.spark.session_kind import session_kind
from pipelines.spark.spark_session import job_session


class NativeEngine:
    """The default engine (pipelines.inference.engine.Engine)."""

    name: str = "native"
    takes_videos: bool = True
    azure_sdk_fix: str = "this env has no Azure SDK: pip install -c constraints.txt '.[azure]'"
    env_hint: str | None = None
    worker_modules: tuple[str, ...] = ("openvino", "pipelines.inference.image_inference")

    def require(self) -> None:
        """Runs in the main env: nothing to check beyond what the package needs."""

    def session(self, settings: SparkSettings) -> SparkSession:
        return job_session(settings.master, settings.app_name, settings.conf, settings.log_level, settings.remote)

    def start_workers(self, spark: SparkSession, run_id: str) -> AbstractContextManager:
        """The first Python worker started while the driver lists the input (executor_warmup)."""
        return ExecutorWarmUp(spark, load_compiled_loops, 1, f"{run_id}-workers", "start a Python worker")

    def warm_up(
        self, spark: SparkSession, task: ImageInference, partitions: int, run_id: str
    ) -> AbstractContextManager:
        """One task per core the first round of `partitions` tasks uses starts its worker and loads the model."""
        return ExecutorWarmUp(
            spark,
            LoadModel(task),
            min(partitions, session_kind(spark).default_parallelism()),
            run_id,
            "start Python workers, load the model",
        )

    def results(
        self, images: DataFrame, task: ImageInference, manifest: ModelManifest, precision: str
    ) -> tuple[DataFrame, list[DataFrame]]:
        return images.mapInArrow(task, RESULT_SCHEMA), []
