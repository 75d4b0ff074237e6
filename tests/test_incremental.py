"""Scheduled incremental runs: the next run processes exactly the new and replaced images, readers see the newest
record per path, and the output lock (<output>/_sparkseg.lock) keeps two runs on one output from overlapping:
local files, Azure blobs (Azurite) and Hadoop's FileSystem (through the Spark JVM)."""

from __future__ import annotations

import datetime as dt
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.inference.inference_job import run
from pipelines.io.lock_stores import AzureLockStore, HadoopLockStore, LocalLockStore
from pipelines.io.run_lock import (
    LOCK_NAME,
    LockHeld,
    LockInfo,
    LockSettings,
    RunLock,
    lock_store,
)
from pipelines.io.storage import Location
from pipelines.results.incremental import current_detections, current_errors, table_counts
from pipelines.spark.session_kind import hadoop_files
from tests.conftest import REPO, SAMPLES
from tests.job_helpers import job_config
from tests.process_io import read_line, wait_until

MODEL_DIR = SAMPLES / "models" / "yolact_default"


def write_image(path: Path, seed: int, size: tuple[int, int] = (64, 48)) -> None:
    """A small deterministic JPEG (noise), `size` = (width, height)."""
    pixels = np.random.default_rng(seed).integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(pixels).save(path, quality=90)


def names(rows) -> list[str]:
    return sorted(Path(row.path).name for row in rows)


# ---- incremental runs -------------------------------------------------------------------------------------------


def test_next_run_processes_exactly_the_new_and_replaced_images(spark, tmp_path, caplog):
    images, output = tmp_path / "images", tmp_path / "out"
    for seed, name in enumerate(["a.jpg", "b.jpg", "c.jpg", "e.jpg"]):
        write_image(images / name, seed)
    first = run(spark, job_config(images, output))
    assert first["counts"]["done"] == 4 and first["counts"]["failed"] == 0

    write_image(images / "a.jpg", seed=10, size=(80, 60))  # replaced: other content and size
    stat = (images / "b.jpg").stat()
    os.utime(images / "b.jpg", (stat.st_atime, stat.st_mtime + 60))  # replaced by the same bytes: newer mtime
    (images / "c.jpg").write_bytes(b"this is no longer a jpeg")  # replaced by a broken file
    write_image(images / "d.jpg", seed=5)  # new
    second = run(spark, job_config(images, output))  # e.jpg is unchanged
    assert {k: second["counts"][k] for k in ("inputs", "skipped", "done", "failed")} == {
        "inputs": 5,
        "skipped": 1,
        "done": 3,
        "failed": 1,
    }
    detections = spark.read.parquet(str(output / "detections"))
    errors = spark.read.parquet(str(output / "errors"))
    assert names(detections.where(f"run_id = '{second['run_id']}'").collect()) == ["a.jpg", "b.jpg", "d.jpg"]
    assert names(errors.where(f"run_id = '{second['run_id']}'").collect()) == ["c.jpg"]
    assert detections.count() == 4 + 3  # append-only: the first run's rows stay

    current = current_detections(spark, str(output)).collect()
    assert names(current) == ["a.jpg", "b.jpg", "d.jpg", "e.jpg"]  # one row per path; c's newest record is an error
    run_of = {Path(row.path).name: row.run_id for row in current}
    assert run_of == {
        "a.jpg": second["run_id"],
        "b.jpg": second["run_id"],
        "d.jpg": second["run_id"],
        "e.jpg": first["run_id"],
    }
    assert [(row.width, row.height) for row in current if row.path.endswith("a.jpg")] == [(80, 60)]
    assert names(current_errors(spark, str(output)).collect()) == ["c.jpg"]
    counts = {"images": 4, "errors": 1, "superseded_rows": 3}  # the first run's a, b and c
    assert table_counts(spark, str(output)) == counts
    assert second["table"] == counts
    assert json.loads((output / "summary.json").read_text())["table"] == counts

    with caplog.at_level("WARNING", logger="pipelines.inference.resume"):
        third = run(spark, job_config(images, output))
    assert third["counts"]["skipped"] == 5 and third["counts"]["done"] == third["counts"]["failed"] == 0
    assert not (output / LOCK_NAME).exists(), "a finished run must release the lock"
    assert "already done keep" not in caplog.text

    # other output settings: the images done keep their rows, and the run says so
    write_image(images / "f.jpg", seed=6)
    config = job_config(images, output)
    config["output"].update({"masks": "none", "score_threshold": 0.5})
    with caplog.at_level("WARNING", logger="pipelines.inference.resume"):
        assert run(spark, config)["counts"]["done"] == 1
    assert (
        "5 images already done keep the rows the last run wrote (output.masks (--masks) 'rle_and_png' -> "
        "'none', output.score_threshold (--score-threshold) None -> 0.5)"
    ) in caplog.text


def test_images_whose_failure_was_not_their_own_are_tried_again_by_the_next_runs(spark, tmp_path):
    """A label map the output refused (here its folder is a file in the way) is a `write` error, not a done image:
    the next runs do it again, up to run.retries times; a file that does not decode stays recorded until it
    changes."""
    images, output = tmp_path / "images", tmp_path / "out"
    for seed, name in enumerate(["a.jpg", "b.jpg"]):
        write_image(images / name, seed)
    (images / "broken.jpg").write_bytes(b"not a jpeg")
    output.mkdir()
    (output / "masks").write_bytes(b"in the way")
    config = job_config(images, output)
    config["run"].update(max_error_fraction=1.0, retries=1)
    first = run(spark, config)
    assert first["counts"]["done"] == 0 and first["counts"]["failed"] == 3
    errors = spark.read.parquet(str(output / "errors")).collect()
    assert sorted((Path(e.path).name, e.stage) for e in errors) == [
        ("a.jpg", "write"),
        ("b.jpg", "write"),
        ("broken.jpg", "decode"),
    ]
    second = run(spark, config)  # still in the way: tried once more, and failed again
    assert (second["counts"]["skipped"], second["counts"]["failed"]) == (1, 2)
    assert run(spark, config)["counts"]["skipped"] == 3, "given up after run.retries more tries"

    (output / "masks").unlink()
    config["run"]["retries"] = 3
    fourth = run(spark, config)
    assert {k: fourth["counts"][k] for k in ("inputs", "skipped", "done", "failed")} == {
        "inputs": 3,
        "skipped": 1,
        "done": 2,
        "failed": 0,
    }
    assert names(current_detections(spark, str(output)).collect()) == ["a.jpg", "b.jpg"]
    assert names(current_errors(spark, str(output)).collect()) == ["broken.jpg"]
    assert fourth["table"] == table_counts(spark, str(output)) == {"images": 2, "errors": 1, "superseded_rows": 4}
    assert run(spark, config)["counts"]["skipped"] == 3


def taken_log(caplog) -> str:
    """The warnings logged since the last call (the run lock reports through logging)."""
    text = caplog.text
    caplog.clear()
    return text


def test_run_refuses_a_held_output_and_breaks_the_lock_on_request(spark, tmp_path, caplog):
    images, output = tmp_path / "images", tmp_path / "out"
    write_image(images / "a.jpg", 1)
    holder = RunLock.acquire(str(output), "20990101T000000Z-holder")  # a live run: this process, fresh heartbeat
    try:
        with pytest.raises(LockHeld, match=r"held by run 20990101T000000Z-holder \(host .*, pid \d+") as held:
            run(spark, job_config(images, output))
        assert "--break-lock" in str(held.value)
        assert sorted(p.name for p in output.iterdir()) == [LOCK_NAME], "a refused run must write nothing"

        config = job_config(images, output)
        config["run"]["break_lock"] = True
        summary = run(spark, config)
        assert summary["counts"]["done"] == 1
        assert "broke the lock" in taken_log(caplog)
        assert holder.heartbeat() is False and holder.lost  # the old holder learns it lost the lock
    finally:
        holder.release()
    assert not (output / LOCK_NAME).exists()


# ---- the lock itself ------------------------------------------------------------------------------------------

HOLD_LOCK = """
import sys, time
sys.path.insert(0, sys.argv[2])
from pipelines.io.run_lock import RunLock
RunLock.acquire(sys.argv[1], "run-that-dies")
print("held", flush=True)
time.sleep(600)
"""


def test_lock_of_a_killed_run_is_broken_by_the_next_run(tmp_path, caplog):
    output = tmp_path / "out"
    dying = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(output), str(REPO)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert read_line(dying) == "held"
    finally:
        dying.kill()
        dying.wait()
    left = LockInfo.parse((output / LOCK_NAME).read_bytes())
    assert left.run_id == "run-that-dies" and left.pid == dying.pid  # the dead run's lock is still there

    with RunLock.acquire(str(output), "next-run") as lock:
        assert LockInfo.parse((output / LOCK_NAME).read_bytes()).run_id == "next-run"
        assert lock.info.host == socket.gethostname() and lock.info.pid == os.getpid()
    err = taken_log(caplog)
    assert "broke the lock" in err and f"its process {dying.pid}" in err and "is gone" in err
    assert not (output / LOCK_NAME).exists()


def foreign_lock(run_id: str, heartbeat_age_s: float) -> bytes:
    """A lock written by a run on another host, whose last heartbeat is `heartbeat_age_s` old."""
    beat = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=heartbeat_age_s)).isoformat()
    return LockInfo(run_id, "another-host.example", 4242, None, beat, beat).to_bytes()


def test_lock_from_another_host_is_stale_only_after_the_timeout(tmp_path, caplog):
    output = tmp_path / "out"
    output.mkdir()
    settings = LockSettings(stale_after_s=600, heartbeat_s=30)
    (output / LOCK_NAME).write_bytes(foreign_lock("remote-live", heartbeat_age_s=5))
    with pytest.raises(LockHeld, match=r"remote-live \(host another-host.example, pid 4242"):
        RunLock.acquire(str(output), "mine", settings)
    assert LockInfo.parse((output / LOCK_NAME).read_bytes()).run_id == "remote-live"  # untouched

    RunLock.acquire(str(output), "mine", LockSettings(break_lock=True)).release()  # --break-lock
    assert "forced by --break-lock" in taken_log(caplog)

    (output / LOCK_NAME).write_bytes(foreign_lock("remote-dead", heartbeat_age_s=3600))
    RunLock.acquire(str(output), "mine", settings).release()
    assert "no heartbeat for 3600 s" in taken_log(caplog)

    (output / LOCK_NAME).write_bytes(b"")  # a lock being written right now (created, content not yet there)
    with pytest.raises(LockHeld, match="unreadable lock"):
        RunLock.acquire(str(output), "mine", settings)


def test_heartbeat_keeps_the_lock_fresh_and_a_takeover_is_noticed(tmp_path, caplog):
    output = str(tmp_path / "out")
    first = RunLock.acquire(output, "first", LockSettings(stale_after_s=60, heartbeat_s=0.1))
    try:
        started = first.info.heartbeat
        wait_until(
            lambda: LockInfo.parse(Path(output, LOCK_NAME).read_bytes()).heartbeat != started,
            "the heartbeat thread to rewrite the lock",
        )
        second = RunLock.acquire(output, "second", LockSettings(break_lock=True))
        wait_until(lambda: first.lost, "the first run's heartbeat to notice the takeover", 60)
    finally:
        first.release()
    assert LockInfo.parse(Path(output, LOCK_NAME).read_bytes()).run_id == "second", (
        "release must not remove a lock that is not its own"
    )
    second.release()
    assert "this run (first) stops at its next wave" in taken_log(caplog)


def test_local_store_operations_are_conditional(tmp_path):
    store = LocalLockStore(str(tmp_path / LOCK_NAME))
    token = store.create(b"one")
    assert token is not None and store.create(b"two") is None
    assert store.read()[0] == b"one"
    newer = store.replace(b"three", token)
    assert newer is not None and store.replace(b"four", token) is None  # a stale token changes nothing
    assert store.delete(token) is False and store.read()[0] == b"three"
    assert store.delete(newer) is True and store.read() is None
    assert sorted(os.listdir(tmp_path)) == []  # no temp or aside files left


def test_a_rewrite_during_a_take_over_waits_and_then_finds_the_lock_taken(tmp_path):
    """A local lock's check-and-act steps (create, a heartbeat's rewrite, a breaker's removal) hold an flock on the
    lock's directory. A rewrite that starts while another process is between its check and its act waits, then
    finds the new lock instead of renaming its own version over it (which left the breaker, not the broken run,
    lost: seen as a heartbeat test that waited forever for the broken run to notice)."""
    store = LocalLockStore(str(tmp_path / LOCK_NAME))
    token = store.create(b"first")
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(directory, fcntl.LOCK_EX)  # another process's take-over in progress
    result = {}
    rewrite = threading.Thread(target=lambda: result.update(token=store.replace(b"first, beat 2", token)))
    rewrite.start()
    try:
        (tmp_path / LOCK_NAME).unlink()
        (tmp_path / LOCK_NAME).write_bytes(b"second")
    finally:
        os.close(directory)  # releases the flock
    rewrite.join(timeout=60)
    assert not rewrite.is_alive() and result == {"token": None}
    assert store.read()[0] == b"second"
    assert sorted(os.listdir(tmp_path)) == [LOCK_NAME]  # the rewrite's temp file is gone


def test_azure_lock_blob_is_created_only_when_absent_and_changed_only_by_etag(azurite):
    from pipelines.io.azure_credentials import AzureCredentials

    credentials = AzureCredentials(connection_string=azurite.connection_string)
    output = f"az://{azurite.create_container()}/out"
    store = lock_store(Location(output, credentials))
    assert isinstance(store, AzureLockStore) and store.uri == f"{output}/{LOCK_NAME}"
    etag = store.create(b"one")  # Put Blob with If-None-Match: *
    assert etag and store.create(b"two") is None
    assert store.read()[:2] == (b"one", etag)
    newer = store.replace(b"three", etag)  # If-Match: etag
    assert newer and newer != etag and store.replace(b"four", etag) is None
    assert store.delete(etag) is False and store.read()[0] == b"three"
    assert store.delete(newer) is True and store.read() is None

    with RunLock.acquire(Location(output, credentials), "azure-run"):
        with pytest.raises(LockHeld, match="azure-run"):
            RunLock.acquire(Location(output, credentials), "second")
        blob = azurite.service_client().get_blob_client(output.split("/")[2], f"out/{LOCK_NAME}")
        assert json.loads(blob.download_blob().readall())["run_id"] == "azure-run"
    assert store.read() is None


def test_hadoop_lock_store_through_the_spark_jvm(spark, tmp_path):
    uri = f"file://{tmp_path}/{LOCK_NAME}"
    store = HadoopLockStore(uri, hadoop_files(spark, uri))
    token = store.create(b"one")
    assert token == b"one" and store.create(b"two") is None
    data, found, modified = store.read()
    assert data == b"one" and found == token and abs(modified - time.time()) < 3600
    newer = store.replace(b"three", token)
    assert newer == b"three" and store.replace(b"four", token) is None
    assert store.delete(token) is False and store.read()[0] == b"three"
    assert store.delete(newer) is True and store.read() is None
    with pytest.raises(ValueError, match="needs its FileSystem"):
        lock_store("hdfs://namenode/out")


# ---- two real runs --------------------------------------------------------------------------------------------


def descendants(pid: int) -> list[int]:
    """`pid` and every live process below it (Linux /proc)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                    parent = int(stat.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo.extend(children.get(current, []))
    return found


def snapshot(directory: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(directory)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


def test_second_run_while_the_first_holds_the_lock_exits_4_and_changes_nothing(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out"
    for seed in range(3):
        write_image(images / f"img{seed}.jpg", seed)
    command = [
        sys.executable,
        str(REPO / "jobs" / "infer_yolact.py"),
        "--input",
        str(images),
        "--output",
        str(output),
        "--model",
        str(MODEL_DIR),
        "--precision",
        "f32",
        "--partitions",
        "1",
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    first = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    frozen: list[int] = []
    try:
        wait_until(lambda: (output / LOCK_NAME).is_file() or first.poll() is not None, "the first run's lock")
        assert first.poll() is None, f"the first run ended early:\n{first.communicate()[1][-3000:]}"
        # Freeze the first run (driver, JVM, Python workers) while it holds the lock: no timing luck involved.
        for _ in range(2):  # twice: a process forked during the first sweep is caught by the second
            for pid in descendants(first.pid):
                if pid not in frozen:
                    os.kill(pid, signal.SIGSTOP)
                    frozen.append(pid)
        holder = LockInfo.parse((output / LOCK_NAME).read_bytes())
        assert holder is not None and holder.pid == first.pid
        before = snapshot(output)

        second = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
        assert second.returncode == 4, second.stderr[-3000:]
        message = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
        assert message and holder.run_id in message[0] and f"pid {first.pid}" in message[0], second.stderr[-3000:]
        assert f"host {socket.gethostname()}" in message[0]
        assert snapshot(output) == before, "the refused run changed the output"
    finally:
        for pid in frozen:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    stdout, stderr = first.communicate(timeout=600)
    assert first.returncode == 0, stderr[-3000:]
    assert "done 3, failed 0" in stdout
    assert not (output / LOCK_NAME).exists()
