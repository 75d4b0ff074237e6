"""What an inference backend does for a job: the `Engine` protocol.

A backend is an object, chosen once from the config's `inference.engine` where the run is built
(pipelines.job_cli.choose_engine) and passed down with the plan; the job never compares engine names. The native
engine (pipelines.inference.native_engine) runs the model in the executors' Python workers; the bigdl engine
(pipelines.engines.bigdl_backend) through BigDL's preprocessing and Orca's OpenVINO Estimator.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from pipelines.inference.image_inference import ImageInference
from pipelines.inference.model_manifest import ModelManifest
from pipelines.job_config import SparkSettings


class Engine(Protocol):
    """An inference backend. `name`: as the config and the summary spell it. `takes_videos`: whether it reads video
    input. `azure_sdk_fix`: what to do when an az:// input or output needs the Azure SDK this env lacks.
    `env_hint`: the command that builds the env it runs in, where it needs one of its own (None: the main env).
    `worker_modules`: what the executors' Python must import, checked before any work where the job does not choose
    that Python (a Spark Connect server's)."""

    name: str
    takes_videos: bool
    azure_sdk_fix: str
    env_hint: str | None
    worker_modules: tuple[str, ...]

    def require(self) -> None:
        """Raise (a UsageError naming the fix) when this interpreter cannot run the engine: on the driver, before
        any JVM starts."""
        ...

    def session(self, settings: SparkSettings) -> SparkSession:
        """The job's session, with the settings the engine needs (spark-submit's own master and settings win)."""
        ...

    def start_workers(self, spark: SparkSession, run_id: str) -> AbstractContextManager:
        """Executors started while the driver lists the input of a run that will infer all it lists."""
        ...

    def warm_up(
        self, spark: SparkSession, task: ImageInference, partitions: int, run_id: str
    ) -> AbstractContextManager:
        """Executors made ready (model loaded) while the driver plans the first wave of `partitions` tasks."""
        ...

    def results(
        self, images: DataFrame, task: ImageInference, manifest: ModelManifest, precision: str
    ) -> tuple[DataFrame, list[DataFrame]]:
        """Transform: a wave's images (with content or fetchable paths) -> (RESULT_SCHEMA rows; the frames the engine
        persisted for them, to unpersist once the rows are written)."""
        ...
