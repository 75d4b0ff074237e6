"""Executors' Python workers started, and the model loaded in them, while the driver plans the first wave.

The first task on each core pays for starting a Python worker (fork and imports), for verifying and compiling
the model (executor_cache) and for loading the compiled pixel loops, after the driver has planned the wave (index,
balancing shuffle, the wave's plan).
`ExecutorWarmUp` runs that start-up as a job of its own, one tiny task per core, from a driver thread while the
main thread plans: the workers go back to Spark's idle pool with the model in their cache, and the inference tasks
find them there. Earlier still, while the driver lists the input of a run that will infer all it lists (a new
output, or `run.force`), a job of one task starts the first worker (in local mode the job's daemon too, which loads
numba's compiled loops once before it forks the workers; `make bench-startup` measures the gain).

Best effort: the warm-up has its own job group (a tag on a Spark Connect session); a failure is logged at debug
level (an inference task that loads the model reports any error as its own), and the job is cancelled if it is still
running when the run ends.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING

from pipelines.spark.session_kind import session_kind

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import SparkSession

log = logging.getLogger(__name__)
JOB_GROUP_PREFIX = "sparkseg-warm-up-"  # + the run id: what the Spark UI and event logs show (sweeps skip it)


class LoadModel:
    """The warm-up's mapInPandas function: loads `task`'s model into this worker's cache and the compiled pixel
    loops (pipelines.ops.compiled_loops) into the worker, passes its rows on."""

    def __init__(self, task) -> None:
        self.task = task

    def __call__(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        from pipelines.ops import compiled_loops

        self.task.model()
        compiled_loops.load()
        yield from batches


def load_compiled_loops(batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
    """The early start's mapInPandas function: the compiled pixel loops loaded in this worker, its rows passed on."""
    from pipelines.ops import compiled_loops

    compiled_loops.load()
    yield from batches


class ExecutorWarmUp:
    """`with ExecutorWarmUp(spark, function, tasks, name, what):` runs `function` (a mapInPandas function: LoadModel,
    load_compiled_loops) as a job of `tasks` tiny tasks beside the block, in job group JOB_GROUP_PREFIX + name."""

    def __init__(self, spark: SparkSession, function, tasks: int, name: str, what: str) -> None:
        self.spark, self.function, self.tasks, self.what = spark, function, max(1, tasks), what
        self.kind = session_kind(spark)
        self.group = f"{JOB_GROUP_PREFIX}{name}"
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        try:
            with self.kind.tagged(self.group, f"sparkseg: {self.what}"):
                frame = self.spark.range(0, self.tasks, numPartitions=self.tasks)
                frame.mapInPandas(self.function, frame.schema).collect()
        except Exception as err:  # noqa: BLE001  (best effort: the inference tasks load the model themselves)
            log.debug("executor warm-up (%s) did not complete: %s", self.what, err)

    def __enter__(self) -> ExecutorWarmUp:
        self._thread = threading.Thread(target=self._run, name=self.group, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        """Cancels the warm-up job if it still runs when the block ends (it would compete with the inference), except
        when the block ends in an error: then the job is left to end (seconds), as a job cancelled just before the
        session stops fills the console with Spark's warnings about killed tasks under the error message."""
        if self._thread is None or not self._thread.is_alive():
            return
        ends_in_error = exc_type is not None and issubclass(exc_type, Exception)
        if not ends_in_error:
            self.kind.cancel(self.group)
        self._thread.join(timeout=60)
