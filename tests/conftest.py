"""Shared fixtures: one session-scoped local SparkSession, Azurite and a 2-worker standalone cluster (both started
only when a test asks for them), paths to the bundled samples."""
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

from tests.fixtures_azurite import azurite  # noqa: E402,F401  (session fixture)
from tests.fixtures_standalone import standalone_cluster  # noqa: E402,F401  (session fixture)
from tests.fixtures_evaluation import bundled_val_run  # noqa: E402,F401  (session fixture)


@pytest.fixture(scope="session")
def spark():
    from pipelines.spark_session import local_session

    session = local_session(app_name="sparkseg-tests", master="local[2,4]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
