"""The standalone-cluster launcher: jobs run on every worker, a crashed worker's tasks re-run, stop leaves nothing.

Jobs against the cluster run in a subprocess driver (as users submit them): the session-scoped local `spark` fixture
owns this process's only SparkContext.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.sweeps.standalone_cluster import (
    ClusterConfig,
    ClusterStartError,
    StandaloneCluster,
    process_group_members,
    process_running,
)
from tests.process_io import read_line, wait_until

pytestmark = pytest.mark.cluster

REPO = Path(__file__).resolve().parents[1]

# A driver script: runs `partitions` tasks of `sleep_s` each; every task leaves a marker file
# `started-<partition>-<attempt>-<pid>` holding its cwd when it starts, and returns (partition, pid, cwd).
# An executor's cwd is <worker work dir>/<app id>/<executor id>.
JOB = r"""
import json, os, sys, time
from pyspark import TaskContext
from pyspark.sql import SparkSession

master, partitions, sleep_s, marker_dir = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4]
spark = (SparkSession.builder.master(master).appName("sparkseg-standalone-test")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.executor.memory", "512m").config("spark.executor.cores", "1").config("spark.cores.max", "2")
         # Start scheduling only once both executors are registered, so that both get tasks.
         .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
         .config("spark.scheduler.maxRegisteredResourcesWaitingTime", "300s")
         .config("spark.ui.enabled", "false").getOrCreate())
sc = spark.sparkContext
sc.setLogLevel("ERROR")

def run(index, values):
    context = TaskContext.get()
    marker = os.path.join(marker_dir, f"started-{index}-{context.attemptNumber()}-{os.getpid()}")
    with open(marker + ".tmp", "w") as handle:
        handle.write(os.getcwd())
    os.replace(marker + ".tmp", marker)
    time.sleep(sleep_s)
    yield {"partition": index, "values": list(values), "pid": os.getpid(), "cwd": os.getcwd()}

rows = sc.parallelize(range(100), partitions).mapPartitionsWithIndex(run).collect()
executors = [f"{info.host()}:{info.port()}" for info in sc._jsc.sc().statusTracker().getExecutorInfos()]
print("RESULT " + json.dumps({"rows": rows, "executors": executors, "app_id": sc.applicationId}), flush=True)
spark.stop()
"""


def _job_command(tmp_path: Path, master_url: str, partitions: int, sleep_s: float) -> tuple[list[str], Path]:
    script, markers = tmp_path / "job.py", tmp_path / "markers"
    script.write_text(JOB)
    markers.mkdir()
    return [sys.executable, str(script), master_url, str(partitions), str(sleep_s), str(markers)], markers


def _driver_env() -> dict:
    return {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def _parse_result(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, f"the job printed no RESULT line; stdout:\n{stdout[-3000:]}"
    return json.loads(lines[-1][len("RESULT ") :])


def _markers(markers: Path) -> list[tuple[int, int, str]]:
    """(partition, attempt, cwd) of every task start so far."""
    found = []
    for marker in markers.glob("started-*"):
        if marker.suffix != ".tmp":
            _, partition, attempt, _ = marker.name.split("-")
            found.append((int(partition), int(attempt), marker.read_text()))
    return found


def _worker_of(cwd: str, cluster: StandaloneCluster) -> int:
    for index in range(cluster.config.workers):
        if Path(cwd).is_relative_to(cluster.worker_dir(index)):
            return index
    raise AssertionError(f"executor cwd {cwd} is under no worker dir of {cluster}")


def test_job_runs_on_both_workers(standalone_cluster, tmp_path):
    cluster = standalone_cluster
    assert cluster.master_url.startswith("spark://127.0.0.1:")
    assert cluster.alive_workers() == 2 and len(cluster.worker_pids) == 2

    command, _ = _job_command(tmp_path, cluster.master_url, partitions=4, sleep_s=0.5)
    done = subprocess.run(command, env=_driver_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"job failed:\n{done.stderr[-4000:]}"
    result = _parse_result(done.stdout)

    assert sorted(value for row in result["rows"] for value in row["values"]) == list(range(100))
    assert {_worker_of(row["cwd"], cluster) for row in result["rows"]} == {0, 1}
    executor_ids = {Path(row["cwd"]).name for row in result["rows"]}
    assert len(executor_ids) == 2, executor_ids
    assert len({row["pid"] for row in result["rows"]}) >= 2
    assert len(result["executors"]) == 3  # the driver and the two executors
    # The executors really ran in the app's dirs inside each worker's work dir.
    for index in (0, 1):
        assert (cluster.worker_dir(index) / result["app_id"]).is_dir()


def test_worker_crash_mid_job_then_stop_leaves_no_process(tmp_path):
    cluster = StandaloneCluster(ClusterConfig(workers=2, cores=1, memory="1g"), base_dir=tmp_path / "cluster")
    with cluster:
        daemon_pids = cluster.pids
        assert len(daemon_pids) == 3 and all(process_running(pid) for pid in daemon_pids)
        # Tasks long enough that the ones running at the crash cannot have finished.
        command, markers = _job_command(tmp_path, cluster.master_url, partitions=4, sleep_s=4.0)
        driver = subprocess.Popen(command, env=_driver_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:

            def workers_busy() -> set[int]:
                return {_worker_of(cwd, cluster) for _, _, cwd in _markers(markers)}

            wait_until(lambda: workers_busy() == {0, 1} or driver.poll() is not None, "tasks on both workers")
            assert driver.poll() is None, f"the job ended before the crash:\n{driver.stderr.read()[-4000:]}"
            killed = cluster.kill_worker(0)
            assert killed == daemon_pids[1] and not process_running(killed)
            wait_until(lambda: cluster.alive_workers() == 1, "the Master to notice the lost worker")
            stdout, stderr = driver.communicate(timeout=600)
        finally:
            if driver.poll() is None:
                driver.kill()
                driver.wait()
        assert driver.returncode == 0, f"job failed after the worker crash:\n{stderr[-4000:]}"
        rows = _parse_result(stdout)["rows"]
        assert sorted(value for row in rows for value in row["values"]) == list(range(100))
        # The task that was running on the crashed worker ran again, on the survivor.
        retries = [(partition, cwd) for partition, attempt, cwd in _markers(markers) if attempt > 0]
        assert retries and all(_worker_of(cwd, cluster) == 1 for _, cwd in retries), _markers(markers)

    for pid in daemon_pids:
        assert not process_running(pid), f"daemon {pid} still alive after stop()"
        assert process_group_members(pid) == [], f"processes left in the group of daemon {pid}"


def test_start_timeout_reports_the_log_and_cleans_up(tmp_path):
    cluster = StandaloneCluster(ClusterConfig(workers=1, start_timeout_s=0.01), base_dir=tmp_path / "cluster")
    with pytest.raises(ClusterStartError, match="timed out") as failure:
        cluster.start()
    assert str(cluster.log_dir / "master.log") in str(failure.value)
    assert "start_timeout_s" in str(failure.value)
    assert cluster.pids and not any(process_running(pid) for pid in cluster.pids)


def test_config_rejects_bad_sizes():
    with pytest.raises(ValueError, match="memory"):
        ClusterConfig(memory="lots")
    with pytest.raises(ValueError, match="workers"):
        ClusterConfig(workers=0)


def test_cli_prints_master_url_and_stops_on_interrupt(tmp_path):
    base = tmp_path / "cli"
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pipelines.sweeps.standalone_cluster",
            "--workers",
            "1",
            "--cores",
            "1",
            "--memory",
            "1g",
            "--dir",
            str(base),
        ],
        cwd=REPO,
        env=_driver_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        master_url = read_line(cli, timeout_s=180)
        assert master_url.startswith("spark://127.0.0.1:"), master_url
        cli.send_signal(signal.SIGINT)
        assert cli.wait(timeout=120) == 0
    finally:
        if cli.poll() is None:
            cli.kill()
            cli.wait()
    assert (base / "logs" / "master.log").is_file() and (base / "logs" / "worker-0.log").is_file()
    # No process is left working in the cluster's directory (the Master's cwd, the Worker's --work-dir).
    leftovers = _pids_using(base)
    assert leftovers == [], f"processes left after Ctrl-C: {leftovers}"


def _pids_using(directory: Path) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or not process_running(int(entry)):
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if cwd.startswith(str(directory)) or str(directory) in cmdline:
            found.append(int(entry))
    return found
