"""Cluster packaging: scripts/build_env_archive.sh (`make env-archive`) packs a relocatable env, and the inference job
runs on a standalone cluster with `spark-submit --archives dist/sparkseg-env.tar.gz#environment`, its executors'
Python workers running the packed interpreter (./environment/bin/python), not the development venv."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from pipelines.sweeps.standalone_cluster import spark_home
from tests.conftest import REPO, SAMPLES
from tests.test_incremental import write_image

pytestmark = pytest.mark.cluster

BUILD_SCRIPT = REPO / "scripts" / "build_env_archive.sh"
ARCHIVE = REPO / "dist" / "sparkseg-env.tar.gz"
MODEL_DIR = SAMPLES / "models" / "yolact_default"
SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"

# The driver, run by the packed env's own Python (no checkout on sys.path, as a YARN cluster-mode driver in its
# container): probe the executors' Python workers (a pandas UDF, as the warm-up and video scan use) and the driver
# itself, then run the installed package's job CLI in the same application.
PROBE_THEN_JOB = r"""
import json, os, sys
from pyspark.sql import SparkSession


def probe(batches):
    import numpy, openvino, pandas, pyarrow, pipelines
    for batch in batches:
        info = {"executable": sys.executable, "prefix": sys.prefix, "cwd": os.getcwd(), "path": sys.path,
                "modules": {m.__name__: m.__file__ for m in (numpy, openvino, pandas, pyarrow, pipelines)}}
        yield pandas.DataFrame({"info": [json.dumps(info)] * len(batch)})


spark = SparkSession.builder.getOrCreate()
rows = spark.range(0, 4, numPartitions=2).mapInPandas(probe, "info string").collect()
print("PROBE " + json.dumps([json.loads(row.info) for row in rows]), flush=True)
import pipelines.job_cli, pipelines.job_config
print("DRIVER " + json.dumps({"prefix": sys.prefix, "job_cli": pipelines.job_cli.__file__,
                              "config": str(pipelines.job_config.default_config_path())}), flush=True)
sys.exit(pipelines.job_cli.main(sys.argv[1:], family="yolact"))
"""


def build_archive(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run the build script with this interpreter's base Python (the cluster's Python must match the driver's)."""
    env = {**os.environ, "PYTHON": sys._base_executable, "PACKER_PYTHON": sys.executable, **(env or {})}
    done = subprocess.run(["bash", str(BUILD_SCRIPT), *args], env=env, capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"build_env_archive failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def env_archive() -> Path:
    """dist/sparkseg-env.tar.gz, as `make env-archive` makes it (rebuilt only when its inputs changed)."""
    build_archive()
    assert ARCHIVE.is_file()
    return ARCHIVE


def test_archive_holds_the_package_and_inference_deps_but_not_torch_or_pyspark(env_archive):
    with tarfile.open(env_archive) as archive:
        names = set(archive.getnames())
        python = archive.getmember("bin/python")
    assert python.issym() or python.isfile()
    for module in (
        "pipelines/inference/inference_job.py",
        "pipelines/io/run_lock.py",
        "openvino/__init__.py",
        "numpy/__init__.py",
        "pyarrow/__init__.py",
        "pandas/__init__.py",
        "PIL/__init__.py",
        "pycocotools/mask.py",
        "azure/storage/blob/__init__.py",
    ):
        assert f"{SITE}/{module}" in names, f"{module} missing from the archive"
    for absent in ("torch/", "torchvision/", "pyspark/", "py4j/", "onnx/"):
        assert not any(name.startswith(f"{SITE}/{absent}") for name in names), f"{absent} must not be packed"
    # the bytecode of what executors import (written by the build's smoke test), not of whole packages
    tag = sys.implementation.cache_tag
    for module in ("numpy/__pycache__/__init__", "openvino/__pycache__/__init__", "pandas/__pycache__/__init__"):
        assert f"{SITE}/{module}.{tag}.pyc" in names, f"{module}.{tag}.pyc missing from the archive"
    assert f"{SITE}/pandas/tests/__init__.py" in names and not [
        name for name in names if name.startswith(f"{SITE}/pandas/tests/") and name.endswith(".pyc")
    ]


def test_job_runs_on_a_standalone_cluster_with_the_packed_interpreter(env_archive, standalone_cluster, tmp_path):
    cluster = standalone_cluster
    images, output = tmp_path / "images", tmp_path / "out"
    for seed in range(3):
        write_image(images / f"img{seed}.jpg", seed)
    driver = tmp_path / "probe_then_job.py"
    driver.write_text(PROBE_THEN_JOB)
    driver_env = tmp_path / "driver-env"  # the driver's copy of the env, as YARN unpacks it
    driver_env.mkdir()
    with tarfile.open(env_archive) as archive:
        archive.extractall(driver_env, filter="fully_trusted")
    command = [
        str(spark_home() / "bin" / "spark-submit"),
        "--master",
        cluster.master_url,
        "--archives",
        f"{env_archive}#environment",
        "--conf",
        "spark.driver.host=127.0.0.1",
        "--conf",
        "spark.driver.bindAddress=127.0.0.1",
        "--conf",
        "spark.executor.memory=512m",
        "--conf",
        "spark.executor.cores=1",
        "--conf",
        "spark.cores.max=2",
        "--conf",
        "spark.ui.enabled=false",
        "--conf",
        "spark.scheduler.minRegisteredResourcesRatio=1.0",
        str(driver),
        "--input",
        str(images),
        "--output",
        str(output),
        "--model",
        str(MODEL_DIR),
        "--precision",
        "f32",
        "--partitions",
        "2",
    ]
    # Spark's documented recipe: workers run the unpacked archive, the client-mode driver its local Python.
    env = {
        **os.environ,
        "PYSPARK_PYTHON": "./environment/bin/python",
        "PYSPARK_DRIVER_PYTHON": str(driver_env / "bin" / "python"),
        "SPARK_LOCAL_IP": "127.0.0.1",
    }
    env.pop("PYTHONPATH", None)
    done = subprocess.run(command, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, f"spark-submit failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"

    probes = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("PROBE "))[6:])
    assert len(probes) == 4
    work_dirs = [cluster.worker_dir(index).resolve() for index in range(cluster.config.workers)]
    dev_prefix = Path(sys.prefix).resolve()
    for probe in probes:
        prefix = Path(probe["prefix"]).resolve()
        assert probe["executable"].endswith("/environment/bin/python"), probe["executable"]
        assert prefix.name == "environment" and prefix.parent == Path(probe["cwd"]).resolve()
        assert any(prefix.is_relative_to(work_dir) for work_dir in work_dirs), f"{prefix} is in no worker dir"
        assert prefix != dev_prefix
        for name, module_file in probe["modules"].items():
            assert Path(module_file).resolve().is_relative_to(prefix), f"{name} came from {module_file}"
        site_dirs = [entry for entry in probe["path"] if entry.endswith("site-packages")]
        assert site_dirs and all(Path(entry).resolve().is_relative_to(prefix) for entry in site_dirs), site_dirs

    driver_probe = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("DRIVER "))[7:])
    assert Path(driver_probe["prefix"]).resolve() == driver_env.resolve()
    for key in ("job_cli", "config"):  # the package and its default config come from the packed env
        assert Path(driver_probe[key]).resolve().is_relative_to(driver_env.resolve()), driver_probe
    assert "done 3, failed 0" in done.stdout, done.stdout[-3000:]
    summary = json.loads((output / "summary.json").read_text())
    assert summary["counts"]["done"] == 3 and summary["table"]["images"] == 3


def test_an_existing_venv_is_packed_with_this_checkouts_package_instead_of_its_editable_install(tmp_path):
    """What `make bigdl-env-archive` does to .venv-bigdl, on a tiny venv with an editable sparkseg (pip's layout)."""
    venv = tmp_path / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    site = venv / SITE
    (site / "__editable__.sparkseg-0.1.0.pth").write_text(
        "import __editable___sparkseg_0_1_0_finder; __editable___sparkseg_0_1_0_finder.install()\n"
    )
    (site / "__editable___sparkseg_0_1_0_finder.py").write_text(
        f"import sys\n\ndef install():\n    sys.path.append({str(REPO)!r})\n"
    )
    output = tmp_path / "dist" / "tiny-env.tar.gz"
    build_archive("--from-venv", str(venv), "--output", str(output), env={"SMOKE_IMPORTS": "pipelines"})
    assert output.is_file() and (output.parent / "tiny-env.tar.gz.inputs").is_file()
    again = build_archive("--from-venv", str(venv), "--output", str(output), env={"SMOKE_IMPORTS": "pipelines"})
    assert "up to date" in again.stdout

    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    with tarfile.open(output) as archive:
        assert not [name for name in archive.getnames() if "__editable__" in name]
        archive.extractall(unpacked, filter="fully_trusted")
    clean_env = {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [str(unpacked / "bin" / "python"), "-c", "import pipelines.io.run_lock as m; print(m.__file__)"],
        env=clean_env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()).resolve().is_relative_to(unpacked.resolve())
