"""The streaming job on a Spark Connect session (--remote): the server runs each micro-batch in a Python process of
its own, with what it needs to honour the client's lock and stop request (stream_job.LockWatch, StopFile). Files
moved in while the stream runs are each done once, a batch run beside it is refused by the lock, SIGTERM to the
client ends it after its micro-batch (exit 0), and a SIGKILLed client's stream is taken over by the next run: its
session ended, the files that landed since done once."""

from __future__ import annotations

import subprocess
from pathlib import Path

from pipelines.io.run_lock import LOCK_NAME
from tests.conftest import REPO
from tests.process_io import wait_until
from tests.test_connect_session import CLIENT_PYTHON
from tests.test_faults import assert_exactly_once
from tests.test_stream_job import detected, land, land_refuse_and_stop

JOB = REPO / "jobs" / "infer_yolact.py"


def client_stream(remote: str, images: Path, output: Path, log: Path, *flags: str) -> subprocess.Popen:
    """The job's stream from the client env (no JVM here), its output in `log`."""
    command = [str(CLIENT_PYTHON), str(JOB), "--input", str(images), "--output", str(output)]
    with open(log, "wb") as out:
        return subprocess.Popen(
            [*command, "--partitions", "2", "--remote", remote, *flags], cwd=REPO, stdout=out, stderr=subprocess.STDOUT
        )


def ended(job: subprocess.Popen, log: Path, timeout_s: float = 600) -> str:
    job.wait(timeout=timeout_s)
    text = log.read_text(errors="replace")
    assert job.returncode == 0, text[-3000:]
    return text


def test_a_stream_on_connect_takes_each_file_once_holds_the_lock_and_stops_on_sigterm(connect_server, spark, tmp_path):
    images, staging, output, log = tmp_path / "images", tmp_path / "staging", tmp_path / "out", tmp_path / "log"
    images.mkdir()
    job = client_stream(connect_server, images, output, log, "--stream", "--trigger-interval", "1s")
    names, text = land_refuse_and_stop(spark, images, staging, output, job, lambda job: ended(job, log))
    assert "done since the stream started" in text, "the client tells each micro-batch the server ran"
    assert_exactly_once(spark, output, names)
    assert not (output / LOCK_NAME).exists()


def test_a_killed_connect_stream_is_taken_over_and_what_landed_since_is_done_once(connect_server, spark, tmp_path):
    images, staging, output, log = tmp_path / "images", tmp_path / "staging", tmp_path / "out", tmp_path / "log"
    images.mkdir()
    first = ["a0.jpg", "a1.jpg"]
    land(images, staging, first, 0)
    job = client_stream(connect_server, images, output, log, "--stream", "--trigger-interval", "1s")
    try:
        wait_until(lambda: detected(spark, output) == first, "the first files' detections", 600, 1, job)
    finally:
        job.kill()  # SIGKILL: its query is left running on the server, in the client's session
        job.wait(timeout=60)
    later = ["b0.jpg", "b1.jpg", "b2.jpg"]
    land(images, staging, later, 10)
    text = ended(client_stream(connect_server, images, output, tmp_path / "log2", "--available-now"), tmp_path / "log2")
    # the dead client's query stopped at its next micro-batch (its lock's process is gone): the new run does them
    assert "broke the lock" in text and "done 3, failed 0" in text, text[-3000:]
    assert_exactly_once(spark, output, first + later)
    assert not (output / LOCK_NAME).exists()
