"""The Python worker daemon of a local-mode session that sparkseg starts (spark_session.local_daemon_settings).

Spark starts its Python workers with `python -m <spark.python.daemon.module>` and puts $SPARK_HOME/python/lib/
pyspark.zip first on their path. That zip holds no bytecode, so the daemon compiled pyspark's modules from source
at every session's first Python task (~1 s of CPU on a 2-core machine). In local mode the workers run the driver's
interpreter, whose pip-installed pyspark is the same release as that zip, with bytecode: this daemon puts the zips
behind the installed packages, imports what every sparkseg task needs (pandas, pyarrow) once, before it forks the
workers, then runs Spark's own daemon.

This directory is put on the workers' PYTHONPATH (spark.executorEnv.PYTHONPATH) only for local masters: it is a
top-level module, not part of the `pipelines` package, so that the workers still import `pipelines` from the
library archive the job ships (spark_session.ship_library).
"""
import os
import sys

# Spark's own zips (pyspark.zip, py4j-<version>-src.zip) go last; any other path entry keeps its place
sparks = [entry for entry in sys.path if os.path.basename(entry) == "pyspark.zip"
          or (os.path.basename(entry).startswith("py4j-") and entry.endswith("-src.zip"))]
sys.path[:] = [entry for entry in sys.path if entry not in sparks] + sparks

try:
    import pandas  # noqa: F401  (forked workers inherit the imported modules)
    import pyarrow  # noqa: F401
except ImportError:   # the task reports it with its own traceback
    pass

from pyspark import daemon  # noqa: E402

if __name__ == "__main__":
    daemon.manager()
