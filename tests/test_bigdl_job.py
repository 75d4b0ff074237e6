"""The bigdl engine through the job (run inside .venv-bigdl: `make test-bigdl`): same outputs as the native engine,
the same every-input-accounted-for guarantee, local mode and a 2-worker standalone cluster."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.engines.bigdl_inference import BigDLEngine
from pipelines.inference.inference_job import run
from pipelines.inference.model_manifest import load_manifest
from pipelines.ops.mask_outputs import decode_rle
from tests.bad_inputs import build_bad_input_corpus
from tests.bigdl.fixtures import bigdl_log, bigdl_spark  # noqa: F401  (pytest fixtures)
from tests.conftest import REPO, SAMPLES
from tests.job_helpers import DEFAULT_MODEL_DIR as MODEL_DIR
from tests.job_helpers import job_config, spark_submit_command

pytestmark = pytest.mark.bigdl
INPUT_HEIGHT, INPUT_WIDTH = load_manifest(MODEL_DIR).input_size  # the bundled model's network input


def rows_by_name(spark, output: Path) -> dict:
    return {Path(r.path).name: r for r in spark.read.parquet(str(output / "detections")).collect()}


def mask_iou(a, b) -> float:
    a, b = decode_rle(a.asDict(recursive=True)), decode_rle(b.asDict(recursive=True))
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def test_bigdl_engine_equals_the_native_engine(bigdl_spark, tmp_path):
    """Images already at the network's input size: both engines' resizes are the identity, so the only other
    difference left would be the engines themselves. (At other sizes BigDL's ImageResize, OpenCV INTER_LINEAR on
    uint8, differs from our float bilinear by <= 0.75 of a uint8 level: measured in test_bigdl_engine.py's
    test_preprocess_stays_within_one_uint8_level_of_our_numpy_preprocessing; on random weights that is enough to
    reorder near-tied detections, so the equality check uses input-sized images.)"""
    images = tmp_path / "images"
    images.mkdir()
    for path in sorted((SAMPLES / "images").glob("*.jpg"))[:4]:
        Image.open(path).convert("RGB").resize((INPUT_WIDTH, INPUT_HEIGHT)).save(images / (path.stem + ".png"))
    native = run(bigdl_spark, job_config(images, tmp_path / "native"))
    bigdl = run(
        bigdl_spark,
        {
            **job_config(images, tmp_path / "bigdl"),
            "inference": {**job_config(images, tmp_path)["inference"], "engine": "bigdl"},
        },
        engine=BigDLEngine(),
    )
    assert native["counts"]["done"] == bigdl["counts"]["done"] == 4
    assert bigdl["stage_seconds"]["infer"] > 0  # Orca's predict, timed as its rows are pulled
    ours, theirs = rows_by_name(bigdl_spark, tmp_path / "native"), rows_by_name(bigdl_spark, tmp_path / "bigdl")
    assert set(ours) == set(theirs)
    for name, row in ours.items():
        other = theirs[name]
        assert [i.class_id for i in row.instances] == [i.class_id for i in other.instances], name
        np.testing.assert_allclose([i.score for i in row.instances], [i.score for i in other.instances], atol=1e-4)
        for a, b in zip(row.instances, other.instances):
            assert mask_iou(a.mask, b.mask) >= 0.99


def test_bad_input_corpus_through_the_bigdl_engine(bigdl_spark, tmp_path):
    """The corpus without its 8000x8000 image: the bigdl engine hands BigDL a decoded BGR image struct (192 MB for
    that one) through the JVM, more than a 1 GB local-mode driver holds; the native engine keeps it in Python."""
    corpus = tmp_path / "bad"
    corpus.mkdir()
    expected = build_bad_input_corpus(corpus, include_large=False)
    config = job_config(corpus, tmp_path / "out", partitions=3)
    config["inference"]["engine"] = "bigdl"
    summary = run(bigdl_spark, config, engine=BigDLEngine())
    detections = set(rows_by_name(bigdl_spark, tmp_path / "out"))
    errors = {Path(r.path).name for r in bigdl_spark.read.parquet(str(tmp_path / "out" / "errors")).collect()}
    listed = {n for n in expected if Path(n).suffix.lower() in tuple(config["input"]["extensions"])}
    assert not detections & errors and detections | errors == listed
    assert {n for n in listed if expected[n] == "ok"} <= detections
    assert summary["counts"]["failed"] == len(errors)


def test_a_cluster_master_without_executor_cores_is_refused_before_spark_starts(tmp_path):
    """In its own process: this test session already has a (local) SparkContext, which a job would reuse."""
    done = subprocess.run(
        [
            sys.executable,
            str(REPO / "jobs" / "infer_yolact.py"),
            "--engine",
            "bigdl",
            "--master",
            "spark://127.0.0.1:1",
            "--input",
            str(SAMPLES / "images"),
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 2 and "`--conf spark.executor.cores=...` `--conf spark.cores.max=...`" in done.stderr, (
        done.stderr[-2000:]
    )
    assert not (tmp_path / "out").exists()


def test_an_azure_input_under_the_bigdl_engine_is_refused_saying_what_to_use():
    """The bigdl engine's pinned env has no Azure SDK: an az:// input stops before Spark starts, one line."""
    from pipelines.inference import image_sources as src
    from pipelines.inference.job_plan import plan_job
    from pipelines.job_config import load_config

    config = load_config()
    config["input"]["uri"], config["output"]["uri"] = "az://images/landing", "/tmp/unused-output"
    config["inference"]["engine"] = "bigdl"
    with pytest.raises(
        src.InputError,
        match=r"the bigdl engine's env \(make bigdl-env\) has no Azure SDK: run "
        r"this input or output with --engine native",
    ):
        plan_job(config, "yolact", engine=BigDLEngine())


def three_images(directory: Path) -> Path:
    directory.mkdir(parents=True)
    for name in ("synthetic_road_1.jpg", "coffee.jpg", "camera.png"):
        shutil.copy(SAMPLES / "images" / name, directory / name)
    return directory


def job_command(*args: str) -> list[str]:
    return [
        str(REPO / "jobs" / "infer_yolact.py"),
        "--engine",
        "bigdl",
        "--model",
        str(MODEL_DIR),
        "--precision",
        "f32",
        *args,
    ]


def spark_submit(options: list[str], job_args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    """This env's spark-submit as a user runs it: the env's bin/ first on PATH (pyspark's launcher finds its
    SPARK_HOME with the `python3` on PATH), its Python for the workers."""
    command, env = spark_submit_command(*options, *job_command(*job_args))
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=1200)


def bigdl_submit_options() -> list[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.engines.bigdl_engine", "--spark-submit-args"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return shlex.split(done.stdout)


@pytest.fixture(scope="module")
def python_run(tmp_path_factory) -> tuple[Path, dict]:
    """`python jobs/infer_yolact.py --engine bigdl` on three images, local[2]: the reference for spark-submit."""
    base = tmp_path_factory.mktemp("python-run")
    images = three_images(base / "images")
    done = subprocess.run(
        [sys.executable, *job_command("--master", "local[2]", "--input", str(images), "--output", str(base / "out"))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1200,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return images, detections_by_name(base / "out")


def detections_by_name(output: Path) -> dict:
    import pyarrow.parquet as pq

    return {Path(row["path"]).name: row for row in pq.read_table(output / "detections").to_pylist()}


def assert_same_detections(got: dict, expected: dict) -> None:
    """Same images, classes and boxes; scores equal up to OpenVINO's thread-order rounding (see
    test_bigdl_engine.assert_equal_up_to_thread_order; both runs use 1 thread per task, so they are usually exact)."""
    assert sorted(got) == sorted(expected)
    for name, row in got.items():
        theirs = expected[name]["instances"]
        assert [i["class_id"] for i in row["instances"]] == [i["class_id"] for i in theirs], name
        np.testing.assert_allclose([i["score"] for i in row["instances"]], [i["score"] for i in theirs], atol=1e-5)
        np.testing.assert_allclose([i["box"] for i in row["instances"]], [i["box"] for i in theirs], atol=0.5)


def test_spark_submit_without_bigdls_jars_stops_before_any_task_naming_the_options(tmp_path):
    images = three_images(tmp_path / "images")
    done = spark_submit(["--master", "local[2]"], ["--input", str(images), "--output", str(tmp_path / "out")], tmp_path)
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-3000:]
    said = done.stdout  # spark-submit sends the Python driver's stderr to its own stdout
    assert "spark.driver.extraClassPath=" in said and "--jars " in said and "--spark-submit-args" in said, said
    assert not (tmp_path / "out").exists()


def test_spark_submit_local_equals_the_python_run(python_run, tmp_path):
    images, expected = python_run
    done = spark_submit(
        ["--master", "local[2]", *bigdl_submit_options()],
        ["--input", str(images), "--output", str(tmp_path / "out")],
        tmp_path,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "done 3, failed 0" in done.stdout
    assert_same_detections(detections_by_name(tmp_path / "out"), expected)
    # the driver JVM logs at Spark's default level, not at BigDL's log4j2-test.xml's INFO (~2,600 lines here)
    info_lines = [line for line in done.stdout.splitlines() if " INFO " in line]
    assert not info_lines, info_lines[:5]


@pytest.mark.cluster
def test_spark_submit_on_a_two_worker_standalone_cluster_equals_the_python_run(python_run, tmp_path):
    from pipelines.sweeps.standalone_cluster import ClusterConfig, StandaloneCluster

    images, expected = python_run
    with StandaloneCluster(ClusterConfig(workers=2, cores=1, memory="1g"), base_dir=tmp_path / "cluster") as cluster:
        done = spark_submit(
            [
                "--master",
                cluster.master_url,
                "--executor-cores",
                "1",
                "--total-executor-cores",
                "2",
                "--conf",
                "spark.driver.host=127.0.0.1",
                "--conf",
                "spark.driver.bindAddress=127.0.0.1",
                *bigdl_submit_options(),
            ],
            ["--input", str(images), "--output", str(tmp_path / "out"), "--partitions", "2"],
            tmp_path,
        )
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
        assert "done 3, failed 0" in done.stdout
        apps = cluster.master_state()["completedapps"]
        assert [app["name"] for app in apps] == ["sparkseg-infer-yolact"]  # no --name: the job's, not the script's
        app = apps[0]
    assert_same_detections(detections_by_name(tmp_path / "out"), expected)
    # both workers ran an executor of the app (each writes its stderr under <worker work dir>/<app id>/<n>/)
    for worker in ("worker-0", "worker-1"):
        assert list((tmp_path / "cluster" / "work" / worker / app["id"]).glob("*/stderr")), worker
