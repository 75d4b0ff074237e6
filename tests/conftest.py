"""Shared fixtures: one session-scoped local SparkSession, Azurite, a Spark Connect server and a 2-worker standalone
cluster (each started only when a test asks for it), paths to the bundled samples."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "samples"

# Python workers must run this interpreter (the venv), not whatever `python3` is on PATH.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# pytest-xdist's workers prepend the checkout to PYTHONPATH: the processes a test starts must see the environment of
# a plain `pytest` run (a job run "from another directory" must not import the checkout through it).
if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("PYTHONPATH", "").startswith(os.getcwd()):
    rest = os.environ["PYTHONPATH"][len(os.getcwd()) :].removeprefix(os.pathsep)
    if rest:
        os.environ["PYTHONPATH"] = rest
    else:
        del os.environ["PYTHONPATH"]

from tests.fixtures_azurite import azurite  # noqa: E402,F401  (session fixture)
from tests.fixtures_evaluation import bundled_val_run  # noqa: E402,F401  (session fixture)
from tests.fixtures_standalone import standalone_cluster  # noqa: E402,F401  (session fixture)


@pytest.fixture(scope="session")
def spark():
    from pipelines.spark.spark_session import local_session

    session = local_session(app_name="sparkseg-tests", master="local[2,4]")
    yield session
    session.stop()


@pytest.fixture(scope="module")
def connect_server(tmp_path_factory):
    """A Spark Connect server of this env's pyspark, its workers on this env's Python, for the module: the main
    suite runs the job's command line against it (test_connect_session.py), the Databricks suite the notebook, as on
    serverless or standard access mode (test_deploy_notebooks.py)."""
    from pipelines.tools.connect_server import running_connect_server

    with running_connect_server(tmp_path_factory.mktemp("connect-server")) as remote:
        yield remote


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


# The longest test files (minutes each on 2 cores: clusters, packed envs, killed runs, compiles), longest first as
# measured in a `make test` run (session 52): with `-n 2 --dist loadfile --no-loadscope-reorder` (make test-main) the
# workers take files in this order, and the short files fill in at the end, where a long file started last would run
# alone. (Without --no-loadscope-reorder, pytest-xdist >= 3.8 orders files by their number of tests instead.)
LONG_FILES_FIRST = (
    "test_faults.py",
    "test_training_fused.py",
    "test_job_cli.py",
    "test_deploy_archive.py",
    "test_training_resume.py",
    "test_video_input.py",
    "test_sweep.py",
    "test_incremental.py",
    "test_export_yolact.py",
    "test_training_strategies.py",
    "test_table_index.py",
    "test_export_int8.py",
    "test_standalone_cluster.py",
    "test_installed_package.py",
    "test_infer_job.py",
    "test_detector_training.py",
    "test_detector_export.py",
    "test_box_local_masks.py",
)


# Marked `slow`, so left out of `make test-fast` (the loop to run while editing, at most 3 minutes on 2 cores): the
# long files above, the BigDL suite's, and those that need Azurite or a browser, run whole jobs, trainings or packed
# envs in subprocesses, or compile every kernel from nothing (each took half a minute or more of a test-fast
# candidate run). Every other file, a new one included, is in the fast loop: add a file here only with its reason.
SLOW_FILES = frozenset(
    LONG_FILES_FIRST
    + (
        "test_bigdl_engine.py",  # the BigDL env
        "test_bigdl_job.py",
        "test_render_browser.py",  # Chromium
        "test_azure_storage.py",  # Azurite, and credentials through a Spark job
        "test_infer_azure.py",
        "test_done_index.py",
        "test_deploy_notebooks.py",
        "test_input_names.py",  # whole jobs
        "test_model_registry.py",  # whole jobs, and a sqlite MLflow store created
        "test_job_planning.py",
        "test_detector_job.py",
        "test_job_output.py",
        "test_render.py",
        "test_evaluate.py",
        "test_detector_default_model.py",
        "test_training_loader.py",  # training input workers and steps in subprocesses
        "test_training_data.py",
        "test_training_augment_speed_equal.py",
        "test_compiled_loops_zip.py",  # compiles every kernel twice, from a zip
        "test_connect_stream.py",  # streams from the client env on a Spark Connect server, one killed
    )
)


def pytest_collection_modifyitems(config, items):
    rank = {name: index for index, name in enumerate(LONG_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
    for item in items:
        if item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
