"""Shared fixtures: one session-scoped local SparkSession, paths to the bundled samples."""
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


@pytest.fixture(scope="session")
def spark():
    from pipelines.spark_session import local_session

    session = local_session(app_name="sparkseg-tests", master="local[2]")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
