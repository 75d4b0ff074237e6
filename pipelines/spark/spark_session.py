"""Building SparkSessions the way every job and test needs them."""

from __future__ import annotations

import hashlib
import logging
import os
import py_compile
import shutil
import socket
import sys
import tempfile
import zipfile
from collections.abc import Callable
from pathlib import Path

from pyspark.sql import SparkSession

try:  # classic pyspark; the Spark Connect client package (pyspark-client) has no SparkContext
    from pyspark import SparkContext
except ImportError:
    SparkContext = None  # type: ignore[assignment,misc]

from pipelines.errors import ClusterUnreachable, UsageError
from pipelines.io.storage import publish_once
from pipelines.spark.jvm_logging import log4j_config_path, quiet_jvm_options, quiet_running_jvm, set_jvm_log_level

log = logging.getLogger(__name__)

# Families of settings whose keys are open-ended (Spark registers no entry per key).
OPEN_SETTING_PREFIXES = (
    "spark.hadoop.",
    "spark.executorEnv.",
    "spark.yarn.",
    "spark.kubernetes.",
    "spark.driver.resource.",
    "spark.executor.resource.",
    "spark.sql.catalog.",
    "spark.metrics.",
    "spark.databricks.",
    "spark.plugins.",
    "spark.eventLog.",
    "spark.history.",
    "spark.ssl.",
    "spark.jars.",
)

# Settings every sparkseg session gets unless the caller (or spark-submit: submitted_conf) set them.
DEFAULT_CONF = {
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    # Our partitions are balanced on purpose; AQE must not merge them.
    "spark.sql.adaptive.coalescePartitions.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    # The status store the progress line reads (running tasks) is written on every task event: by default a stage's
    # entry is rewritten at most every 100 ms, so tasks starting together with their stage showed as 0 running until
    # the next executor heartbeat (10 s)
    "spark.ui.liveUpdate.period": "0",
}
DEFAULT_LOG_LEVEL = "WARN"


def quick_start_options(conf: dict) -> dict:
    """`conf` with the driver JVM starting fast (only effective when this process starts the JVM):
    - it maps this env's class archive (pipelines.spark.jvm_class_archive) when that is built, unless the caller chose
      CDS flags of its own;
    - it compiles with C1 only (QUICK_START_JIT) unless the caller chose JIT flags: C2's compiler threads compete with
      a short job for the cores; a JVM this process starts is a local-mode one, whose JVM-side work (listing, Arrow,
      Parquet) is small beside the model's.
    Under spark-submit the JVM is up before this code runs: pass the flags with --driver-java-options
    (docs/deploy.md)."""
    from pipelines.spark.jvm_class_archive import QUICK_START_JIT, driver_java_options

    options = conf.get("spark.driver.extraJavaOptions", "")
    flags = []
    if not any(flag in options for flag in ("SharedArchiveFile", "ArchiveClassesAtExit", "-Xshare")):
        flags.append(driver_java_options())
    if "TieredStopAtLevel" not in options and "TieredCompilation" not in options:
        flags.append(QUICK_START_JIT)
    added = " ".join(flag for flag in flags if flag)
    return {**conf, "spark.driver.extraJavaOptions": f"{options} {added}".strip()} if added else conf


LOCAL_DAEMON_DIR = Path(__file__).resolve().parent / "local_daemon"  # holds only the daemon module (its docstring)
LOCAL_DAEMON_MODULE = "sparkseg_local_daemon"
LIBRARY_DIR_VARIABLE = "SPARKSEG_LIBRARY_DIR"  # the driver's pipelines/, for the daemon to preload it from there


def local_daemon_settings(conf: dict, master: str) -> dict:
    """`conf` with the Python workers of a `local[...]` master started by sparkseg_local_daemon (pyspark imported
    from the installed package's bytecode instead of pyspark.zip's sources, pandas and pyarrow imported once before
    the fork, and the compiled pixel loops where the interpreter's `pipelines` is this driver's): a session's first
    Python job starts its workers faster (make bench-startup measures it).
    Only where that is safe: the workers run this interpreter (PYSPARK_PYTHON), whose pyspark is the pip-installed
    one the JVM takes pyspark.zip from (no other SPARK_HOME), and the caller set no daemon module of its own.
    Clusters keep Spark's daemon."""
    import pyspark

    if not master.startswith("local") or "spark.python.daemon.module" in conf:
        return conf
    installed = Path(pyspark.__file__).resolve().parent
    spark_home = os.environ.get("SPARK_HOME")
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    if (
        not (installed / "python" / "lib" / "pyspark.zip").is_file()
        or (spark_home and Path(spark_home).resolve() != installed)
        or os.path.abspath(shutil.which(python) or python) != os.path.abspath(sys.executable)
        or not (LOCAL_DAEMON_DIR / f"{LOCAL_DAEMON_MODULE}.py").is_file()
    ):
        return conf
    key = "spark.executorEnv.PYTHONPATH"
    path = os.pathsep.join(entry for entry in (conf.get(key), str(LOCAL_DAEMON_DIR)) if entry)
    library = str(Path(__file__).resolve().parents[1])
    return {
        **conf,
        "spark.python.daemon.module": LOCAL_DAEMON_MODULE,
        key: path,
        f"spark.executorEnv.{LIBRARY_DIR_VARIABLE}": library,
    }


def local_session(
    app_name: str = "sparkseg", master: str = "local[*]", conf: dict | None = None, log_level: str = "ERROR"
) -> SparkSession:
    """A local-mode session whose Python workers run this interpreter; Spark logs at `log_level` from the
    SparkContext's start (spark.log.level), and a JVM started here reads conf/log4j2.properties."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.appName(app_name).master(master)
    merged = {
        **DEFAULT_CONF,
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.sql.shuffle.partitions": "4",
        "spark.log.level": log_level.upper(),
        **(conf or {}),
    }
    for key, value in quick_start_options(quiet_jvm_options(local_daemon_settings(merged, master))).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel(merged["spark.log.level"])
    return session


DRIVER_ONLY_SUBPACKAGES = ("sweeps", "tools")  # dev, benchmark and build tools: executors never import them
_SHIPPED: dict[str, set[str]] = {}  # SparkContext applicationId -> names given with ship_once


def ship_once(context: SparkContext, name: str, add: Callable[[], None]) -> None:
    """Call `add` (an addPyFile / addArchive) once per SparkContext for `name`: a context cannot list what it was
    given, and Spark refuses a second file of the same name."""
    shipped = _SHIPPED.setdefault(context.applicationId, set())
    if name not in shipped:
        add()
        shipped.add(name)


def library_files(package: Path) -> list[Path]:
    """The files of a package directory that executors get: all but DRIVER_ONLY_SUBPACKAGES and bytecode caches."""
    files = [(path, path.relative_to(package).parts) for path in sorted(package.rglob("*")) if path.is_file()]
    return [path for path, parts in files if parts[0] not in DRIVER_ONLY_SUBPACKAGES and "__pycache__" not in parts]


def library_archive(package: Path, archive_path: Path) -> Path:
    """A package directory (pipelines/, model_export/) zipped for addPyFile (library_files), each module with its
    bytecode beside it (zipimport reads `x.pyc` next to `x.py`, never __pycache__/): a Python worker importing from
    the zip would otherwise compile every module from source in every worker. The bytecode is
    this driver's Python's (unchecked-hash .pyc: staged_library_archive names the zip by its sources and this
    Python, so it cannot be stale); an executor on another Python version ignores it (other magic number) and
    compiles the sources."""
    with (
        tempfile.TemporaryDirectory(prefix="sparkseg-pyc-") as scratch,
        zipfile.ZipFile(archive_path, "w", zipfile.ZIP_DEFLATED) as archive,
    ):
        for path in library_files(package):
            name = "/".join(path.relative_to(package.parent).parts)
            archive.write(path, name)
            if path.suffix == ".py":
                compiled = py_compile.compile(
                    str(path),
                    cfile=str(Path(scratch) / (name + "c")),
                    dfile=name,
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
                )
                archive.write(compiled, name + "c")
    return archive_path


def staged_library_archive(package: Path) -> Path:
    """library_archive of `package` in the temp directory, named by the hash of its files and this Python's version:
    built once per version of the library (runs after the first reuse it), one zip per version left behind."""
    key = hashlib.sha256(sys.version.encode())
    for path in library_files(package):
        key.update(str(path.relative_to(package)).encode() + b"\0" + path.read_bytes() + b"\0")
    archive = Path(tempfile.gettempdir()) / f"sparkseg-lib-{key.hexdigest()[:16]}" / f"sparkseg_{package.name}.zip"
    if not archive.is_file():
        archive.parent.mkdir(exist_ok=True)
        staging = archive.with_name(f".{archive.name}.{os.getpid()}.tmp")
        library_archive(package, staging)
        publish_once(staging, archive)  # a job starting meanwhile sees the whole zip or none, and only one
    return archive


def ship_library(session: SparkSession) -> None:
    """Make `pipelines` importable on every executor (clusters whose Python env lacks sparkseg): zip the package
    this driver runs and add it with addPyFile, once per SparkContext."""

    def add() -> None:
        package = Path(__file__).resolve().parents[1]  # pipelines/ (this module is pipelines/spark/spark_session.py)
        session.sparkContext.addPyFile(str(staged_library_archive(package)))

    ship_once(session.sparkContext, "pipelines", add)


def job_session(
    master: str, app_name: str, conf: dict, log_level: str = DEFAULT_LOG_LEVEL, remote: str | None = None
) -> SparkSession:
    """The session for a job: under spark-submit (or Databricks) the existing master and settings win; given a
    Spark Connect server (`remote`, else SPARK_REMOTE) a client session of it; run as a plain `python jobs/...`
    script it starts `master` with `conf`. (The bigdl engine's session:
    pipelines.engines.bigdl_engine.bigdl_job_session.)"""
    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    conf = {str(k): str(v) for k, v in conf.items()}
    remote = remote or os.environ.get("SPARK_REMOTE")
    if remote:
        return connect_session(remote, conf)
    level = log_level.upper()
    if os.environ.get("PYSPARK_GATEWAY_PORT"):  # launched by spark-submit: its master and conf win
        submitted = submitted_conf()
        level = submitted.get("spark.log.level", level).upper()
        set_jvm_log_level(level)  # the JVM is up: quiet it before the SparkContext logs its start-up
        builder = SparkSession.builder.appName(submitted_app_name(submitted, app_name))
        for key, value in {**DEFAULT_CONF, "spark.log.level": level, **conf}.items():
            if key not in submitted:
                builder = builder.config(key, value)
        session = builder.getOrCreate()
        try:
            quiet_running_jvm(session.sparkContext._jvm)
        except Exception as err:  # noqa: BLE001  (logging only: Spark's defaults stay)
            log.debug("could not switch the JVM to %s: %s", log4j_config_path(), err)
        session.sparkContext.setLogLevel(level)
    else:
        check_standalone_master(master)
        try:
            session = local_session(app_name, master, conf, log_level=level)
        except Exception as err:  # noqa: BLE001 - PySpark's and Py4J's error classes moved between releases
            raise session_not_started(err, master) from None
    return session


def is_connect(spark: SparkSession) -> bool:
    """Whether `spark` is a Spark Connect client session (its class lives in pyspark.sql.connect)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


CONNECT_DEFAULT_PORT = 15002  # Spark Connect's, where an sc:// URL names none


def connect_session(remote: str, conf: dict[str, str]) -> SparkSession:
    """A client session of the Spark Connect server at `remote` (sc://host[:port][/;params]), which must answer now
    (UsageError otherwise: pyspark would retry for minutes). `conf` is set on the session where the server lets a
    session set it (SQL settings); the others are the server's, and a warning names them."""
    address = remote.removeprefix("sc://").split("/", 1)[0].split(";", 1)[0]
    host, _, port = address.rpartition(":") if address.rpartition(":")[2].isdigit() else (address, "", "")
    try:
        socket.create_connection((host.strip("[]") or "localhost", int(port or CONNECT_DEFAULT_PORT)), 5).close()
    except OSError as err:
        raise UsageError(
            f"{remote}: no Spark Connect server answers ({err.strerror or err}): start one (the pyspark package's "
            "sbin/start-connect-server.sh, see README) or check --remote / spark.remote / SPARK_REMOTE"
        ) from None
    session = SparkSession.builder.remote(remote).getOrCreate()
    for key, value in {**DEFAULT_CONF, **conf}.items():
        try:
            session.conf.set(key, value)
        except Exception as err:  # noqa: BLE001 - pyspark's Connect errors: static or server-side settings
            if key in conf:
                log.warning("%s: the Spark Connect server keeps its own value (%s)", key, str(err).splitlines()[0])
    return session


def submitted_conf() -> dict[str, str]:
    """The settings spark-submit gave the JVM it started (--conf, --name, --master, its properties file): those
    win over the job's config under spark-submit."""
    SparkContext._ensure_initialized()  # connects to spark-submit's JVM, whose system properties SparkConf reads
    return launch_conf()


def launch_conf() -> dict[str, str]:
    """The settings a SparkConf made now holds (this process's JVM's properties where one runs, else none)."""
    from pyspark import SparkConf

    return dict(SparkConf().getAll())


def submitted_app_name(submitted: dict[str, str], app_name: str) -> str:
    """spark-submit's --name, else `app_name` (without --name spark-submit names the application after its script)."""
    name = submitted.get("spark.app.name")
    return app_name if name in (None, os.path.basename(sys.argv[0])) else name


def check_standalone_master(master: str, timeout_s: float = 5.0) -> None:
    """A spark://host:port[,host:port] master none of whose hosts accepts a connection is ClusterUnreachable now:
    Spark itself retries for a minute and prints a stack per try before it gives up."""
    if not master.startswith("spark://"):
        return
    reasons = []
    for address in master[len("spark://") :].split(","):
        host, _, port = address.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
            return
        except (OSError, ValueError) as err:
            reasons.append(f"{address}: {getattr(err, 'strerror', None) or err}")
    raise ClusterUnreachable(
        f"{master}: no standalone master answers ({'; '.join(reasons)}): start it, or check "
        "--master and that this host reaches it"
    )


def session_not_started(err: Exception, master: str) -> Exception:
    """What the command line reports when the session would not start: the JVM exited (a setting it refuses, no
    Java), a setting the SparkContext refuses (UsageError, exit 2), a standalone master that did not answer
    (ClusterUnreachable, exit 1); anything else as it is."""
    if "JAVA_GATEWAY_EXITED" in str(err):
        return UsageError(
            "Spark did not start: its JVM exited (the reason is printed above, e.g. a setting it "
            "refuses); check --master (spark.master), the --conf and spark.conf settings and that a "
            "JDK 17 is installed"
        )
    java = getattr(err, "java_exception", None)
    if java is None:
        return err
    reason = (str(java.toString()).splitlines() or [""])[0]
    if "stopped SparkContext" in reason and master.startswith("spark://"):
        return ClusterUnreachable(
            f"{master}: the standalone master did not answer (Spark gave up after its "
            "retries): start it, or check --master and that this host reaches it"
        )
    return UsageError(
        f"Spark did not start with master {master!r}: {reason} (check --master and spark.master: "
        "local[*], local[N], spark://host:7077, yarn, k8s://..., and the --conf and spark.conf settings)"
    )


def stop_session(session: SparkSession) -> None:
    """`session.stop()` for a command that exits next (the jobs' command lines), without PySpark's wait for its
    accumulator server: SparkContext.stop joins that server's thread, whose request handler polls the JVM's socket
    for the shutdown flag once a second, counted from the last Python task's update (pyspark.accumulators): up to a
    second at the end of every run. Here the server is taken from the context before the stop and only flagged; its
    thread (a daemon) leaves its loop within a second or ends with the process. Sessions that outlive a job (a
    notebook's, the tests') are never stopped by sparkseg."""
    if is_connect(session):  # a client: no accumulator server here
        session.stop()
        return
    context = session.sparkContext
    server = getattr(context, "_accumulatorServer", None)  # PySpark's; absent in other releases: a plain stop
    if server is not None:
        context._accumulatorServer = None
    session.stop()
    if server is not None:
        server.server_shutdown = True


def active_context() -> SparkContext | None:
    """The SparkContext this process runs, if any (None too in a pyspark-client env, which runs Connect only)."""
    return None if SparkContext is None else SparkContext._active_spark_context


def warn_unknown_spark_settings(session: SparkSession, settings: dict) -> list[str]:
    """Log a warning for each key of `settings` that this Spark has no setting for (a typo such as
    spark.executor.core is passed on silently by Spark and changes nothing); return those keys. Spark's registry
    of settings (ConfigEntry) knows the core and SQL ones; open-ended families (spark.hadoop.*, ...) are not checked.
    A Spark Connect client has no registry here: connect_session warns about the settings the server refused."""
    if is_connect(session):
        return []
    registry = session.sparkContext._jvm.org.apache.spark.internal.config.ConfigEntry
    unknown = [key for key in settings if not key.startswith(OPEN_SETTING_PREFIXES) and registry.findEntry(key) is None]
    for key in unknown:
        log.warning(
            "%s (--conf or spark.conf): Spark %s has no such setting (a typo?); passed on as given",
            key,
            session.version,
        )
    return unknown


# python -m pipelines.spark.spark_session --log4j-config: the path for --driver-java-options
if __name__ == "__main__":
    if sys.argv[1:] == ["--log4j-config"]:
        print(log4j_config_path())
    else:
        sys.exit("usage: python -m pipelines.spark.spark_session --log4j-config")
