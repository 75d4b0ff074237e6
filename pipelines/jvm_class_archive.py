"""A class-data-sharing (CDS) archive of the Spark driver JVM: the classes a job loads, stored once, mapped at start-up.

On a 2-core machine a plain `python jobs/infer_yolact.py` spent ~8 s starting the JVM and ~4 s in its first Spark job,
most of it loading and verifying ~15,000 classes (Spark, Hadoop, Parquet, Arrow). With the archive those are mapped
from one file (reports/startup.md: `make bench-startup`).

    python -m pipelines.jvm_class_archive build     # what `make demo` and `make test` run once per environment
    python -m pipelines.jvm_class_archive path      # the archive of this Python env's pyspark and java

The archive belongs to one java binary and one pyspark (its jars are the class path): its name is a hash of both, so
an upgrade of either makes the job start without it (never with a stale one) until it is built again. Only a JVM this
process starts uses it (plain `python`, local mode, notebooks); under spark-submit pass
`--driver-java-options -XX:SharedArchiveFile=<path>` yourself.
"""
from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

ARCHIVE_DIR = Path(sys.prefix) / "share" / "sparkseg"   # inside the venv: one archive per environment


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
    for part in (str(java), str(java.stat().st_size), str(java.stat().st_mtime_ns), pyspark.__version__,
                 *sorted(p.name for p in jars.glob("*.jar"))):
        key.update(part.encode() + b"\0")
    return ARCHIVE_DIR / f"spark-driver-{key.hexdigest()[:16]}.jsa"


def driver_java_options() -> str:
    """The JVM flag that maps the archive, or "" when it is not built for this java and pyspark."""
    path = archive_path()
    if path is None or not path.is_file():
        return ""
    # a JVM whose class path differs (e.g. spark.driver.extraClassPath) starts without it, silently
    return f"-XX:SharedArchiveFile={path} -Xshare:auto -Xlog:cds=off -Xlog:cds+dynamic=off"


def build(timeout_s: float = 600) -> Path:
    """Run the bundled model over samples/images in a JVM that dumps the classes it loaded at exit, then move the
    archive into place (atomic: a job starting meanwhile sees the whole archive or none). Returns its path."""
    from pipelines import inference_job
    from pipelines.job_config import load_config
    from pipelines.spark_session import local_session

    target = archive_path()
    if target is None:
        raise RuntimeError("no java found (JAVA_HOME or PATH): install a JDK 17 first")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sparkseg-cds-") as work:
        dump = Path(work) / "classes.jsa"
        spark = local_session("sparkseg-class-archive", "local[2]",
                              {"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={dump} -Xlog:cds=off"
                                                                " -Xlog:cds+dynamic=off"}, log_level="ERROR")
        gateway = spark.sparkContext._gateway
        config = load_config(None)
        config["output"]["uri"] = str(Path(work) / "output")
        config["output"]["overlays"] = False
        inference_job.run(spark, config, "yolact")
        spark.stop()
        gateway.shutdown()
        gateway.proc.stdin.close()    # the JVM exits when its stdin closes, and writes the archive on the way out
        gateway.proc.wait(timeout=timeout_s)
        if not dump.is_file() or dump.stat().st_size == 0:
            raise RuntimeError(f"the JVM wrote no class archive to {dump} (exit status {gateway.proc.returncode})")
        staged = target.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(dump, staged)
        os.replace(staged, target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("action", choices=["build", "path"])
    parser.add_argument("--if-missing", action="store_true", help="build: nothing to do when the archive exists")
    args = parser.parse_args(argv)
    path = archive_path()
    if args.action == "build" and not (args.if_missing and path is not None and path.is_file()):
        path = build()
    print(path if path is not None else "no java found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
