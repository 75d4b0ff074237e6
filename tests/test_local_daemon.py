"""The Python worker daemon of local-mode sessions (spark_session.local_daemon_settings, sparkseg_local_daemon):
pyspark from the installed package, only where the workers run this interpreter and its pip-installed pyspark."""

from __future__ import annotations

import sys
from pathlib import Path

import pipelines
from pipelines.spark.spark_session import (
    LIBRARY_DIR_VARIABLE,
    LOCAL_DAEMON_DIR,
    LOCAL_DAEMON_MODULE,
    local_daemon_settings,
)


def worker_facts(_):
    import sys as worker_sys

    import pyspark

    yield pyspark.__file__, "pandas" in worker_sys.modules


def test_local_workers_import_the_installed_pyspark_with_pandas_loaded(spark):
    """The session fixture is built like a job's (local_session, local master): its workers import pyspark from the
    interpreter's installed package (bytecode), not from Spark's pyspark.zip (sources), and find pandas imported
    by the daemon before any task asked for it (an RDD task of plain Python does not import it)."""
    import pyspark

    facts = spark.sparkContext.parallelize([0, 1], 2).mapPartitions(worker_facts).collect()
    assert facts == [(pyspark.__file__, True)] * 2, facts


def compiled_loops_facts(_):
    import sys as worker_sys

    module = worker_sys.modules.get("pipelines.ops.compiled_loops")  # looked up before anything imports it here
    yield None if module is None else module.__file__, module is not None and len(module.resample.signatures) > 0


def test_local_workers_find_the_compiled_loops_loaded_from_the_drivers_library(spark):
    """The daemon imported pipelines.ops.compiled_loops from the driver's own files (not the shipped zip, which
    numba cannot cache) and loaded its machine code before forking the workers."""
    from pipelines.ops import compiled_loops

    facts = spark.sparkContext.parallelize([0, 1], 2).mapPartitions(compiled_loops_facts).collect()
    assert facts == [(compiled_loops.__file__, True)] * 2, facts


def roles_seen_by_the_sampler(_):
    import psutil

    from pipelines.sweeps.process_memory import process_role

    worker = psutil.Process()
    yield process_role(worker, set()), process_role(worker.parent(), set())


def test_the_sweeps_memory_sampler_tells_the_local_daemons_workers_from_the_daemon(spark):
    """pipelines.sweeps.process_memory counts a process forked by sparkseg_local_daemon as a Python worker (its
    parent is the daemon) and the daemon itself as the daemon, as it does for Spark's pyspark.daemon."""
    roles = spark.sparkContext.parallelize([0], 1).mapPartitions(roles_seen_by_the_sampler).collect()
    assert roles == [("python_worker", "python_daemon")]


def test_local_masters_get_the_daemon_and_keep_the_callers_pythonpath(monkeypatch):
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    settings = local_daemon_settings({"spark.executorEnv.PYTHONPATH": "/opt/extra"}, "local[2]")
    assert settings["spark.python.daemon.module"] == LOCAL_DAEMON_MODULE
    assert settings["spark.executorEnv.PYTHONPATH"].split(":") == ["/opt/extra", str(LOCAL_DAEMON_DIR)]
    assert settings[f"spark.executorEnv.{LIBRARY_DIR_VARIABLE}"] == str(Path(pipelines.__file__).resolve().parent)


def test_clusters_other_interpreters_and_the_callers_own_daemon_keep_sparks(monkeypatch, tmp_path):
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.delenv("SPARK_HOME", raising=False)
    assert local_daemon_settings({}, "spark://127.0.0.1:7077") == {}
    assert local_daemon_settings({}, "yarn") == {}
    own = {"spark.python.daemon.module": "my_daemon"}
    assert local_daemon_settings(own, "local[*]") == own
    monkeypatch.setenv("SPARK_HOME", str(tmp_path))  # another Spark's pyspark.zip may not match this pyspark
    assert local_daemon_settings({}, "local[*]") == {}
    monkeypatch.delenv("SPARK_HOME")
    monkeypatch.setenv("PYSPARK_PYTHON", "/usr/bin/python3")  # workers on another interpreter
    assert local_daemon_settings({}, "local[*]") == {}
