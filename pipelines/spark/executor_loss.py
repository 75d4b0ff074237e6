"""Lost executors as the driver's status store records them: which host, why, and which tasks ran there when it
went (they re-run elsewhere). Spark's own words on a loss (a line per task, the fetch failures' stack traces) go to
its log file only (conf/log4j2.properties): the job tells the console in one line per executor (describe)."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.spark.jvm_logging import spark_log_file

SETTLE_POLLS = 3  # polls a loss waits for its tasks' ends to reach the store before it is told without them


@dataclass(frozen=True)
class LostExecutor:
    """An executor gone: `tasks`, (stage, task index) of the attempts that ended with it."""

    executor_id: str
    host: str
    reason: str
    tasks: tuple[tuple[int, int], ...]


def describe(loss: LostExecutor, log_file: str | None) -> str:
    """One line about `loss`: the host, the reason, the tasks re-run (`log_file`: where Spark's detail is)."""
    by_stage: dict[int, list[int]] = {}
    for stage, index in loss.tasks:
        by_stage.setdefault(stage, []).append(index)
    if by_stage:
        tasks = " and ".join(
            f"task{'s' if len(indexes) > 1 else ''} {', '.join(map(str, sorted(indexes)))} of stage {stage}"
            for stage, indexes in sorted(by_stage.items())
        )
        rerun = f"{tasks} re-run on the other executors"
    else:
        rerun = "no task was running there"
    where = f"; Spark's log: {log_file}" if log_file else ""
    return (
        f"lost executor {loss.executor_id} on host {loss.host} ({loss.reason or 'no reason given'}): {rerun}, and "
        f"any shuffle output it held is computed again (nothing is lost{where})"
    )


def _scala_list(seq) -> list:
    return [seq.apply(i) for i in range(seq.size())]


def _option(value) -> str | None:
    return str(value.get()) if value.isDefined() else None


class ExecutorLossWatch:
    """The executors of a classic SparkContext lost since the watch began, each told once by `new_losses`, polled
    from Spark's status store (what the UI shows: no listener of ours in the JVM)."""

    def __init__(self, context) -> None:
        self.store = context._jsc.sc().statusStore()
        self.told = {summary.id() for summary in self._executors() if not summary.isActive()}
        self.waited: dict[str, int] = {}
        self.stages: set[tuple[int, int]] = set()  # (stage, attempt) active at this poll or the one before
        self.log_file = spark_log_file(context._jvm)

    def _executors(self) -> list:
        return _scala_list(self.store.executorList(False))

    def new_losses(self) -> list[LostExecutor]:
        """Executors lost since the last call whose tasks' ends the store has (or that waited SETTLE_POLLS)."""
        active = {(stage.stageId(), stage.attemptId()) for stage in _scala_list(self.store.activeStages())}
        stages, self.stages = self.stages | active, active
        losses = []
        for summary in self._executors():
            executor = summary.id()
            if summary.isActive() or executor in self.told or executor == "driver":
                continue
            tasks = [task for stage in sorted(stages) for task in self._tasks(stage, executor)]
            waited = self.waited.get(executor, 0)
            if any(status == "RUNNING" for _, status in tasks) and waited < SETTLE_POLLS:
                self.waited[executor] = waited + 1
                self.stages |= stages  # look at these stages again next time
                continue
            self.told.add(executor)
            host = str(summary.hostPort()).rpartition(":")[0] or str(summary.hostPort())
            reran = tuple(sorted({where for where, status in tasks if status != "SUCCESS"}))
            losses.append(LostExecutor(executor, host, _option(summary.removeReason()) or "", reran))
        return losses

    def _tasks(self, stage: tuple[int, int], executor: str) -> list[tuple[tuple[int, int], str]]:
        """((stage, index), status) of the stage attempt's tasks that ran on `executor`."""
        found = self.store.taskList(stage[0], stage[1], 1 << 30)
        return [
            ((stage[0], task.index()), str(task.status()))
            for task in _scala_list(found)
            if str(task.executorId()) == executor
        ]


class NoLossWatch:
    """A session whose executors this process cannot watch (a Spark Connect client's)."""

    log_file = None

    def new_losses(self) -> list[LostExecutor]:
        return []
