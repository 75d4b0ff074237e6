"""Task-level facts of a finished Spark application, from its event log (JSON lines).

The sweep runs every point with `spark.eventLog.enabled=true` into the point's own directory, uncompressed and not
rolled, so there is exactly one plain file to read after the driver exits (no REST polling while the app runs, and
nothing is lost when the app ends before a poll).

Definitions (all from SparkListenerTaskEnd events):
- tasks: every task attempt that ended. failed_tasks: attempts whose end reason is not Success (exceptions, lost
  executors, kills). retried_tasks: attempts of a task (a stage's partition) that already ended once: a retry
  after a failure, a re-run of a stage whose output an executor loss took (its attempt numbers start at 0 again),
  a speculative copy.
- executor busy time: per executor, the length of the union of its task attempts' [launch, finish] intervals
  (wall-clock time during which at least one of its cores ran a task; concurrent tasks are not added up).
  `one_frame_s` = the longest executor busy time / images, the paper's "one frame time".
- executor task time: per executor, the sum of its attempts' durations (what the Spark UI's Executors tab shows).
- inference stages: stages that ran Python code through Spark SQL (their tasks report "time to execute Python
  code": mapInPandas, pandas UDFs), except the jobs that warm the executors up (executor_warmup). Partition sizes:
  the records each successful task of those stages read from the shuffle that balanced the images (or from its
  input, when there was no shuffle).
- stage tasks: per stage, the tasks of its largest completed attempt (SparkListenerStageCompleted's "Number of
  Tasks"; a re-run after a fetch failure runs only the missing ones).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.errors import UsageError
from pipelines.inference.executor_warmup import JOB_GROUP_PREFIX as WARM_UP_GROUP_PREFIX

PYTHON_SQL_METRIC = "time to execute Python code"


class EventLogError(UsageError):
    pass


@dataclass
class AppMetrics:
    """Per-application task facts; times in seconds."""

    app_id: str | None = None
    executors: int = 0
    tasks: int = 0
    failed_tasks: int = 0
    retried_tasks: int = 0
    executor_busy_s: dict[str, float] = field(default_factory=dict)
    executor_task_time_s: dict[str, float] = field(default_factory=dict)
    inference_stages: list[int] = field(default_factory=list)
    partition_images: list[int] = field(default_factory=list)
    stage_tasks: dict[int, int] = field(default_factory=dict)

    @property
    def longest_executor_busy_s(self) -> float | None:
        return max(self.executor_busy_s.values()) if self.executor_busy_s else None

    def one_frame_s(self, images: int) -> float | None:
        """Longest executor busy time / images (None without images or tasks)."""
        longest = self.longest_executor_busy_s
        return longest / images if images and longest is not None else None

    @property
    def partition_skew(self) -> float | None:
        """max / min images per inference partition (1.0 = perfectly even); None without inference tasks."""
        sizes = [size for size in self.partition_images if size > 0]
        return max(sizes) / min(sizes) if sizes else None


def find_event_log(directory: str | Path) -> Path:
    """The one event log file Spark wrote under `directory` (fails clearly on compressed or rolled logs)."""
    directory = Path(directory)
    files = (
        [p for p in directory.iterdir() if p.is_file() and not p.name.endswith(".inprogress")]
        if directory.is_dir()
        else []
    )
    if len(files) != 1:
        raise EventLogError(
            f"{directory}: expected one finished event log, found {[p.name for p in files]}; run "
            "with spark.eventLog.compress=false and spark.eventLog.rolling.enabled=false, and "
            "one application per directory"
        )
    return files[0]


def _accumulables(task_info: dict) -> dict[str, float]:
    values = {}
    for acc in task_info.get("Accumulables", []):
        try:
            values[acc.get("Name")] = float(acc.get("Update", 0))
        except (TypeError, ValueError):
            continue
    return values


def _union_length_ms(intervals: list[tuple[int, int]]) -> int:
    total, end_so_far = 0, None
    for start, end in sorted(intervals):
        if end_so_far is None or start > end_so_far:
            total += end - start
            end_so_far = end
        elif end > end_so_far:
            total += end - end_so_far
            end_so_far = end
    return total


def parse_event_log(path: str | Path) -> AppMetrics:
    """AppMetrics of the application logged in `path` (a file, or a directory holding exactly one log)."""
    path = Path(path)
    if path.is_dir():
        path = find_event_log(path)
    metrics = AppMetrics()
    intervals: dict[str, list[tuple[int, int]]] = {}
    python_stages: set[int] = set()
    warm_up_stages: set[int] = set()
    task_reads: list[tuple[int, bool, float, float]] = []  # (stage, success, shuffle records, input records)
    ended_tasks: set[tuple[int, int]] = set()  # (stage, partition index)
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError as err:
                raise EventLogError(
                    f"{path}:{number}: not a JSON event ({err}); was the application killed while writing it?"
                ) from None
            kind = event.get("Event")
            if kind == "SparkListenerApplicationStart":
                metrics.app_id = event.get("App ID")
            elif kind == "SparkListenerJobStart":
                if str(event.get("Properties", {}).get("spark.jobGroup.id", "")).startswith(WARM_UP_GROUP_PREFIX):
                    warm_up_stages.update(event.get("Stage IDs", []))
            elif kind == "SparkListenerStageCompleted":
                stage_info = event["Stage Info"]
                stage_id, stage_tasks = int(stage_info["Stage ID"]), int(stage_info["Number of Tasks"])
                metrics.stage_tasks[stage_id] = max(stage_tasks, metrics.stage_tasks.get(stage_id, 0))
            elif kind == "SparkListenerExecutorAdded":
                metrics.executors += 1
            elif kind == "SparkListenerTaskEnd":
                info = event["Task Info"]
                success = event.get("Task End Reason", {}).get("Reason") == "Success"
                metrics.tasks += 1
                metrics.failed_tasks += 0 if success else 1
                stage = int(event["Stage ID"])
                task = (stage, int(info.get("Index", -1)))
                metrics.retried_tasks += 1 if task in ended_tasks else 0
                ended_tasks.add(task)
                executor = str(info.get("Executor ID"))
                launch, finish = int(info["Launch Time"]), int(info["Finish Time"])
                if finish >= launch > 0:
                    intervals.setdefault(executor, []).append((launch, finish))
                accs = _accumulables(info)
                if PYTHON_SQL_METRIC in accs:
                    python_stages.add(stage)
                task_reads.append(
                    (
                        stage,
                        success,
                        accs.get("internal.metrics.shuffle.read.recordsRead", 0.0),
                        accs.get("internal.metrics.input.recordsRead", 0.0),
                    )
                )
    for executor, spans in intervals.items():
        metrics.executor_busy_s[executor] = _union_length_ms(spans) / 1000.0
        metrics.executor_task_time_s[executor] = sum(end - start for start, end in spans) / 1000.0
    python_stages -= warm_up_stages
    metrics.inference_stages = sorted(python_stages)
    metrics.partition_images = [
        int(shuffle or records) for stage, success, shuffle, records in task_reads if success and stage in python_stages
    ]
    return metrics
