"""The progress line's "tasks running" comes from Spark's status store: tasks that start together with their stage
are counted at once, not only at the next executor heartbeat (10 s)."""

from __future__ import annotations

import threading
import time

from pipelines.inference.progress import ProgressReporter
from pipelines.spark.executor_loss import LostExecutor, describe
from pipelines.spark.session_kind import session_kind


def wait_for(condition, timeout_s: float = 120) -> bool:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_tasks_that_start_with_their_stage_are_counted_as_running(spark, tmp_path):
    release = tmp_path / "release"

    def hold(batches):  # each task says it started, then runs until the test has looked
        from pyspark import TaskContext

        (tmp_path / f"started-{TaskContext.get().partitionId()}").touch()
        wait_for(release.exists)
        yield from batches

    reporter = ProgressReporter(session_kind(spark), total=2, interval_s=0)
    job = threading.Thread(target=lambda: spark.range(2).repartition(2).mapInPandas(hold, "id long").collect())
    job.start()
    try:
        assert wait_for(lambda: len(list(tmp_path.glob("started-*"))) == 2)
        spark.sparkContext._jsc.sc().listenerBus().waitUntilEmpty()  # both task-start events are in the store
        assert reporter.running_tasks() == 2
    finally:
        release.touch()
        job.join(timeout=120)
    assert not job.is_alive()


def test_a_lost_executor_is_one_line_naming_its_host_and_the_tasks_re_run():
    loss = LostExecutor("3", "10.0.0.5", "worker lost", ((7, 4), (5, 2), (7, 1)))
    line = describe(loss, "/tmp/sparkseg-spark-1.log")
    assert line.startswith("lost executor 3 on host 10.0.0.5 (worker lost): task 2 of stage 5")
    assert "task 2 of stage 5 and tasks 1, 4 of stage 7 re-run" in line and "\n" not in line
    assert line.endswith("(nothing is lost; Spark's log: /tmp/sparkseg-spark-1.log)")
    assert "no task was running there" in describe(LostExecutor("0", "h", "", ()), None)
