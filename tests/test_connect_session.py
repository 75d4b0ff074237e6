"""The inference job on a Spark Connect session: a Spark Connect server started from this env's pyspark (the
`connect_server` fixture of conftest.py), the job's command line run as a client of it (--remote), the detections
equal to a classic session's on the same images; a store the Connect driver cannot reach, or a remote that does not
answer, fails before any work with exit 2. The job's side runs from the client env (make client-env): pyspark-client,
no JVM and no py4j, as on a Databricks serverless client or a laptop."""

from __future__ import annotations

import io
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines.engines.bigdl_inference import BigDLEngine
from pipelines.errors import UsageError
from pipelines.inference.inference_job import run
from pipelines.io.run_lock import LockSettings, RunLock
from pipelines.job_config import SparkSettings
from pipelines.tools.connect_server import free_port, running_connect_server
from tests.conftest import REPO, SAMPLES
from tests.job_helpers import job_config, read_rows, sample_copies
from tests.process_io import wait_until
from tests.test_faults import assert_exactly_once, copies, kill_after_a_committed_wave
from tests.test_video_input import encode_video, road_frames

# The Connect client: what scripts/make_client_env.sh builds (make test-main builds it first)
CLIENT_PYTHON = Path(os.environ.get("SPARKSEG_CLIENT_VENV", REPO / ".venv-client")) / "bin" / "python"
DETECTOR_MODEL = REPO / "samples" / "models" / "detector_default"
IMAGES = ("astronaut.jpg", "camera.png", "chelsea.jpg", "coffee.jpg")  # a handful: colour and grey, JPEG and PNG


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return sample_copies(tmp_path_factory.mktemp("connect-images"), IMAGES)


def run_job(tmp_path: Path, config: dict, *flags: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """jobs/infer_yolact.py with `config` (as YAML) and `flags`, run by the client env's Python."""
    path = tmp_path / f"config-{len(list(tmp_path.glob('config-*')))}.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return subprocess.run(
        [str(CLIENT_PYTHON), str(REPO / "jobs" / "infer_yolact.py"), "--config", str(path), *flags],
        cwd=REPO,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_client_env_has_no_jvm_side():
    """What the Connect runs below run from: Spark's Connect client without py4j or Spark's jars."""
    probe = "import importlib.util as u, pyspark, pyspark.sql; print(u.find_spec('py4j'), pyspark.__file__)"
    found = subprocess.run([str(CLIENT_PYTHON), "-c", probe], capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    py4j, package = found.stdout.split()
    assert py4j == "None" and not (Path(package).parent / "jars").exists()


def test_a_connect_run_equals_the_classic_run(connect_server, spark, images, tmp_path):
    connect_out, classic_out = tmp_path / "connect", tmp_path / "classic"
    done = run_job(tmp_path, job_config(images, connect_out), "--remote", connect_server)
    assert done.returncode == 0, done.stderr[-3000:]
    classic_summary = run(spark, job_config(images, classic_out))
    connect_summary = json.loads((connect_out / "summary.json").read_text(encoding="utf-8"))
    assert connect_summary["counts"]["done"] == classic_summary["counts"]["done"] == len(IMAGES)
    assert connect_summary["counts"]["failed"] == 0
    columns = ("path", "width", "height", "instances")

    def detections(output: Path) -> dict:
        return {row.path: tuple(row[c] for c in columns) for row in read_rows(spark, output, "detections")}

    classic = detections(classic_out)
    assert detections(connect_out) == classic
    assert sum(len(found[-1]) for found in classic.values()) > 0  # the comparison compares detections
    assert "Traceback" not in done.stderr


def test_videos_errors_resume_and_the_report_on_connect_equal_classic(connect_server, spark, images, tmp_path):
    """Images, a video's frames, an unreadable file as an error row, the report, and a resume that does only the
    new image: the same rows and counts from a Connect run as from a classic one, run by run."""
    inputs = tmp_path / "in"
    inputs.mkdir()
    for name in IMAGES[:2]:
        shutil.copy(images / name, inputs / name)
    encode_video(inputs / "clip.mp4", road_frames(12, scenes=2))
    (inputs / "broken.jpg").write_bytes(b"not a jpeg at all")
    outputs = {"connect": tmp_path / "connect", "classic": tmp_path / "classic"}

    def both_runs() -> dict[str, dict]:
        configs = {kind: job_config(inputs, out) for kind, out in outputs.items()}
        for config in configs.values():
            config["output"]["overlays"] = True
        done = run_job(tmp_path, configs["connect"], "--remote", connect_server)
        assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr[-3000:]
        run(spark, configs["classic"])
        return {kind: json.loads((out / "summary.json").read_text(encoding="utf-8")) for kind, out in outputs.items()}

    def rows(output: Path) -> tuple[dict, set]:
        found = {(r.path, r.frame_index): r.instances for r in read_rows(spark, output, "detections")}
        return found, {(r.path, r.stage) for r in read_rows(spark, output, "errors")}

    first = both_runs()
    assert first["connect"]["counts"] == first["classic"]["counts"]
    assert first["classic"]["counts"]["done"] == 2 + 12 and first["classic"]["counts"]["failed"] == 1
    assert rows(outputs["connect"]) == rows(outputs["classic"])
    assert (outputs["connect"] / "report.html").is_file() and any((outputs["connect"] / "overlays").iterdir())
    shutil.copy(images / IMAGES[2], inputs / IMAGES[2])
    second = both_runs()
    assert second["connect"]["counts"]["done"] == second["classic"]["counts"]["done"] == 1
    detections, errors = rows(outputs["connect"])
    assert (detections, errors) == rows(outputs["classic"]) and len(detections) == 3 + 12


def test_a_server_whose_workers_lack_the_packages_fails_before_any_work(images, tmp_path):
    """Workers on a Python with nothing installed (this env's base interpreter): exit 2 naming the server and
    what its workers lack, before any output is written."""
    bare = str(Path(sys.base_prefix) / "bin" / "python3")
    (tmp_path / "logs").mkdir()
    with running_connect_server(tmp_path / "logs", workers_python=bare) as remote:
        done = run_job(tmp_path, job_config(images, tmp_path / "out"), "--remote", remote)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith("[sparkseg]")]
    assert len(errors) == 1 and "the server's Python workers cannot run" in errors[0], done.stderr[-3000:]
    assert "No module named" in errors[0] and remote.removeprefix("sc://") in errors[0], errors
    assert not (tmp_path / "out").exists()


def test_the_detector_with_rle_masks_on_connect_equals_classic(connect_server, spark, images, tmp_path):
    """jobs/infer_detector.py (its bundled model) and output.masks rle on a Connect session: the classic rows."""
    configs = {kind: job_config(images, tmp_path / kind, DETECTOR_MODEL) for kind in ("connect", "classic")}
    for config in configs.values():
        config["output"]["masks"] = "rle"
    path = tmp_path / "detector.yaml"
    path.write_text(yaml.safe_dump(configs["connect"]), encoding="utf-8")
    done = subprocess.run(
        [
            str(CLIENT_PYTHON),
            str(REPO / "jobs" / "infer_detector.py"),
            "--config",
            str(path),
            "--remote",
            connect_server,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    run(spark, configs["classic"], family="detector")

    def rows(output: Path) -> dict:
        return {r.path: (r.instances, r.mask_path) for r in read_rows(spark, output, "detections")}

    classic = rows(tmp_path / "classic")
    assert rows(tmp_path / "connect") == classic and len(classic) == len(IMAGES)
    assert not (tmp_path / "connect" / "masks").exists()  # rle: no label-map PNGs


def test_a_hadoop_output_on_connect_fails_before_any_work(connect_server, images, tmp_path):
    done = run_job(tmp_path, job_config(images, "hdfs://namenode:8020/out"), env={"SPARK_REMOTE": connect_server})
    assert done.returncode == 2, done.stderr[-3000:]
    assert "hdfs://namenode:8020/out: a Spark Connect session" in done.stderr and "az://" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_remote_that_does_not_answer_fails_before_any_work(images, tmp_path):
    remote = f"sc://127.0.0.1:{free_port()}"
    done = run_job(tmp_path, job_config(images, tmp_path / "out"), "--remote", remote)
    assert done.returncode == 2, done.stderr[-3000:]
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and f"{remote}: no Spark Connect server answers" in errors[0], done.stderr
    assert not (tmp_path / "out").exists()


def test_ctrl_c_stops_a_connect_run_cleanly(connect_server, images, tmp_path):
    """SIGINT interrupts the run's operations on the server: exit 130 with one line, the lock released."""
    many = tmp_path / "many"
    many.mkdir()
    for copy in range(15):  # 60 images: the run is still inferring when the signal comes
        for path in images.iterdir():
            shutil.copy(path, many / f"{copy:02d}-{path.name}")
    config, output, log = job_config(many, tmp_path / "out"), tmp_path / "out", tmp_path / "stderr.log"
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    command = [
        str(CLIENT_PYTHON),
        str(REPO / "jobs" / "infer_yolact.py"),
        "--config",
        str(path),
        "--remote",
        connect_server,
    ]
    with open(log, "w", encoding="utf-8") as stderr:
        job = subprocess.Popen(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, text=True)
    try:
        wait_until(lambda: "to do" in log.read_text(encoding="utf-8"), "the run plans its work", process=job)
        job.send_signal(signal.SIGINT)
        assert job.wait(timeout=120) == 130, log.read_text(encoding="utf-8")[-3000:]
    finally:
        if job.poll() is None:
            job.kill()
            job.wait(timeout=60)
    text = log.read_text(encoding="utf-8")
    assert text.strip().splitlines()[-1].startswith("error: interrupted (Ctrl-C)") and "Traceback" not in text
    assert not (output / "_sparkseg.lock").exists()


def azure_detections(client, prefix: str) -> dict:
    """path -> (width, height, instances) of the detections/ table under `prefix` of an Azurite container."""
    tables = [
        pq.read_table(io.BytesIO(client.download_blob(blob.name).readall()))
        for blob in client.list_blobs(name_starts_with=f"{prefix}/detections/")
        if blob.name.endswith(".parquet")
    ]
    rows = pa.concat_tables(tables).to_pylist()
    return {row["path"]: (row["width"], row["height"], row["instances"]) for row in rows}


def test_a_connect_run_on_azure_equals_the_classic_run(connect_server, spark, azurite, monkeypatch, tmp_path):
    """az:// in and out on a Connect session: listed by executor tasks (the DataFrame fan-out), read and written
    through the Azure SDK, the lock and summary from the client."""
    monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", azurite.connection_string)
    container = azurite.create_container("connect-run")
    client = azurite.service_client().get_container_client(container)
    for number, name in enumerate(IMAGES[:3]):
        client.upload_blob(f"in/day{number % 2}/{name}", (SAMPLES / "images" / name).read_bytes())
    config = job_config(tmp_path, tmp_path)
    config["input"]["uri"] = f"az://{container}/in"
    config["output"]["uri"] = f"az://{container}/connect"
    done = run_job(tmp_path, config, "--remote", connect_server)
    assert done.returncode == 0, done.stderr[-3000:]
    config["output"]["uri"] = f"az://{container}/classic"
    assert run(spark, config)["counts"]["done"] == 3
    classic = azure_detections(client, "classic")
    assert len(classic) == 3 and azure_detections(client, "connect") == classic


def test_the_bigdl_engine_refuses_a_remote():
    """BigDL is a JVM library beside the driver: a Connect session cannot run it (exit 2, before any session)."""
    settings = SparkSettings("local[2]", "sparkseg", {}, "WARN", "sc://127.0.0.1:15002")
    with pytest.raises(UsageError, match="sc://127.0.0.1:15002: the bigdl engine .* classic session") as raised:
        BigDLEngine().session(settings)
    assert raised.value.exit_code == 2


def test_a_killed_connect_client_is_resumed_once_and_a_held_output_is_refused(connect_server, spark, tmp_path):
    """The Connect client SIGKILLed after its first committed wave: the next client run takes over the lock and
    does the rest, every image exactly once; while a live run holds the output, a Connect run is refused (exit 4)
    and writes nothing."""
    images, output = tmp_path / "images", tmp_path / "out"
    names = copies(images, 24)
    config = job_config(images, output, partitions=2)
    config["run"]["commit_every"] = 6
    path = tmp_path / "waves.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    command = [str(CLIENT_PYTHON), str(REPO / "jobs" / "infer_yolact.py"), "--config", str(path)]
    job = subprocess.Popen([*command, "--remote", connect_server], cwd=REPO, stdout=subprocess.DEVNULL)
    try:
        kill_after_a_committed_wave(output, job)
    finally:
        job.kill()
        job.wait(timeout=60)
    holder = RunLock.acquire(str(output), "20990101T000000Z-holder", LockSettings(break_lock=True))
    try:
        refused = run_job(tmp_path, config, "--remote", connect_server)
    finally:
        holder.release()
    assert refused.returncode == 4 and "held by run 20990101T000000Z-holder" in refused.stderr, refused.stderr[-3000:]
    rerun = run_job(tmp_path, config, "--remote", connect_server)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert_exactly_once(spark, output, names)


ORPHAN = """
import pathlib, sys, time
from pyspark.sql import SparkSession
spark = SparkSession.builder.remote(sys.argv[1]).getOrCreate()
started, release = sys.argv[2], sys.argv[3]
print(spark.session_id, flush=True)

def held(batches):  # a task that runs until the test releases it (or 10 minutes)
    pathlib.Path(started).touch()
    deadline = time.monotonic() + 600
    while not pathlib.Path(release).exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    yield from batches

spark.range(1).mapInArrow(held, "id long").collect()
"""

END_SESSION = """
import sys
sys.path.insert(0, sys.argv[3])
from pyspark.sql import SparkSession
from pipelines.spark.session_kind import session_kind
kind = session_kind(SparkSession.builder.remote(sys.argv[1]).getOrCreate())
print(kind.end_session(sys.argv[2]), kind.end_session(sys.argv[2]))
"""


def test_the_operations_of_a_killed_clients_session_are_interrupted(connect_server, tmp_path):
    """What a run that breaks a dead Connect client's lock does first (inference_job.hold_output): the killed
    client's operation, still running on the server, is interrupted and its session released."""
    started, release = tmp_path / "started", tmp_path / "release"
    # scripts as files: run by `python -c`, pyspark's Connect package takes itself for a doctest run
    (tmp_path / "orphan.py").write_text(ORPHAN, encoding="utf-8")
    (tmp_path / "end_session.py").write_text(END_SESSION, encoding="utf-8")
    orphan = subprocess.Popen(
        [str(CLIENT_PYTHON), str(tmp_path / "orphan.py"), connect_server, str(started), str(release)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        wait_until(started.exists, "the client's operation runs on the server", timeout_s=300, process=orphan)
        orphan.kill()
        session = orphan.communicate(timeout=60)[0].split()[0]
        ended = subprocess.run(
            [str(CLIENT_PYTHON), str(tmp_path / "end_session.py"), connect_server, session, str(REPO)],
            capture_output=True,
            text=True,
            timeout=300,
        )
    finally:
        release.touch()
        orphan.kill()
        orphan.wait(timeout=60)
    assert ended.returncode == 0, ended.stderr[-3000:]
    assert ended.stdout.split() == ["1", "0"], ended.stdout  # the operation, then nothing: the session is released
