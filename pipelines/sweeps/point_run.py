"""One grid point: the real inference job (`jobs/infer_yolact.py --config <point config> --force`) in its own driver
process, so it gets a fresh SparkContext with the point's settings, measured from outside -> one CSV row.

What a row holds (see `ROW_COLUMNS`): the point's settings; status; the job's summary (counts, wall seconds,
images/s, per-stage seconds summed over images); from the event log: tasks, failed and retried tasks, executors,
the longest executor busy time and one-frame time, partition sizes and skew; from /proc: peak RSS per role and
the peak total PSS of the process tree; the driver process' own wall time (JVM start included).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipelines.job_cli import choose_engine
from pipelines.job_config import REPO_ROOT, set_path
from pipelines.sweeps.config import GridPoint
from pipelines.sweeps.event_log import AppMetrics, EventLogError, parse_event_log
from pipelines.sweeps.process_memory import TreeMemorySampler

JOB_SCRIPT = REPO_ROOT / "jobs" / "infer_yolact.py"
STAGES = ("read", "preprocess", "infer", "postprocess", "write")
SETTING_COLUMNS = [
    "point",
    "mode",
    "repeat",
    "engine",
    "precision",
    "partitions",
    "executors",
    "executor_cores",
    "total_cores",
    "task_cpus",
    "batch_size",
    "openvino_streams",
    "openvino_threads",
]
RESULT_COLUMNS = (
    ["status", "error", "images_in", "done", "failed_images", "wall_s", "images_per_s", "process_s"]
    + [f"stage_{stage}_s" for stage in STAGES]
    + [
        "one_frame_s",
        "longest_executor_busy_s",
        "longest_executor_task_time_s",
        "executors_seen",
        "tasks",
        "failed_tasks",
        "retried_tasks",
        "partition_images_min",
        "partition_images_max",
        "partition_skew",
        "peak_rss_driver_mb",
        "peak_rss_driver_jvm_mb",
        "peak_rss_executor_jvm_mb",
        "peak_rss_python_worker_mb",
        "python_workers",
        "peak_total_pss_mb",
        "runtime_threads",
        "runtime_streams",
        "app_id",
        "point_dir",
    ]
)
ROW_COLUMNS = SETTING_COLUMNS + RESULT_COLUMNS


@dataclass
class PointEnv:
    """Where and how a point runs. master: local[N] or spark://...; python: driver and executor interpreter;
    extra_env: added to the driver's environment; cluster_pids: roots of the cluster's process trees (sampled
    for executor memory)."""

    mode: str
    master: str
    python: str
    worker_memory: str = "2g"
    extra_env: dict = field(default_factory=dict)
    cluster_pids: list[int] = field(default_factory=list)
    timeout_s: float = 1800.0
    memory_interval_s: float = 0.5
    keep_outputs: bool = False


def spark_conf(point: GridPoint, env: PointEnv, event_dir: Path) -> dict:
    """The Spark settings of a point (strings, as spark-defaults would hold them)."""
    conf = {
        "spark.task.cpus": str(point.task_cpus),
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": event_dir.resolve().as_uri(),
        "spark.eventLog.compress": "false",
        "spark.eventLog.rolling.enabled": "false",
        "spark.ui.enabled": "false",  # the event log has what we need; no port to collide on
        "spark.python.worker.reuse": "true",
    }
    if env.mode == "standalone":
        conf.update(
            {
                "spark.executor.cores": str(point.executor_cores),
                "spark.cores.max": str(point.total_cores),
                "spark.executor.memory": env.worker_memory,
                # start only when every executor is there, else the first one takes every task
                "spark.scheduler.minRegisteredResourcesRatio": "1.0",
                "spark.scheduler.maxRegisteredResourcesWaitingTime": "300s",
            }
        )
    return conf


def point_config(base_job: dict, point: GridPoint, env: PointEnv, point_dir: Path) -> dict:
    """The job config of a point: the sweep's `job` section with the point's settings applied."""
    config = json.loads(json.dumps(base_job))  # deep copy of plain YAML data
    config["spark"]["master"] = env.master
    config["spark"]["app_name"] = f"sparkseg-sweep-{point.point_id}"
    config["spark"]["conf"] = {
        **{str(k): str(v) for k, v in (config["spark"].get("conf") or {}).items()},
        **spark_conf(point, env, point_dir / "eventlog"),
    }
    for key, value in {
        "inference.partitions": point.partitions,
        "inference.batch_size": point.batch_size,
        "inference.precision": point.precision,
        "inference.engine": point.engine,
        "inference.openvino_streams": point.openvino_streams,
        "inference.openvino_threads": point.openvino_threads,
        "output.uri": str((point_dir / "output").resolve()),
        "run.force": True,
    }.items():
        set_path(config, key, value)
    return config


def driver_env(env: PointEnv) -> dict:
    """The driver's environment: its Python workers run `env.python`; nothing inherited from an enclosing
    SparkContext (a gateway port would make the job attach to it instead of starting its own)."""
    child = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYSPARK_GATEWAY_PORT", "PYSPARK_GATEWAY_SECRET", "PYSPARK_DRIVER_PYTHON")
    }
    child.update(
        PYSPARK_PYTHON=env.python,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
    )
    child.update(env.extra_env)
    return child


def run_point(point: GridPoint, base_job: dict, env: PointEnv, point_dir: Path, repeat: int = 0) -> dict:
    """Run the job for `point` in a new driver process under `point_dir` (config.yaml, driver.log, eventlog/,
    output/) and return its row (ROW_COLUMNS). A failed run gives a row with status "failed" and the error."""
    row = {key: None for key in ROW_COLUMNS}
    row.update(
        point=point.point_id,
        mode=env.mode,
        repeat=repeat,
        total_cores=point.total_cores,
        **point.as_dict(),
        point_dir=str(point_dir),
    )
    reason = point.unschedulable_reason()
    if reason:
        row.update(status="skipped", error=reason)
        return row
    if not Path(env.python).is_file():
        env_hint = choose_engine(point.engine).env_hint
        row.update(
            status="not available",
            error=f"{env.python}: no such interpreter for engine {point.engine}"
            + (f" (build it with {env_hint})" if env_hint else ""),
        )
        return row
    if point_dir.exists():
        shutil.rmtree(point_dir)
    (point_dir / "eventlog").mkdir(parents=True)
    config = point_config(base_job, point, env, point_dir)
    config_path = point_dir / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")

    command = [env.python, str(JOB_SCRIPT), "--config", str(config_path), "--force"]
    started = time.perf_counter()
    with open(point_dir / "driver.log", "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=driver_env(env), cwd=REPO_ROOT
        )
        with TreeMemorySampler([process.pid], env.cluster_pids, env.memory_interval_s) as sampler:
            try:
                code = process.wait(timeout=env.timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                code = process.wait()
                row["error"] = f"timed out after {env.timeout_s:.0f} s"
    row["process_s"] = round(time.perf_counter() - started, 3)
    row.update(sampler.peaks.as_row())
    summary_path = point_dir / "output" / "summary.json"
    if code != 0 or not summary_path.is_file():
        reason = row["error"] or f"exit code {code}: {last_error_line(point_dir / 'driver.log')}"
        row.update(status="failed", error=reason)
    else:
        row.update(status="ok", **summary_columns(json.loads(summary_path.read_text(encoding="utf-8"))))
    try:
        row.update(event_log_columns(parse_event_log(point_dir / "eventlog"), row.get("images_in") or 0))
    except (EventLogError, OSError) as err:
        if row["status"] == "ok":
            row.update(status="failed", error=f"event log: {err}")
    if not env.keep_outputs:
        shutil.rmtree(point_dir / "output", ignore_errors=True)
    return row


def summary_columns(summary: dict) -> dict:
    counts = summary["counts"]
    row = {
        "images_in": counts["inputs"],
        "done": counts["done"],
        "failed_images": counts["failed"],
        "wall_s": summary["wall_seconds"],
        "images_per_s": summary["images_per_second"],
        "runtime_threads": summary.get("runtime", {}).get("threads"),
        "runtime_streams": summary.get("runtime", {}).get("streams"),
    }
    for stage in STAGES:
        row[f"stage_{stage}_s"] = summary["stage_seconds"].get(stage)
    return row


def event_log_columns(metrics: AppMetrics, images: int) -> dict:
    one_frame = metrics.one_frame_s(images)
    return {
        "app_id": metrics.app_id,
        "executors_seen": metrics.executors,
        "tasks": metrics.tasks,
        "failed_tasks": metrics.failed_tasks,
        "retried_tasks": metrics.retried_tasks,
        "longest_executor_busy_s": metrics.longest_executor_busy_s,
        "longest_executor_task_time_s": max(metrics.executor_task_time_s.values(), default=None),
        "one_frame_s": round(one_frame, 4) if one_frame is not None else None,
        "partition_images_min": min(metrics.partition_images, default=None),
        "partition_images_max": max(metrics.partition_images, default=None),
        "partition_skew": round(metrics.partition_skew, 3) if metrics.partition_skew is not None else None,
    }


def last_error_line(log_path: Path, lines: int = 200) -> str:
    """The most telling line of a driver log: the last 'error:' or exception line, else the last line."""
    try:
        tail = log_path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]
    except FileNotFoundError:
        return f"(no log at {log_path})"
    out_of_memory = [line.strip() for line in tail if "OutOfMemoryError" in line and not line.strip().startswith("at ")]
    if out_of_memory:  # the root cause; what follows it (broken pipes, a cancelled job) is noise
        return out_of_memory[0][:500]
    for index in range(len(tail) - 1, -1, -1):
        text = tail[index].strip()
        head = text.split(":")[0]
        if text.startswith("error:") or (head.endswith(("Error", "Exception")) and " " not in head):
            if head.endswith("Py4JJavaError") and index + 1 < len(tail):  # the Java exception is on the next line
                text += " " + tail[index + 1].strip()
            return text[:500]
    return tail[-1].strip()[:500] if tail else "(empty log)"


def python_for(engine: str, main_python: str, bigdl_python: str) -> tuple[str, dict]:
    """The interpreter and extra environment for an engine: the main one, or for an engine with an env of its own
    (the bigdl engine's) `bigdl_python` with PYTHONHOME (else its Python workers fail with "No module named
    'encodings'", see the platform notes)."""
    if choose_engine(engine).env_hint is None:
        return main_python or sys.executable, {}
    python = str(bigdl_python)
    home = ""
    if Path(python).is_file():
        home = subprocess.run(
            [python, "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True, check=False
        ).stdout.strip()
    return python, ({"PYTHONHOME": home} if home else {})
