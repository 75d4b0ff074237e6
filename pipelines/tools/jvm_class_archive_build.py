"""Build this env's class-data-sharing archive of the Spark driver JVM (pipelines.spark.jvm_class_archive names it).

python -m pipelines.tools.jvm_class_archive_build [--if-missing]   # make demo, test, bench* run it
python -m pipelines.tools.jvm_class_archive_build --path           # print where the archive is (built or not)
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path

from pipelines.inference import inference_job
from pipelines.job_config import load_config
from pipelines.spark.jvm_class_archive import archive_path, built_archive
from pipelines.spark.session_kind import classic_gateway
from pipelines.spark.spark_session import local_session


def build(timeout_s: float = 600) -> Path:
    """Run the bundled model over samples/images in a JVM that dumps the classes it loaded at exit, then move the
    archive into place (atomic: a job starting meanwhile sees the whole archive or none). Returns its path."""
    target = archive_path()
    if target is None:
        raise RuntimeError("no java found (JAVA_HOME or PATH): install a JDK 17 first")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sparkseg-cds-") as work, staged_in(work):
        dump = Path(work) / "classes.jsa"
        spark = local_session(
            "sparkseg-class-archive",
            "local[2]",
            {"spark.driver.extraJavaOptions": f"-XX:ArchiveClassesAtExit={dump} -Xlog:cds=off -Xlog:cds+dynamic=off"},
            log_level="ERROR",
        )
        gateway = classic_gateway(spark, "the class archive")
        config = load_config(None)
        config["output"]["uri"] = str(Path(work) / "output")
        config["output"]["overlays"] = False
        inference_job.run(spark, config, "yolact")
        spark.stop()
        gateway.shutdown()
        gateway.proc.stdin.close()  # the JVM exits when its stdin closes, and writes the archive on the way out
        gateway.proc.wait(timeout=timeout_s)
        if not dump.is_file() or dump.stat().st_size == 0:
            raise RuntimeError(f"the JVM wrote no class archive to {dump} (exit status {gateway.proc.returncode})")
        staged = target.with_suffix(f".{os.getpid()}.tmp")
        shutil.copyfile(dump, staged)
        os.replace(staged, target)
    return target


@contextlib.contextmanager
def staged_in(directory: str):
    """For the block, Python's temp files go under `directory`: the build's job stages the model and the library
    there (inference_job.ship_model, spark_session.staged_library_archive), removed with it,
    instead of leaving copies in the machine's temp directory that no later job of another env would reuse."""
    previous = tempfile.tempdir
    tempfile.tempdir = directory
    try:
        yield
    finally:
        tempfile.tempdir = previous


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--if-missing", action="store_true", help="nothing to do when the archive exists")
    parser.add_argument("--path", action="store_true", help="only print where the archive is")
    parser.add_argument("--quiet", action="store_true", help="print nothing when there is nothing to build (make)")
    args = parser.parse_args(argv)
    path = archive_path()
    if args.quiet and args.if_missing and not args.path and built_archive():
        return 0
    if not args.path and not (args.if_missing and built_archive()):
        print(
            "sparkseg: building the Spark driver JVM's class archive (once per env, ~1 min): a job over the "
            "bundled images",
            flush=True,
        )
        path = build()
    print(path if path is not None else "no java found")
    return 0


if __name__ == "__main__":
    sys.exit(main())
