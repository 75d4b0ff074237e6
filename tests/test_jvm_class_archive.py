"""The driver JVM's class-data-sharing archive (pipelines.spark.jvm_class_archive): built once per env, mapped by
every JVM
a job starts, never used when it belongs to another java or pyspark."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A JVM started the way every job starts it (spark_session.local_session); what its process has mapped.
MAPPED_BY_A_JOB_JVM = """
import json, sys
from pathlib import Path
from pipelines.spark.spark_session import local_session
spark = local_session("archive-check", "local[1]")
pid = spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid()
maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
spark.stop()
print(json.dumps(sorted({line.split()[-1] for line in maps if len(line.split()) >= 6})))
"""


def test_a_jvm_the_job_starts_maps_this_envs_class_archive():
    build = subprocess.run(
        [sys.executable, "-m", "pipelines.tools.jvm_class_archive_build", "--if-missing"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert build.returncode == 0, build.stderr[-3000:]
    archive = build.stdout.strip().splitlines()[-1]
    assert Path(archive).is_file() and archive.endswith(".jsa")
    run = subprocess.run(
        [sys.executable, "-c", MAPPED_BY_A_JOB_JVM], cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stderr[-3000:]
    assert archive in json.loads(run.stdout.strip().splitlines()[-1])


def test_an_archive_of_another_java_is_never_used(tmp_path, monkeypatch):
    """The archive's name hashes the java binary (and pyspark's jars): another JDK finds no archive and the JVM starts
    with its defaults, instead of being handed a stale archive."""
    from pipelines.spark import jvm_class_archive

    real_java = jvm_class_archive.java_binary()
    assert real_java is not None
    other_home = tmp_path / "other-jdk"
    (other_home / "bin").mkdir(parents=True)
    shutil.copy(real_java, other_home / "bin" / "java")
    os.utime(other_home / "bin" / "java", (1_000_000_000, 1_000_000_000))
    ours = jvm_class_archive.archive_path()
    monkeypatch.setenv("JAVA_HOME", str(other_home))
    theirs = jvm_class_archive.archive_path()
    assert theirs is not None and theirs != ours and theirs.parent == ours.parent
    assert not theirs.exists()
    assert jvm_class_archive.driver_java_options() == ""


def test_callers_own_cds_and_jit_flags_win():
    from pipelines.spark.jvm_class_archive import QUICK_START_JIT
    from pipelines.spark.spark_session import quick_start_options

    conf = {"spark.driver.extraJavaOptions": "-Xshare:off -XX:+TieredCompilation"}
    assert quick_start_options(conf) == conf
    assert QUICK_START_JIT in quick_start_options({})["spark.driver.extraJavaOptions"]
