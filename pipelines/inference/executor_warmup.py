"""Executors' Python workers started, and the model loading in them, while the driver lists and plans.

The first task on each core pays for starting a Python worker (fork and imports) and for verifying and compiling
the model (executor_cache): ~1.8 s per first-round task on 2 cores for the bundled model. `ExecutorWarmUp` runs that
start-up as a job of its own, one tiny task per core, from a driver thread while the main thread goes on. Each task
starts its worker (the imports) and the model's load in a thread of that worker (LazyModel.start_loading), and ends:
its core is free again for the listing's own jobs while the worker compiles, and the worker goes back to Spark's
idle pool, where the inference tasks find it with the model loaded (or wait for the load under way).

Best effort: the warm-up has its own job group; a failure is logged at debug level (an inference task that loads
the model reports any error as its own), and the job is cancelled if it is still running when the run ends.
"""
from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
JOB_GROUP_PREFIX = "sparkseg-warm-up-"   # + the run id: what the Spark UI and event logs show (sweeps skip it)


class LoadModel:
    """The warm-up's mapInPandas function: starts loading `task`'s model into this worker's cache (in a thread of
    the worker), passes its rows on."""

    def __init__(self, task) -> None:
        self.task = task

    def __call__(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        self.task.cached_model().start_loading()
        yield from batches


class ExecutorWarmUp:
    """`with ExecutorWarmUp(spark, task, tasks, name):` runs the warm-up job beside the block."""

    def __init__(self, spark: SparkSession, task, tasks: int, name: str) -> None:
        self.spark, self.task, self.tasks = spark, task, max(1, tasks)
        self.group = f"{JOB_GROUP_PREFIX}{name}"
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        try:
            self.spark.sparkContext.setJobGroup(self.group, "sparkseg: start Python workers, load the model")
            frame = self.spark.range(0, self.tasks, numPartitions=self.tasks)
            frame.mapInPandas(LoadModel(self.task), frame.schema).collect()
        except Exception as err:  # noqa: BLE001  (best effort: the inference tasks load the model themselves)
            log.debug("executor warm-up did not complete: %s", err)

    def __enter__(self) -> "ExecutorWarmUp":
        self._thread = threading.Thread(target=self._run, name=self.group, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._thread is not None and self._thread.is_alive():
            self.spark.sparkContext.cancelJobGroup(self.group)
            self._thread.join(timeout=60)
