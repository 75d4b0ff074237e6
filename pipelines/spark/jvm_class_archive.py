"""A class-data-sharing (CDS) archive of the Spark driver JVM: the classes a job loads, stored once, mapped at start-up.

Without it a plain `python jobs/infer_yolact.py` spends most of the JVM's start and of its first Spark job loading
and verifying the classes of Spark, Hadoop, Parquet and Arrow. With the archive those are mapped from one file
(`make bench-startup` measures the difference: reports/startup.md).

    python -m pipelines.tools.jvm_class_archive_build    # what `make demo` and `make test` run once per env
    python -m pipelines.tools.jvm_class_archive_build --path     # the archive of this Python env's pyspark and java

This module only names the archive (spark_session imports it for every session); jvm_class_archive_build builds it.

The archive belongs to one java binary and one pyspark (its jars are the class path): its name is a hash of both, so
an upgrade of either makes the job start without it (never with a stale one) until it is built again. Only a JVM this
process starts uses it (plain `python`, local mode, notebooks); under spark-submit pass
`--driver-java-options -XX:SharedArchiveFile=<path>` yourself.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

ARCHIVE_DIR = Path(sys.prefix) / "share" / "sparkseg"  # inside the venv: one archive per environment
# C1 only: for JVMs whose own work is short (a local job's driver, a test cluster's daemons), where C2's compiler
# threads would compete with the job for a small machine's cores
QUICK_START_JIT = "-XX:TieredStopAtLevel=1"


def java_binary() -> Path | None:
    """The java that pyspark's launcher (bin/spark-class) runs: $JAVA_HOME/bin/java, else java on PATH."""
    home = os.environ.get("JAVA_HOME")
    found = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).is_file() else None


def archive_path() -> Path | None:
    """Where this env's archive is (whether built or not), named by the java binary and pyspark's jars; None when
    no java is found (the job then fails on its own, with Spark's message)."""
    java = java_binary()
    if java is None:
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    key = hashlib.sha256()
    for part in (
        str(java),
        str(java.stat().st_size),
        str(java.stat().st_mtime_ns),
        pyspark.__version__,
        *sorted(p.name for p in jars.glob("*.jar")),
    ):
        key.update(part.encode() + b"\0")
    return ARCHIVE_DIR / f"spark-driver-{key.hexdigest()[:16]}.jsa"


def built_archive() -> Path | None:
    """This env's archive when it is built for this java and pyspark, else None."""
    path = archive_path()
    return path if path is not None and path.is_file() else None


def driver_java_options() -> str:
    """The JVM flag that maps the archive, or "" when it is not built for this java and pyspark."""
    path = built_archive()
    if path is None:
        return ""
    # a JVM whose class path differs (e.g. spark.driver.extraClassPath) starts without it, silently
    return f"-XX:SharedArchiveFile={path} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"
