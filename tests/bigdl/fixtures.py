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
    from pipelines.engines.bigdl_engine import bigdl_python_env

    session = bigdl_python_env(master="local[2]", app_name="sparkseg-bigdl-tests", log_path=str(bigdl_log))
    yield session
    session.stop()


@pytest.fixture(scope="session")
def tiny_ir(tmp_path_factory):
    from tests.bigdl.tiny_ir import build_tiny_ir

    return build_tiny_ir(tmp_path_factory.mktemp("tiny-ir"))


@pytest.fixture(scope="session")
def yolact_ir(tmp_path_factory):
    """A real YOLACT IR (yolact_r18_small, random weights, 352x352), exported by the main venv: the export needs
    torch, which the BigDL env does not have. `make test` builds the main venv first; elsewhere point
    SPARKSEG_MAIN_PYTHON at an interpreter with sparkseg's export extra."""
    import os
    import subprocess
    from pathlib import Path

    repo = Path(__file__).resolve().parents[2]
    main_python = Path(os.environ.get("SPARKSEG_MAIN_PYTHON", repo / ".venv" / "bin" / "python"))
    if not main_python.exists():
        pytest.fail(
            f"the YOLACT export needs the main venv ({main_python} not found): run `make test-main` "
            "first, or set SPARKSEG_MAIN_PYTHON to a Python with sparkseg[export]"
        )
    out = tmp_path_factory.mktemp("yolact-ir") / "yolact_r18_small"
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONHOME", "PYSPARK_PYTHON")}
    done = subprocess.run(
        [
            str(main_python),
            "-m",
            "model_export",
            "yolact",
            "--config",
            "yolact_r18_small",
            "--random-init",
            "--parity-count",
            "1",
            "--out",
            str(out),
        ],
        cwd=repo,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        pytest.fail(f"python -m model_export yolact failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return out
