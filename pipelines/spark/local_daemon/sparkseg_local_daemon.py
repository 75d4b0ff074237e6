"""The Python worker daemon of a local-mode session that sparkseg starts (spark_session.local_daemon_settings).

Spark starts its Python workers with `python -m <spark.python.daemon.module>` and puts $SPARK_HOME/python/lib/
pyspark.zip first on their path. That zip holds no bytecode, so the daemon compiled pyspark's modules from source
at every session's first Python task. In local mode the workers run the driver's
interpreter, whose pip-installed pyspark is the same release as that zip, with bytecode: this daemon puts the zips
behind the installed packages, imports what every sparkseg task needs (pandas, pyarrow) once, before it forks the
workers, then runs Spark's own daemon.

It also loads the compiled pixel loops (pipelines.ops.compiled_loops: numba's start-up and the machine code, paid
per process) once for all workers, but only when the interpreter's own `pipelines` is the driver's (the directory in
SPARKSEG_LIBRARY_DIR, set by spark_session.local_daemon_settings): the workers then use those files, the same the
driver runs, and not the copy in the library archive the job ships (spark_session.ship_library), which numba cannot
cache (it compiles from a zip in every process). Otherwise the workers import `pipelines` from that archive.

This directory is put on the workers' PYTHONPATH (spark.executorEnv.PYTHONPATH) only for local masters: it is a
top-level module, not part of the `pipelines` package.
"""

import importlib.util
import os
import sys

# Spark's own zips (pyspark.zip, py4j-<version>-src.zip) go last; any other path entry keeps its place
sparks = [
    entry
    for entry in sys.path
    if os.path.basename(entry) == "pyspark.zip"
    or (os.path.basename(entry).startswith("py4j-") and entry.endswith("-src.zip"))
]
sys.path[:] = [entry for entry in sys.path if entry not in sparks] + sparks

try:
    import pandas  # noqa: F401  (forked workers inherit the imported modules)
    import pyarrow  # noqa: F401
except ImportError:  # the task reports it with its own traceback
    pass


def _load_compiled_loops() -> None:
    """Import and load pipelines.ops.compiled_loops if this interpreter's `pipelines` is the driver's."""
    driver_library = os.environ.get("SPARKSEG_LIBRARY_DIR")
    spec = importlib.util.find_spec("pipelines") if driver_library else None
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    if [os.path.realpath(location) for location in locations] == [os.path.realpath(driver_library)]:
        from pipelines.ops import compiled_loops

        compiled_loops.load()


try:
    _load_compiled_loops()
except Exception:  # noqa: BLE001  (an optimization: the workers import and compile for themselves)
    pass

from pyspark import daemon  # noqa: E402

if __name__ == "__main__":
    daemon.manager()
