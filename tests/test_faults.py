"""Faults: executors dying, the driver dying, poison images, too many errors. Every input ends up in detections/
or errors/ exactly once, with no partial files."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.inference.crash_guard import MARKER_DIR, CrashGuard, PoisonImage, TaskCrashGuard, crash_groups
from pipelines.inference.inference_job import JobFailed, run
from pipelines.io.run_lock import LOCK_NAME, LockSettings, RunLock
from pipelines.io.storage import Location
from pipelines.results.results_writer import read_table
from pipelines.sweeps.event_log import find_event_log, parse_event_log
from pipelines.sweeps.standalone_cluster import ClusterConfig, StandaloneCluster
from tests.conftest import REPO, SAMPLES
from tests.job_helpers import DEFAULT_MODEL_DIR as MODEL_DIR
from tests.job_helpers import job_config, spark_submit_command
from tests.process_io import wait_until

JOB = REPO / "jobs" / "infer_yolact.py"


def CRASH_ON_DECODE(needle: str) -> dict:  # noqa: N802  (reads as a constant at the call site)
    """The environment that makes every Python process of a job die in the image decoder for paths containing
    `needle` (tests/crash_on_decode/sitecustomize.py): a poison image without a hook in production code."""
    paths = [str(REPO / "tests" / "crash_on_decode"), os.environ.get("PYTHONPATH", "")]
    return {"SPARKSEG_CRASH_ON": needle, "PYTHONPATH": os.pathsep.join(filter(None, paths))}


def copies(directory: Path, count: int) -> list[str]:
    """`count` distinct small images (the samples, repeated under distinct names in two sub-directories)."""
    samples = sorted(p for p in (SAMPLES / "images").iterdir() if p.suffix in (".jpg", ".png"))
    names = []
    for i in range(count):
        source = samples[i % len(samples)]
        target = directory / f"sub{i % 2}" / f"img{i:03d}{source.suffix}"
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(source, target)
        names.append(target.name)
    return names


def start_job(
    *args: str,
    env: dict | None = None,
    log: Path | None = None,
    own_process_group: bool = False,
    spark_submit: tuple[str, ...] | None = None,
) -> subprocess.Popen:
    """The job in a process of its own: `python jobs/infer_yolact.py`, or with spark_submit (its options) the venv's
    `spark-submit` (a JVM that starts the Python driver) with the venv's bin first on PATH, as activating it does."""
    job_command = [str(JOB), "--model", str(MODEL_DIR), "--precision", "f32", *args]
    if spark_submit is None:
        command, base_env = [sys.executable, *job_command], {**os.environ, "PYSPARK_PYTHON": sys.executable}
    else:
        command, base_env = spark_submit_command(*spark_submit, *job_command)
    out = open(log, "wb") if log else subprocess.PIPE
    return subprocess.Popen(
        command,
        stdout=out,
        stderr=subprocess.STDOUT,
        cwd=REPO,
        env={**base_env, **(env or {})},
        start_new_session=own_process_group,
    )


def wait_for_a_committed_wave(output: Path, job: subprocess.Popen) -> None:
    """Until the job (a process of its own) has committed its first wave to output/detections."""
    wait_until(
        lambda: any((output / "detections").glob("part-*.parquet")), "the first committed wave", 600, process=job
    )


def kill_after_a_committed_wave(output: Path, job: subprocess.Popen) -> None:
    """SIGKILL the job (no cleanup, no shutdown hooks) once it has committed its first wave."""
    wait_for_a_committed_wave(output, job)
    job.kill()
    job.wait()


def outputs(spark, output: Path) -> tuple[list[str], list]:
    detections = [r.path for r in spark.read.parquet(str(output / "detections")).select("path").collect()]
    # a driver killed between a wave's two commits leaves errors/ with only Spark's _temporary: nothing committed
    table = read_table(spark, str(output / "errors"))
    errors = table.collect() if table is not None else []
    return detections, errors


def assert_exactly_once(spark, output: Path, names: list[str]) -> tuple[list[str], list]:
    detections, errors = outputs(spark, output)
    recorded = [Path(p).name for p in detections] + [Path(e.path).name for e in errors]
    assert sorted(recorded) == sorted(names), "every input exactly once in detections/ or errors/"
    leftovers = [
        p
        for p in output.rglob("*")
        if p.is_file() and (".tmp" in p.name or "_temporary" in str(p)) and "_sparkseg_attempts" not in str(p)
    ]
    assert not leftovers, f"partial files visible: {leftovers[:5]}"
    return detections, errors


def test_poison_image_becomes_an_error_row_and_the_job_goes_on(spark, tmp_path):
    images = tmp_path / "images"
    names = copies(images, 6)
    shutil.copy(SAMPLES / "images" / "chelsea.jpg", images / "poison.jpg")
    names.append("poison.jpg")
    job = start_job(
        "--input",
        str(images),
        "--output",
        str(tmp_path / "out"),
        "--partitions",
        "2",
        "--master",
        "local[2,4]",
        env=CRASH_ON_DECODE("/poison.jpg"),
    )
    log = job.communicate(timeout=900)[0].decode(errors="replace")
    assert job.returncode == 0, log[-3000:]
    _, errors = assert_exactly_once(spark, tmp_path / "out", names)
    assert [(Path(e.path).name, e.error_type) for e in errors] == [("poison.jpg", "PoisonImage")]
    assert "crashed its Python worker in 2 task attempts" in errors[0].message
    assert not (tmp_path / "out" / MARKER_DIR).exists(), "the markers are removed once the wave is committed"


def test_the_images_in_flight_when_an_attempt_died_are_retried_one_group_each(tmp_path):
    """A batch goes in flight with one marker write; after a death its images are suspects, each retried alone, so
    the next death names one image; `threshold` deaths with an image in flight make it poison."""
    guard = CrashGuard(Location(str(tmp_path / "scope")), threshold=2)
    directory = guard.scope / "p00000"
    records = [SimpleNamespace(path=name) for name in ("a", "b", "c", "d")]
    first = TaskCrashGuard(guard, directory, 0)
    assert crash_groups(records, first) == [records]
    first.in_flight(["a", "b", "c"])  # ... and the worker dies
    second = TaskCrashGuard(guard, directory, 1)
    assert [[r.path for r in group] for group in crash_groups(records, second)] == [["d"], ["a"], ["b"], ["c"]]
    second.in_flight(["d"])
    second.in_flight(["b"])  # dies again, on b alone
    third = TaskCrashGuard(guard, directory, 2)
    with pytest.raises(PoisonImage, match="b: crashed its Python worker in 2 task attempts"):
        third.check("b")
    for name in ("a", "c", "d"):
        third.check(name)
    assert [[r.path for r in group] for group in crash_groups(records, third)] == [["d"], ["a"], ["b"], ["c"]]
    third.done()
    assert TaskCrashGuard(guard, directory, 3).crashes == {"a": 1, "b": 2, "c": 1}


def test_a_rerun_of_the_stage_counts_as_a_retry(tmp_path):
    """An executor lost with shuffle output makes Spark run the reading stage again, its tasks' attempt numbers
    starting at 0: markers are named by the task attempt id, which keeps growing, so such a task is retried (it
    cleans up after the attempt that died) and reads that attempt's marker, which its own does not overwrite."""
    guard = CrashGuard(Location(str(tmp_path / "scope")), threshold=2)
    directory = guard.scope / "p00003"
    first = TaskCrashGuard(guard, directory, 17)
    assert not first.retried and not first.crashes
    first.in_flight(["a", "b"])  # the executor dies with it
    again = TaskCrashGuard(guard, directory, 40)  # attempt 1 of the first stage attempt ...
    again.in_flight(["b"])  # ... dies too
    rerun = TaskCrashGuard(guard, directory, 123)  # attempt 0 of the stage's second attempt
    assert rerun.retried and rerun.crashes == {"a": 1, "b": 2}
    rerun.in_flight(["a"])
    assert TaskCrashGuard(guard, directory, 1000).crashes == {"a": 2, "b": 2}


def test_a_retried_task_removes_the_temp_files_a_killed_attempt_left(spark, tmp_path):
    """A worker killed between a label map's temp file and its rename leaves the temp file; the task's retry rewrites
    those label maps and removes such leftovers beside them. The killed attempts here die on poison.jpg, in the same
    (single) task as the other images; their leftovers are made by hand, named as write_bytes_atomic names them."""
    images = tmp_path / "images"
    names = copies(images, 4)
    shutil.copy(SAMPLES / "images" / "chelsea.jpg", images / "poison.jpg")
    label_maps = [tmp_path / "out" / "masks" / f"sub{i % 2}" / f"{name}.png" for i, name in enumerate(names)]
    stale = [path.with_name(f".{path.name}.k3j_x9a2.tmp") for path in label_maps]
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half a PNG")
    job = start_job(
        "--input",
        str(images),
        "--output",
        str(tmp_path / "out"),
        "--partitions",
        "1",
        "--master",
        "local[1,4]",
        env=CRASH_ON_DECODE("/poison.jpg"),
    )
    log = job.communicate(timeout=900)[0].decode(errors="replace")
    assert job.returncode == 0, log[-3000:]
    assert_exactly_once(spark, tmp_path / "out", names + ["poison.jpg"])  # no temp file left
    assert all(path.is_file() for path in label_maps)


def test_a_killed_runs_uncommitted_tasks_are_removed_not_committed_by_the_next_run(spark, tmp_path, caplog):
    """A run killed mid-wave leaves the tasks it finished under <table>/_temporary/0/ (Hadoop's FileOutputCommitter,
    v1): the next run's first append would commit them with its own, and their images, redone, would be there
    twice. Built here as the killed run leaves it: a finished task's part file, and an errors/ write begun."""
    images, output = tmp_path / "images", tmp_path / "out"
    names = copies(images, 3)
    run(spark, job_config(images, output))
    committed = next((output / "detections").glob("part-*.parquet"))
    finished_task = output / "detections" / "_temporary" / "0" / "task_202611280000000000_0007_m_000000"
    finished_task.mkdir(parents=True)
    shutil.copy(committed, finished_task / committed.name.replace("part-00000", "part-00001"))
    (output / "errors" / "_temporary" / "0" / "_temporary").mkdir(parents=True)
    shutil.copy(SAMPLES / "images" / "chelsea.jpg", images / "new.jpg")

    with caplog.at_level("WARNING", logger="pipelines.inference.resume"):
        summary = run(spark, job_config(images, output))
    assert summary["counts"]["done"] == 1
    assert_exactly_once(spark, output, names + ["new.jpg"])
    assert not list(output.rglob("_temporary"))
    assert sum("uncommitted files of an earlier run" in record.getMessage() for record in caplog.records) == 2


def test_too_many_errors_fail_the_job_with_a_summary(spark, tmp_path):
    """By default (run.max_error_fraction 0.5) a run where most images failed fails (exit 3), its rows and summary
    written; 1.0 never fails on errors."""
    images = tmp_path / "images"
    images.mkdir()
    for i in range(4):
        (images / f"broken{i}.jpg").write_bytes(b"not an image")
    shutil.copy(SAMPLES / "images" / "coffee.jpg", images / "good.jpg")
    config = job_config(images, tmp_path / "out")
    with pytest.raises(JobFailed, match="4 of 5 images failed") as failed:
        run(spark, config)
    assert failed.value.exit_code == 3
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["counts"]["failed"] == 4
    config["run"].update(max_error_fraction=1.0, force=True)
    again = run(spark, config)
    assert (again["counts"]["done"], again["counts"]["failed"]) == (1, 4)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with StandaloneCluster(
        ClusterConfig(workers=2, cores=1, memory="1g"), base_dir=tmp_path_factory.mktemp("fault-cluster")
    ) as started:
        yield started


@pytest.mark.cluster
def test_worker_killed_mid_job_loses_nothing_in_one_console_line_and_small_stages(spark, cluster, tmp_path):
    """A run under spark-submit (its session has Spark's 200 shuffle partitions) on the two-worker cluster, one of
    whose Worker JVMs is killed mid-run: every image once; on the console one warning line naming the lost executor's
    host and no stack trace (Spark's detail is in its log file, which the line names); no stage beyond the run's 30
    inference tasks, the planning's at most two per core (the event log)."""
    images = tmp_path / "images"
    names = copies(images, 120)
    log = tmp_path / "job.log"
    config = tmp_path / "progress.yaml"
    config.write_text("run:\n  progress_interval_s: 1\n")
    events = tmp_path / "events"
    events.mkdir()
    event_log = (
        "spark.eventLog.enabled=true",
        f"spark.eventLog.dir={events.as_uri()}",
        "spark.eventLog.compress=false",
        "spark.eventLog.rolling.enabled=false",
    )
    settings = [part for setting in event_log for part in ("--conf", setting)]
    job = start_job(
        "--config",
        str(config),
        "--input",
        str(images),
        "--output",
        str(tmp_path / "out"),
        "--partitions",
        "30",
        spark_submit=("--master", cluster.master_url, *settings),
        log=log,
    )
    try:
        # once tasks are finishing, kill a Worker JVM (its executor dies with it, with the task it was running:
        # 30 tasks of 4 images on 2 one-core executors, so both are busy until the last few; warm executors end a
        # task in ~0.5 s, and the kill comes up to ~1.5 s after the first (progress interval + polling): ~7 s of
        # tasks are left then)
        wait_until(
            lambda: re.search(r"\[sparkseg\] [1-9]\d*/120", log.read_text(errors="replace")),
            "the first finished tasks",
            600,
            process=job,
        )
        cluster.kill_worker(0)
        assert job.wait(timeout=900) == 0, log.read_text(errors="replace")[-3000:]
    finally:
        job.kill()
    detections, errors = assert_exactly_once(spark, tmp_path / "out", names)
    assert len(detections) == 120 and not errors
    metrics = parse_event_log(find_event_log(events))
    assert metrics.failed_tasks >= 1 and metrics.retried_tasks >= 1, "the killed executor's task must have re-run"
    planning = {stage: tasks for stage, tasks in metrics.stage_tasks.items() if stage not in metrics.inference_stages}
    assert max(metrics.stage_tasks.values()) == 30 and max(planning.values()) <= 4, metrics.stage_tasks

    said = log.read_text(errors="replace")
    traces = [line for line in said.splitlines() if line.startswith("\tat ") or "Exception" in line]
    assert not traces, said[-5000:]
    losses = [line for line in said.splitlines() if "lost executor" in line.lower() or "Lost executor" in line]
    assert len(losses) == 1 and losses[0].startswith("sparkseg: WARNING: lost executor "), said[-5000:]
    assert " on host 127.0.0.1 (worker lost" in losses[0], losses[0]
    spark_log = Path(re.search(r"Spark's log: (\S+?)\)", losses[0]).group(1))
    assert "Lost executor" in spark_log.read_text(errors="replace")
    spark_log.unlink()


def stop_a_run_waiting_for_executors(cluster, tmp_path: Path, stop, exit_code: int, spark_submit: bool = False) -> str:
    """Start a run over tmp_path/images into tmp_path/out on `cluster` asking for executors of 2g, which never fit its
    1g workers: the run waits for them, in its first Spark job (a cluster too small for the settings is where a user
    presses Ctrl-C). Once the run holds the output's lock, stop(job); the job must exit with exit_code, without a
    traceback or an ERROR line, and release the lock. Returns what it said. spark_submit: the run is started by
    spark-submit (start_job)."""
    log, lock = tmp_path / "job.log", tmp_path / "out" / LOCK_NAME
    settings = ("--master", cluster.master_url, "--conf", "spark.executor.memory=2g")
    job = start_job(
        "--input",
        str(tmp_path / "images"),
        "--output",
        str(tmp_path / "out"),
        *(() if spark_submit else settings),
        spark_submit=settings if spark_submit else None,
        log=log,
        own_process_group=True,
    )
    try:
        wait_until(lock.exists, "the output's lock", 300, process=job)
        stop(job)
        assert job.wait(timeout=300) == exit_code, log.read_text(errors="replace")[-3000:]
    finally:
        job.kill()
    said = log.read_text(errors="replace")
    assert "Traceback" not in said and " ERROR " not in said, said[-3000:]
    assert not lock.exists(), "the stopped run released the output's lock"
    return said


@pytest.mark.cluster
def test_ctrl_c_stops_the_run_in_two_lines_exit_130_and_the_next_run_does_everything_once(spark, cluster, tmp_path):
    images, output = tmp_path / "images", tmp_path / "out"
    names = copies(images, 6)
    said = stop_a_run_waiting_for_executors(cluster, tmp_path, lambda job: job.send_signal(signal.SIGINT), 130)
    assert "sparkseg: stopping (Ctrl-C again to quit at once)" in said
    assert said.strip().splitlines()[-1].startswith("error: interrupted (Ctrl-C): "), said[-3000:]
    # the next run goes through at once (the lock was released: the helper), and does every image exactly once
    rerun = start_job("--input", str(images), "--output", str(output), "--master", "local[2]")
    rerun_log = rerun.communicate(timeout=900)[0].decode(errors="replace")
    assert rerun.returncode == 0 and "done 6, failed 0" in rerun_log, rerun_log[-3000:]
    assert_exactly_once(spark, output, names)


@pytest.mark.cluster
def test_sigterm_to_the_process_group_stops_the_run_as_ctrl_c_does_with_exit_143(cluster, tmp_path):
    """A scheduler's stop (Airflow's on_kill, `timeout`, Kubernetes): SIGTERM to the job's whole process group, its
    JVM and Python workers included, ends the run as a Ctrl-C does, with a line of its own and exit 143."""
    copies(tmp_path / "images", 2)
    said = stop_a_run_waiting_for_executors(cluster, tmp_path, lambda job: os.killpg(job.pid, signal.SIGTERM), 143)
    assert "sparkseg: stopping on SIGTERM (send it again to quit at once)" in said
    assert said.strip().splitlines()[-1].startswith("error: terminated (SIGTERM): "), said[-3000:]


@pytest.mark.cluster
@pytest.mark.parametrize(
    "to_whom, signum, exit_code, line",
    [
        ("jvm", signal.SIGTERM, 143, "error: terminated (SIGTERM): "),
        ("group", signal.SIGINT, 130, "error: interrupted (Ctrl-C): "),
    ],
)
def test_spark_submit_stops_the_run_cleanly_on_a_signal_to_its_jvm_alone_or_to_the_group(
    cluster, tmp_path, to_whom, signum, exit_code, line
):
    """Under spark-submit the driver JVM is the Python driver's parent. A SIGTERM to it alone (`kill <pid>`,
    Kubernetes through the driver pod's init process) or a Ctrl-C in its terminal (the process group) stops the run
    as with `python jobs/...`: its lines, no traceback, the exit code, the output's lock released (the helper)."""
    copies(tmp_path / "images", 2)
    send = (lambda job: job.send_signal(signum)) if to_whom == "jvm" else (lambda job: os.killpg(job.pid, signum))
    said = stop_a_run_waiting_for_executors(cluster, tmp_path, send, exit_code, spark_submit=True)
    assert said.count("sparkseg: stopping") == 1, said[-3000:]
    assert said.strip().splitlines()[-1].startswith(line), said[-3000:]


@pytest.mark.cluster
def test_driver_killed_mid_job_resumes_without_duplicates_or_recomputation(spark, tmp_path):
    images = tmp_path / "images"
    names = copies(images, 24)
    output = tmp_path / "out"
    config = tmp_path / "waves.yaml"
    config.write_text("run:\n  commit_every: 6\n  progress_interval_s: 1\n")
    job = start_job(
        "--config",
        str(config),
        "--input",
        str(images),
        "--output",
        str(output),
        "--partitions",
        "2",
        "--master",
        "local[2,4]",
    )
    try:
        kill_after_a_committed_wave(output, job)
    finally:
        job.kill()
    committed = len(outputs(spark, output)[0])
    assert 0 < committed < 24
    rerun = start_job(
        "--config",
        str(config),
        "--input",
        str(images),
        "--output",
        str(output),
        "--partitions",
        "2",
        "--master",
        "local[2,4]",
    )
    log = rerun.communicate(timeout=900)[0].decode(errors="replace")
    assert rerun.returncode == 0, log[-3000:]
    assert f"skipped {committed} " in log, log[-2000:]
    assert f"done {24 - committed}," in log
    assert_exactly_once(spark, output, names)
    assert not (output / MARKER_DIR).exists(), "the killed run's markers are removed with the rerun's"


def test_a_run_whose_lock_is_broken_stops_before_its_next_wave_and_a_rerun_does_the_rest_once(spark, tmp_path):
    """Another run breaks this run's lock (`--break-lock`) while it writes: this run stops before its next wave
    (exit 4, one line naming the run that broke it) and keeps its committed waves; once that run is done, a rerun
    does the rest, every image once. The driver is frozen (SIGSTOP) while its lock is broken: no timing luck."""
    images = tmp_path / "images"
    names = copies(images, 24)
    output = tmp_path / "out"
    config = tmp_path / "waves.yaml"
    config.write_text("run:\n  commit_every: 4\n")
    args = (
        "--config",
        str(config),
        "--input",
        str(images),
        "--output",
        str(output),
        "--partitions",
        "2",
        "--master",
        "local[2,4]",
    )
    job = start_job(*args)
    breaker = None
    try:
        wait_for_a_committed_wave(output, job)
        os.kill(job.pid, signal.SIGSTOP)
        try:
            breaker = RunLock.acquire(str(output), "20990101T000000Z-breaker", LockSettings(break_lock=True))
        finally:
            os.kill(job.pid, signal.SIGCONT)
        said = job.communicate(timeout=600)[0].decode(errors="replace")
    finally:
        job.kill()
        job.wait()
        if breaker is not None:
            breaker.release()
    assert job.returncode == 4, said[-3000:]
    last = said.strip().splitlines()[-1]
    assert last.startswith("error: ") and "lock was broken by run 20990101T000000Z-breaker" in last, said[-3000:]
    committed = len(outputs(spark, output)[0])
    assert 0 < committed < 24
    rerun = start_job(*args)
    log = rerun.communicate(timeout=900)[0].decode(errors="replace")
    assert rerun.returncode == 0, log[-3000:]
    assert f"skipped {committed} " in log and f"done {24 - committed}," in log, log[-2000:]
    assert_exactly_once(spark, output, names)
