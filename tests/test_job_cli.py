"""The job's command line as users meet it: bad arguments fail in plain Python with exit 2 and a message naming the
argument and the fix, before any JVM starts and without leaving anything behind; the README's spark-submit line
works as written; the export stage says which extra to install when torch is missing."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

from pipelines.spark.spark_session import warn_unknown_spark_settings
from tests.conftest import REPO, SAMPLES
from tests.job_helpers import spark_submit_command

# The job CLI in a fresh process, then whether that process ever started a JVM (py4j gateway).
CLI_THEN_JVM_PROBE = (
    "import sys; from pipelines import job_cli; code = job_cli.main(sys.argv[1:]); "
    "from pyspark import SparkContext; print('JVM started:', SparkContext._gateway is not None); "
    "sys.exit(code)"
)


def run_cli(*args: str, cwd: Path = REPO) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CLI_THEN_JVM_PROBE, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )


def one_image(tmp_path: Path) -> Path:
    images = tmp_path / "images"
    images.mkdir()
    shutil.copy(SAMPLES / "images" / "synthetic_road_1.jpg", images / "road.jpg")
    return images


def assert_refused_before_spark(done: subprocess.CompletedProcess, message: str) -> None:
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    assert "JVM started: False" in done.stdout


def test_output_naming_an_existing_file_is_refused(tmp_path):
    (tmp_path / "out.txt").write_text("a file")
    done = run_cli("--input", str(one_image(tmp_path)), "--output", str(tmp_path / "out.txt"))
    assert_refused_before_spark(done, "--output names an existing file; give a directory")


def test_an_output_that_cannot_be_created_is_one_line(tmp_path):
    (tmp_path / "notes.txt").write_text("a file")
    done = run_cli("--input", str(one_image(tmp_path)), "--output", str(tmp_path / "notes.txt" / "out"))
    assert_refused_before_spark(done, f"--output cannot be created: {tmp_path / 'notes.txt'} is a file")
    done = run_cli("--input", str(tmp_path / "images"), "--output", "/proc/sparkseg-out")  # procfs makes no dirs
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "error: /proc/sparkseg-out: cannot create the output directory" in done.stderr


def test_a_setting_that_keeps_spark_from_starting_is_one_line_after_the_jvms_reason(tmp_path):
    done = run_cli(
        "--input", str(one_image(tmp_path)), "--output", str(tmp_path / "out"), "--conf", "spark.executor.memory=lots"
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "Executor memory must be a positive number" in done.stderr  # the JVM's own reason, printed by it
    assert "error: Spark did not start: its JVM exited" in done.stderr


def test_a_master_that_cannot_be_used_is_one_line(tmp_path):
    images = one_image(tmp_path)
    done = run_cli("--input", str(images), "--output", str(tmp_path / "out"), "--master", "spark://127.0.0.1:1")
    assert done.returncode == 1 and "JVM started: False" in done.stdout, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "error: spark://127.0.0.1:1: no standalone master answers "
        "(127.0.0.1:1: Connection refused): start it, or check --master "
        "and that this host reaches it"
    )
    done = run_cli("--input", str(images), "--output", str(tmp_path / "out"), "--master", "local[0]")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert (
        "error: Spark did not start with master 'local[0]': org.apache.spark.SparkException: Asked to run "
        "locally with 0 threads"
    ) in done.stderr


def test_the_azure_reader_for_a_local_input_is_refused_naming_both(tmp_path):
    done = run_cli("--input", str(one_image(tmp_path)), "--output", str(tmp_path / "out"), "--reader", "azure_sdk")
    assert_refused_before_spark(
        done,
        "input.reader azure_sdk (--reader) reads Azure URIs (az://container/prefix, "
        "abfss://...) only: use auto or spark for this input",
    )


def test_missing_input_is_refused_and_leaves_no_output_behind(tmp_path):
    done = run_cli("--input", str(tmp_path / "nowhere"), "--output", str(tmp_path / "out"))
    assert_refused_before_spark(done, "input path does not exist: check --input")
    assert not (tmp_path / "out").exists()


def test_a_percent_encoded_input_is_refused_naming_the_spelling_that_exists(tmp_path):
    """Paths are Hadoop's spelling, never percent-decoded (the listing reads `file:///a%20b` as "a%20b"): the check
    before Spark starts reads them the same way, and says which spelling exists."""
    images = one_image(tmp_path)
    (images.parent / "with space").mkdir()
    encoded = f"file://{images.parent}/with%20space"
    done = run_cli("--input", encoded, "--output", str(tmp_path / "out"))
    assert_refused_before_spark(done, f"(paths are not percent-decoded: write 'file://{images.parent}/with space')")


def test_a_wildcard_input_is_refused_saying_paths_are_literal(tmp_path):
    images = one_image(tmp_path)
    done = run_cli("--input", f"{images}/*.jpg", "--output", str(tmp_path / "out"))
    assert_refused_before_spark(done, "(wildcards are not expanded: every character of a path is literal;")


def test_an_unreachable_file_system_is_a_clear_error_under_a_quiet_console(tmp_path):
    """No name node listens on port 1: the ConnectException of the input's listing, or of the first look at the
    output, is one line naming the URI (exit 1: the store failed, as for Azure), and the executors' warm-up, started
    beside the listing, ends before the session stops (a job cancelled then prints Spark's warnings and stack traces
    about killed tasks)."""
    images = one_image(tmp_path)
    for where in ("--input", "--output"):
        paths = {"--input": str(images), "--output": str(tmp_path / "out"), where: f"hdfs://localhost:1/{where[2:]}"}
        done = run_cli(*(item for pair in paths.items() for item in pair))
        assert done.returncode == 1, done.stderr[-3000:]
        assert (
            f"error: hdfs://localhost:1/{where[2:]}" in done.stderr
            and "cannot reach its file system (java.net.ConnectException" in done.stderr
        ), done.stderr[-3000:]
        noise = [
            line for line in done.stderr.splitlines() if " WARN " in line or " ERROR " in line or "Traceback" in line
        ]
        assert not noise, done.stderr[-3000:]


def test_an_input_host_that_does_not_resolve_is_a_clear_error(tmp_path):
    """`.invalid` never resolves (RFC 2606): Hadoop wraps the UnknownHostException in an IllegalArgumentException,
    which PySpark converts to one of its own; the error still names the URI and the reason (Hadoop's own WARN lines
    about the file system it could not start may stand above it)."""
    done = run_cli("--input", "hdfs://nohost.invalid/images", "--output", str(tmp_path / "out"))
    assert done.returncode == 1, done.stderr[-3000:]
    assert (
        "error: hdfs://nohost.invalid/images: cannot reach its file system (java.net.UnknownHostException"
        in done.stderr
        and "Traceback" not in done.stderr
    ), done.stderr[-3000:]


def test_local_paths_are_checked_in_hadoops_spelling(tmp_path):
    from pipelines.inference.job_plan import check_local_paths
    from pipelines.io.local_paths import local_path

    literal = tmp_path / "lit%20dir#1"
    literal.mkdir()
    assert local_path(f"file://{literal}") == literal and local_path(f"file:{literal}") == literal
    assert local_path("hdfs://nn/a") is None and local_path("az://container/a") is None
    check_local_paths(f"file://{literal}", f"file://{tmp_path}/out%20put")  # exists as spelled: no error


def test_an_output_that_is_the_input_is_refused(tmp_path):
    images = one_image(tmp_path)
    done = run_cli("--input", str(images), "--output", f"file://{images}/")
    assert_refused_before_spark(done, "--output is the --input directory")
    assert sorted(path.name for path in images.iterdir()) == ["road.jpg"]


def test_a_directory_without_a_model_is_refused(tmp_path):
    done = run_cli("--input", str(one_image(tmp_path)), "--output", str(tmp_path / "out"), "--model", str(tmp_path))
    assert_refused_before_spark(done, "manifest.json")
    assert not (tmp_path / "out").exists()


def test_negative_partitions_are_refused(tmp_path):
    images = one_image(tmp_path)
    done = run_cli("--input", str(images), "--output", str(tmp_path / "out"), "--partitions", "-1")
    assert_refused_before_spark(done, "inference.partitions (--partitions) is -1: it must be an integer >= 0")
    done = run_cli("--input", str(images), "--output", str(tmp_path / "out"), "--batch-size", "0")
    assert_refused_before_spark(done, "inference.batch_size (--batch-size) is 0: it must be an integer >= 1")


def test_settings_spark_does_not_know_are_warned_about(spark, caplog):
    with caplog.at_level(logging.WARNING, logger="pipelines.spark.spark_session"):
        unknown = warn_unknown_spark_settings(
            spark,
            {
                "spark.foo.bar": "1",
                "spark.executor.cores": "1",
                "spark.sql.shuffle.partitions": "4",
                "spark.hadoop.fs.s3a.endpoint": "x",
            },
        )
    assert unknown == ["spark.foo.bar"]
    assert "spark.foo.bar (--conf or spark.conf): Spark" in caplog.text
    assert "has no such setting (a typo?)" in caplog.text


def test_readmes_spark_submit_line_works_with_the_venv_activated(tmp_path):
    """pyspark's spark-submit finds SPARK_HOME with the `python3` on PATH: the README says to activate the venv
    first. Also: an unknown --conf is warned about, and the job still runs; spark-submit's --name and --conf win
    over the config's spark.app_name and spark.conf."""
    images, events = one_image(tmp_path), tmp_path / "events"
    events.mkdir()
    config = tmp_path / "job.yaml"
    config.write_text("spark:\n  app_name: from-the-config\n  conf:\n    spark.sql.shuffle.partitions: 3\n")
    line = (
        f". {REPO}/.venv/bin/activate && spark-submit --master 'local[1]' --name from-spark-submit "
        f"--conf spark.sql.shuffle.partitions=5 --conf spark.eventLog.enabled=true --conf "
        f"spark.eventLog.compress=false --conf spark.eventLog.rolling.enabled=false --conf "
        f"'spark.eventLog.dir=file:{events}' jobs/infer_yolact.py "
        f"--config '{config}' --input '{images}' --output '{tmp_path / 'out'}' --precision f32 "
        "--conf spark.foo.bar=1"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("SPARK_HOME", "VIRTUAL_ENV")}
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    done = subprocess.run(["bash", "-c", line], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert "done 1, failed 0" in done.stdout
    assert "spark.foo.bar (--conf or spark.conf): Spark" in done.stdout  # spark-submit: the driver's stderr to stdout
    [log] = events.iterdir()
    settings = [
        event
        for event in map(json.loads, log.read_text().splitlines())
        if event["Event"] == "SparkListenerEnvironmentUpdate"
    ][-1]["Spark Properties"]
    assert (settings["spark.app.name"], settings["spark.sql.shuffle.partitions"]) == ("from-spark-submit", "5")
    assert settings["spark.foo.bar"] == "1"  # the job's own --conf, which spark-submit did not set


def test_export_without_torch_names_the_extra_to_install(tmp_path):
    """What `python -m model_export` says in an inference-only env (make demo's): the base interpreter has no
    torch, onnx or onnxruntime."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [
            sys._base_executable,
            "-m",
            "model_export",
            "yolact",
            "--config",
            "yolact_r18_small",
            "--random-init",
            "--out",
            str(tmp_path / "x"),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "needs torch" in done.stderr and "pip install -c constraints.txt -e '.[export]'" in done.stderr


STOP_THEN_START_AGAIN = """
from pyspark import SparkContext
from pipelines.spark.spark_session import local_session, stop_session

for name in ("first", "second"):
    spark = local_session(name, "local[1]")
    counted = spark.sparkContext.accumulator(0)
    spark.sparkContext.parallelize([1, 2, 3], 1).foreach(lambda value: counted.add(value))
    stop_session(spark)
    print(name, counted.value, SparkContext._active_spark_context is None)
"""


def test_the_commands_stop_leaves_no_context_and_a_next_session_counts_its_accumulators():
    """stop_session (the commands' stop, without PySpark's wait for its accumulator server): the context is gone,
    a session started after it in the same process gets a server of its own, and the process ends cleanly."""
    done = subprocess.run(
        [sys.executable, "-c", STOP_THEN_START_AGAIN],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["first", "6", "True", "second", "6", "True"], done.stdout + done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "Exception" not in done.stderr, done.stderr[-3000:]


def test_a_signal_after_the_outcome_is_printed_leaves_the_exit_code():
    """A Ctrl-C or SIGTERM that comes once a command line printed its outcome (its summary or error line), while
    Python, Py4J and Spark shut down, leaves its exit code: Python's teardown restores the default handlers, and the
    signal would end a finished run with no line, exit 130 or 143."""
    probe = (
        "import os, signal, sys; from pipelines.spark.stop_signals import outcome_decided, stop_on_signals; "
        "stop_on_signals(); code = outcome_decided(3); os.kill(os.getpid(), signal.SIGINT); "
        "os.kill(os.getpid(), signal.SIGTERM); print('went on'); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (3, "went on\n", "")


def test_under_spark_submit_a_signal_after_the_outcome_leaves_the_exit_code_too(tmp_path):
    """Under spark-submit the JVM hands its Ctrl-C and SIGTERM to the driver's stop (stop_signals); once the driver
    printed its outcome, the JVM ignores them as the driver does, and spark-submit exits with the driver's code
    (here: SIGTERM to the JVM, its parent, then Ctrl-C to itself, once the outcome is decided)."""
    probe = tmp_path / "probe.py"
    probe.write_text(
        "import os, signal, sys\n"
        "from pyspark.sql import SparkSession\n"
        "from pipelines.spark.stop_signals import outcome_decided, stop_on_signals\n"
        "spark = SparkSession.builder.master('local[1]').getOrCreate()\n"
        "stop_on_signals()\n"
        "code = outcome_decided(3)\n"
        "os.kill(os.getppid(), signal.SIGTERM)\n"
        "os.kill(os.getpid(), signal.SIGINT)\n"
        "print('went on', flush=True)\n"
        "sys.exit(code)\n"
    )
    command, env = spark_submit_command("--master", "local[1]", str(probe))
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    said = done.stdout + done.stderr
    assert done.returncode == 3 and "went on" in done.stdout, said[-3000:]
    assert "sparkseg: stopping" not in said and "Exception" not in said, said[-3000:]
