"""The streaming job (--stream, --available-now): every file that lands in the input exactly once in the output,
with batch runs on the same output before, after and beside it (the same done keys, the same lock), a clean stop on
SIGTERM, a checkpoint refused for another input, and a stream killed mid-batch resuming without duplicates."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from pipelines.errors import RunFailed
from pipelines.inference.inference_job import run
from pipelines.inference.stream_job import STREAM_DIR, StopRequested, remote_error, stream, tell_progress
from pipelines.io.run_lock import LOCK_NAME, LockHeld, LockLost
from tests.conftest import REPO
from tests.job_helpers import job_config, read_rows
from tests.process_io import wait_until
from tests.test_faults import assert_exactly_once, start_job, wait_for_a_committed_wave
from tests.test_incremental import foreign_lock, snapshot, write_image
from tests.test_video_input import encode_video, road_frames

JOB = REPO / "jobs" / "infer_yolact.py"


def detected(spark, output: Path) -> list[str]:
    """The names in detections/ (every committed row), [] before the first commit."""
    if not any((output / "detections").glob("*.parquet")):
        return []
    return sorted(Path(row.path).name for row in spark.read.parquet(str(output / "detections")).collect())


def stream_job(*args: str, own_process_group: bool = False, spark_submit: bool = False):
    """The job in a process of its own on local[2]: `python jobs/infer_yolact.py`, or under spark-submit (the
    process is then its JVM, the Python driver's parent)."""
    master = ("--master", "local[2]")
    return start_job(
        "--partitions",
        "2",
        *args,
        *(() if spark_submit else master),
        own_process_group=own_process_group,
        spark_submit=master if spark_submit else None,
    )


def land(images: Path, staging: Path, names: list[str], seed: int) -> None:
    for i, name in enumerate(names):
        write_image(staging / name, seed + i)
        os.replace(staging / name, images / name)  # lands whole, as an upload's final rename does


def land_in_groups(spark, images: Path, staging: Path, output: Path, job) -> list[str]:
    """Once the running stream `job` holds the output: two groups of 3 images landed, each once the one before is
    in detections/ (exactly those names). Returns the names."""
    wait_until(lambda: (output / LOCK_NAME).is_file(), "the stream's lock", 300, process=job)
    names: list[str] = []
    for group in range(2):
        moved = [f"g{group}-{i}.jpg" for i in range(3)]
        land(images, staging, moved, 10 * group)
        names += moved
        expected = sorted(names)
        wait_until(lambda: detected(spark, output) == expected, f"group {group}'s detections", 600, 1, job)  # noqa: B023
    return names


def land_refuse_and_stop(spark, images: Path, staging: Path, output: Path, job, finish) -> tuple[list[str], str]:
    """land_in_groups, then a batch run on the output refused by the stream's lock, then SIGTERM: the stream ends
    after its micro-batch, exit 0, one line. Returns the names landed and the job's log (`finish(job)`)."""
    try:
        names = land_in_groups(spark, images, staging, output, job)
        with pytest.raises(LockHeld):  # a batch run on the stream's output is refused
            run(spark, job_config(images, output))
        job.send_signal(signal.SIGTERM)
        log = finish(job)
    finally:
        job.kill()
        job.wait(timeout=60)
    assert "stopping after the micro-batch in progress" in log and "Traceback" not in log, log[-3000:]
    return names, log


def finished(job, timeout_s: float = 600) -> str:
    log = job.communicate(timeout=timeout_s)[0].decode(errors="replace")
    assert job.returncode == 0, log[-3000:]
    return log


def test_available_now_takes_the_backlog_once_beside_batch_runs(spark, tmp_path):
    images, output = tmp_path / "images", tmp_path / "out"
    for seed in range(3):
        write_image(images / f"a{seed}.jpg", seed)
    assert run(spark, job_config(images, output))["counts"]["done"] == 3  # a batch run first

    for seed in range(3, 5):
        write_image(images / "new" / f"b {seed}.jpg", seed)  # a sub-directory, a space in the name
    log = finished(stream_job("--input", str(images), "--output", str(output), "--available-now"))
    assert "done 2, failed 0" in log and "skipped 3" in log, log[-3000:]  # the stream skips what the batch did
    summary = json.loads((output / "summary.json").read_text())
    assert summary["counts"]["done"] == 2 and summary["stream"]["batches"] == 1
    assert not (output / LOCK_NAME).exists()

    before = snapshot(output)
    log = finished(stream_job("--input", str(images), "--output", str(output), "--available-now"))
    assert "nothing new under" in log, log[-3000:]
    assert snapshot(output) == before, "a stream with nothing new wrote something"

    after = run(spark, job_config(images, output))  # a batch run after the stream finds nothing to do
    assert after["counts"]["done"] == 0 and after["counts"]["skipped"] == 5
    assert_exactly_once(spark, output, [f"a{seed}.jpg" for seed in range(3)] + ["b 3.jpg", "b 4.jpg"])


def test_files_moved_in_while_a_stream_runs_are_each_done_once_and_sigterm_stops_it(spark, tmp_path):
    """Under spark-submit, SIGTERM to its JVM alone (`kill <pid>`, Kubernetes) ends the stream after its
    micro-batch, exit 0 (a signal to the Python driver takes the same path: stop_signals)."""
    images, staging, output = tmp_path / "images", tmp_path / "staging", tmp_path / "out"
    images.mkdir()
    args = ("--input", str(images), "--output", str(output), "--stream", "--trigger-interval", "1s")
    job = stream_job(*args, spark_submit=True)
    names, _ = land_refuse_and_stop(spark, images, staging, output, job, finished)
    assert_exactly_once(spark, output, names)
    assert not (output / LOCK_NAME).exists()


def test_a_checkpoint_of_another_input_is_refused_with_exit_2_naming_both(tmp_path):
    images, other, output = tmp_path / "images", tmp_path / "other", tmp_path / "out"
    write_image(images / "a.jpg", 0)
    (output / STREAM_DIR).mkdir(parents=True)
    (output / STREAM_DIR / "source.json").write_text(json.dumps({"input": str(other), "model_sha256": "f00d" * 16}))
    job = stream_job("--input", str(images), "--output", str(output), "--available-now")
    log = job.communicate(timeout=300)[0].decode(errors="replace")
    assert job.returncode == 2, log[-3000:]
    error = [line for line in log.splitlines() if line.startswith("error: ")]
    assert error and str(other) in error[0] and str(images) in error[0] and "f00df00df00d" in error[0], log


def test_a_stream_on_an_output_a_batch_run_holds_exits_4_naming_it(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out"
    write_image(images / "a.jpg", 0)
    output.mkdir()
    (output / LOCK_NAME).write_bytes(foreign_lock("batch-run-elsewhere", heartbeat_age_s=5))  # alive, another host
    job = stream_job("--input", str(images), "--output", str(output), "--available-now")
    log = job.communicate(timeout=300)[0].decode(errors="replace")
    assert job.returncode == 4, log[-3000:]
    assert "batch-run-elsewhere" in [line for line in log.splitlines() if line.startswith("error: ")][0], log
    assert sorted(p.name for p in output.iterdir()) == [LOCK_NAME], "the refused stream wrote nothing"


def test_a_stream_killed_mid_batch_resumes_with_nothing_lost_or_twice(spark, tmp_path):
    images, output = tmp_path / "images", tmp_path / "out"
    names = [f"img{i:02d}.jpg" for i in range(16)]
    for seed, name in enumerate(names):
        write_image(images / name, seed)
    config = tmp_path / "waves.yaml"
    config.write_text("run:\n  commit_every: 4\n")
    args = ("--config", str(config), "--input", str(images), "--output", str(output), "--available-now")
    job = stream_job(*args, own_process_group=True)
    try:  # driver, JVM and Python workers at once, once the micro-batch committed its first wave
        wait_for_a_committed_wave(output, job)  # a glob, not a Spark read: the kill follows the commit closely
        os.killpg(job.pid, signal.SIGKILL)
        job.wait()
    finally:
        job.kill()
    committed = len(detected(spark, output))
    assert 0 < committed < len(names), "killed mid-batch"
    log = finished(stream_job(*args))
    assert f"done {len(names) - committed}, failed 0" in log and f"skipped {committed}" in log, log[-3000:]
    assert_exactly_once(spark, output, names)
    masks = sorted(p.name for p in (output / "masks").rglob("*.png"))  # the killed wave's orphans rewritten, once
    assert masks == sorted(f"{name}.png" for name in names)


def test_the_backlog_is_told_once_per_micro_batch_where_the_source_reports_it(capsys):
    progress = {"batchId": 3, "sources": [{"metrics": {"numFilesOutstanding": "12"}}]}  # Auto Loader's
    assert tell_progress(progress, -1) == 3 and tell_progress(progress, 3) == 3
    assert tell_progress({"batchId": 4, "sources": [{"metrics": {}}]}, 3) == 4  # Spark's file source: no metric
    assert tell_progress(None, 4) == 4
    assert capsys.readouterr().err.count("backlog 12 files") == 1


def test_a_micro_batch_error_from_a_connect_server_is_raised_as_its_class():
    """The server's worker reports a micro-batch's error as text (a Python traceback inside Spark's message): a
    sparkseg error comes back as its class, with its exit code; anything else is a RunFailed naming Spark's line."""
    text = (
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in the user provided function in foreach batch sink.\n"
        'Traceback (most recent call last):\n  File "stream_job.py", line 1, in __call__\n'
        "pipelines.io.run_lock.LockLost: /out/_sparkseg.lock: this stream's lock was broken by run x\n"
    )
    error = remote_error(text)
    assert isinstance(error, LockLost) and error.exit_code == 4 and str(error).startswith("/out/_sparkseg.lock")
    assert isinstance(remote_error(text.replace("LockLost", "StopRequested").replace("run_lock", "x")), RunFailed)
    stop = remote_error("pipelines.inference.stream_job.StopRequested: micro-batch 3 not run: the stream is stopping")
    assert isinstance(stop, StopRequested) and stop.exit_code == 0
    other = remote_error("java.lang.OutOfMemoryError: Java heap space\n  at ...")
    assert isinstance(other, RunFailed) and "java.lang.OutOfMemoryError: Java heap space" in str(other)


def test_a_video_landing_beside_images_has_its_frames_done_once(spark, tmp_path):
    """A video in a stream is read by path on the executors (its frames cut into units as in a batch run): the
    library's stream() on this session, available now, then again with nothing new."""
    images, output = tmp_path / "images", tmp_path / "out"
    write_image(images / "a.jpg", 0)
    encode_video(images / "clips" / "road clip.mp4", road_frames(12))
    config = job_config(images, output)
    config["input"]["video"]["frame_stride"] = 3
    config["stream"]["available_now"] = True
    summary = stream(spark, config)
    assert summary is not None and summary["counts"]["videos"] == 1 and summary["counts"]["frames"] == 4, summary
    rows = read_rows(spark, output, "detections")
    clip = sorted(r.frame_index for r in rows if "clip" in r.path)
    assert clip == [0, 3, 6, 9] and [Path(r.path).name for r in rows if "clip" not in r.path] == ["a.jpg"]
    assert stream(spark, config) is None  # nothing new: the checkpoint saw both files
