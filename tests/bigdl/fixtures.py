"""Fixtures for the bigdl engine's tests in .venv-bigdl: a BigDL-ready local[2] session and the tiny IR.

tests/conftest.py's `spark` fixture builds a pyspark 4 session without BigDL's jars; BigDL needs its jars on the
classpath when the JVM starts, so these tests use `bigdl_spark` instead (never both in one run: `-m bigdl`).
"""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def bigdl_log(tmp_path_factory):
    """Where BigDL writes its Spark INFO log during the tests."""
    return tmp_path_factory.mktemp("bigdl-log") / "bigdl.log"


@pytest.fixture(scope="session")
def bigdl_spark(bigdl_log):
    from pipelines.bigdl_engine import bigdl_python_env

    session = bigdl_python_env(master="local[2]", app_name="sparkseg-bigdl-tests", log_path=str(bigdl_log))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tiny_ir(tmp_path_factory):
    from tests.bigdl.tiny_ir import build_tiny_ir

    return build_tiny_ir(tmp_path_factory.mktemp("tiny-ir"))
