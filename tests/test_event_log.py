"""The task facts a sweep reads from an event log, on a hand-written log (the fault tests read real ones)."""

from __future__ import annotations

import json

from pipelines.sweeps.event_log import parse_event_log


def task_end(stage: int, stage_attempt: int, index: int, attempt: int, success: bool, start: int) -> dict:
    reason = {"Reason": "Success"} if success else {"Reason": "ExecutorLostFailure"}
    return {
        "Event": "SparkListenerTaskEnd",
        "Stage ID": stage,
        "Stage Attempt ID": stage_attempt,
        "Task End Reason": reason,
        "Task Info": {
            "Index": index,
            "Attempt": attempt,
            "Executor ID": "1",
            "Launch Time": start,
            "Finish Time": start + 100,
            "Accumulables": [],
        },
    }


def stage_completed(stage: int, stage_attempt: int, tasks: int) -> dict:
    info = {"Stage ID": stage, "Stage Attempt ID": stage_attempt, "Number of Tasks": tasks}
    return {"Event": "SparkListenerStageCompleted", "Stage Info": info}


def test_a_stage_rerun_after_an_executor_loss_counts_its_tasks_as_retried(tmp_path):
    """Stage 3's partition 0 fails and is retried (attempt 1); then an executor loss makes Spark run the stage
    again (stage attempt 1), where partition 1, which had succeeded, runs again with attempt number 0."""
    events = [
        {"Event": "SparkListenerApplicationStart", "App ID": "app-1"},
        task_end(3, 0, 0, 0, False, 1000),
        task_end(3, 0, 1, 0, True, 1000),
        task_end(3, 0, 0, 1, True, 1200),
        task_end(3, 1, 1, 0, True, 1400),
        task_end(4, 0, 0, 0, True, 1600),
        stage_completed(3, 0, 2),
        stage_completed(3, 1, 1),  # the re-run: the missing partition only
        stage_completed(4, 0, 1),
    ]
    log = tmp_path / "app-1"
    log.write_text("".join(json.dumps(event) + "\n" for event in events))
    metrics = parse_event_log(log)
    assert (metrics.app_id, metrics.tasks, metrics.failed_tasks, metrics.retried_tasks) == ("app-1", 5, 1, 2)
    assert metrics.executor_busy_s == {"1": 0.4}  # 4 disjoint 100 ms spans, two overlapping
    assert metrics.stage_tasks == {3: 2, 4: 1}
