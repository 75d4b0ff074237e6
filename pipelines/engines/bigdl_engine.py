"""The `bigdl` engine's env and session: the paper's pipeline on BigDL 2.4 (DLlib image preprocessing + Orca OpenVINO
Estimator; the stages: pipelines.engines.bigdl_stages; as a wave transform: pipelines.engines.bigdl_inference).

BigDL runs only in its own env (`make bigdl-env` -> .venv-bigdl: pyspark 3.5, numpy<2, openvino 2023.3 with the
legacy `openvino.inference_engine` API). This module imports in any env; BigDL is imported only inside functions
(an optional dependency absent from the main env), and every entry point calls `require_bigdl()` on the driver before
any Spark job starts.

    python -m pipelines.engines.bigdl_engine --spark-submit-args    # spark-submit's options for BigDL's jars
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
import tempfile
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.engines.bigdl_natives import installed_native_library_dir
from pipelines.errors import UsageError
from pipelines.job_config import ConfigError, SparkSettings
from pipelines.spark.session_kind import classic_jvm
from pipelines.spark.spark_session import (
    DEFAULT_CONF,
    active_context,
    launch_conf,
    submitted_app_name,
    submitted_conf,
)

INSTALL_HINT = (
    "build the BigDL env with `make bigdl-env` (scripts/make_bigdl_env.sh, creates .venv-bigdl), then run the job "
    "with .venv-bigdl/bin/python (spark-submit: PYSPARK_PYTHON=.venv-bigdl/bin/python and "
    "PYSPARK_DRIVER_PYTHON=.venv-bigdl/bin/python); on a managed cluster (Databricks) install bigdl-dllib and its "
    "jars on the cluster, or run the native engine"
)

# BigDL's dllib jar ships a log4j2-test.xml (logger "org" at INFO, additivity off) that wins over Spark's defaults:
# it floods the console with INFO lines that setLogLevel cannot silence and appends them all to a file named
# "/tmp/${sys:logFilename}". Point log4j2 at Spark's own defaults.
SPARK_LOG4J2_DEFAULTS = "-Dlog4j2.configurationFile=classpath:org/apache/spark/log4j2-defaults.properties"


class BigDLNotInstalled(UsageError, RuntimeError):
    """This Python env cannot run the bigdl engine (raised on the driver, before any Spark job)."""


class BigDLNotOnClasspath(UsageError, RuntimeError):
    """The JVM was started without BigDL's jars (spark-submit without the options of spark_submit_args())."""


# ---------------------------------------------------------------------------------------------------------- env


def missing_bigdl_requirements() -> list[str]:
    """What this interpreter lacks for the bigdl engine (empty when it can run it)."""
    problems = []
    for module, what in (
        ("bigdl.dllib", "bigdl-dllib-spark3==2.4.0"),
        ("bigdl.orca", "bigdl-orca-spark3==2.4.0"),
        ("openvino.inference_engine", "openvino==2023.3.0 (the legacy inference_engine API)"),
    ):
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # the parent package itself is missing
            found = False
        if not found:
            problems.append(f"{what} (module {module} not found)")
    import numpy
    import pyspark

    if not pyspark.__version__.startswith("3.5."):
        problems.append(f"pyspark 3.5.x (found {pyspark.__version__}; BigDL 2.4's jars are built for Scala 2.12)")
    if int(numpy.__version__.split(".")[0]) >= 2:
        problems.append(f"numpy<2 (found {numpy.__version__}; BigDL calls ndarray.tostring)")
    return problems


def require_bigdl() -> None:
    """Raise BigDLNotInstalled naming what is missing and the command that installs it."""
    problems = missing_bigdl_requirements()
    if problems:
        raise BigDLNotInstalled(
            f"the bigdl engine cannot run in {sys.executable}: it needs "
            + "; ".join(problems)
            + f". To fix: {INSTALL_HINT}."
        )


def spark_submit_args() -> list[str]:
    """The spark-submit options that put BigDL's jars where the bigdl engine needs them when spark-submit starts the
    JVM (BigDL's documented recipe): shipped to executors (--jars, fetched into each executor's working directory,
    hence the bare names on the executor classpath) and on the driver's classpath from its start; and the env's
    unpacked native libraries on the library path (pipelines.engines.bigdl_natives)."""
    from bigdl.dllib.utils.engine import get_bigdl_jars

    jars = get_bigdl_jars()
    args = [
        "--jars",
        ",".join(jars),
        "--conf",
        "spark.driver.extraClassPath=" + ":".join(jars),
        "--conf",
        "spark.executor.extraClassPath=" + ":".join(os.path.basename(jar) for jar in jars),
        # the driver JVM starts before the job can set spark.driver.extraJavaOptions (bigdl_spark_conf)
        "--driver-java-options",
        SPARK_LOG4J2_DEFAULTS,
        "--conf",
        "spark.executor.extraJavaOptions=" + SPARK_LOG4J2_DEFAULTS,
    ]
    natives = installed_native_library_dir()
    if natives:  # see pipelines.engines.bigdl_natives
        args += ["--driver-library-path", natives, "--conf", "spark.executor.extraLibraryPath=" + natives]
    return args


def bigdl_on_classpath(jvm) -> bool:
    """Whether this JVM can load BigDL's classes the way py4j (and so BigDL's Python API) looks them up."""
    try:
        jvm.py4j.reflection.ReflectionUtil.classForName("com.intel.analytics.bigdl.dllib.nnframes.NNModel")
        return True
    except Exception:  # py4j wraps ClassNotFoundException
        return False


def python_home() -> str:
    """The PYTHONHOME that Python workers of this env need: the base interpreter's prefix (where the stdlib is)."""
    return sys.base_prefix


def bigdl_spark_conf(master: str, conf: dict | None = None) -> dict[str, str]:
    """Spark settings the bigdl engine adds to sparkseg's defaults (plain dict, no BigDL import needed)."""
    merged = dict(DEFAULT_CONF)
    if master.startswith("local"):
        merged["spark.sql.shuffle.partitions"] = "4"
    if master.startswith("local") or master.startswith("spark://127.0.0.1"):
        merged.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
    merged.update(
        {
            # Workaround (PYTHONHOME): BigDL's set_python_home() sets PYTHONHOME to dirname(dirname(sys.executable))
            # when it is unset, i.e. to the venv root, which has no stdlib: every Python process started with that
            # env (Spark's Python workers, subprocesses) dies with "No module named 'encodings'". A venv interpreter
            # with PYTHONHOME = the base prefix still finds the venv's site-packages (pyvenv.cfg), so we set that
            # first (BigDL keeps an existing value), on the driver and for executors. Executors must have the same
            # env at the same path, as PYSPARK_PYTHON already requires.
            "spark.executorEnv.PYTHONHOME": python_home(),
            "spark.driver.extraJavaOptions": SPARK_LOG4J2_DEFAULTS,
            "spark.executor.extraJavaOptions": SPARK_LOG4J2_DEFAULTS,
            # Workaround (Python worker reuse): after a failed job, later Python jobs of the session failed with
            # "java.net.SocketException: Socket is closed" (PythonRunner.compute) with reuse, not without. Most likely
            # Spark 3.5's task monitor: a task killed when its job aborts has often already released its worker to
            # the idle pool (Orca's tasks do JVM work after the Python part), and destroyPythonWorker then closes
            # that pooled socket without removing it. Without reuse every task gets a fresh worker forked by the
            # daemon (each task re-imports openvino; Orca imports it per task anyway).
            "spark.python.worker.reuse": "false",
        }
    )
    natives = installed_native_library_dir()
    # MKL and OpenCV from the env, not extracted under /tmp by every JVM: see pipelines.engines.bigdl_natives
    if natives:
        merged.update({"spark.driver.extraLibraryPath": natives, "spark.executor.extraLibraryPath": natives})
    merged.update(conf or {})
    return {key: str(value) for key, value in merged.items()}


def bigdl_job_session(spark: SparkSettings) -> SparkSession:
    """The bigdl engine's session for a job (the native engine's: pipelines.spark.spark_session.job_session): BigDL's
    jars and settings; fails on the driver, naming the install command, without BigDL."""
    return bigdl_python_env(spark.master, spark.app_name, {str(k): str(v) for k, v in spark.conf.items()})


def bigdl_python_env(
    master: str = "local[2]", app_name: str = "sparkseg-bigdl", conf: dict | None = None, log_path: str | None = None
) -> SparkSession:
    """A SparkSession ready for BigDL: PYTHONHOME fix, BigDL's jars and settings, BigDL's engine initialised.

    Creates the session (BigDL's jars must be on the JVM classpath when it starts) with `master`, then runs
    BigDL's `init_nncontext` on it, which is what `init_orca_context(cluster_mode="spark-submit")` does on an
    existing context. An already running session is reused only if BigDL's classes are on its classpath.
    log_path: where BigDL writes its Spark INFO log (default: <tmp>/sparkseg-bigdl-<pid>.log).
    """
    require_bigdl()
    os.environ["PYTHONHOME"] = python_home()  # see bigdl_spark_conf: must be set before BigDL looks at it
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    _check_local_workers_python(master)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # BigDL exports KMP_SETTINGS=1 to the driver and executors: Intel OpenMP then prints its settings at startup.
    os.environ.setdefault("KMP_SETTINGS", "0")
    _redirect_bigdl_log(log_path or str(Path(tempfile.gettempdir()) / f"sparkseg-bigdl-{os.getpid()}.log"))

    from bigdl.dllib.nncontext import init_nncontext
    from bigdl.dllib.utils.engine import get_bigdl_classpath

    if active_context() is None:
        # BigDL's jars: init_spark_conf puts them on the driver's classpath (PYSPARK_SUBMIT_ARGS
        # --driver-class-path) and adds BigDL's own settings (spark-bigdl.conf). Executors of a standalone
        # cluster on the same machine layout find them through extraClassPath (BigDL's init_spark_standalone
        # does the same); under spark-submit, its options (spark_submit_args) win.
        settings = {"spark.executor.extraClassPath": get_bigdl_classpath(), **bigdl_spark_conf(master, conf)}
        if os.environ.get("PYSPARK_GATEWAY_PORT"):  # started by spark-submit: its master and settings win
            if not bigdl_on_classpath(classic_jvm(what="the bigdl engine")):
                raise BigDLNotOnClasspath(
                    "the bigdl engine under spark-submit needs BigDL's jars on the JVM's "
                    "classpath from its start: add these options to spark-submit (before the "
                    "job script): " + shlex.join(spark_submit_args()) + "  (the same as "
                    "$(python -m pipelines.engines.bigdl_engine --spark-submit-args))"
                )
            submitted = submitted_conf()
            master = submitted.get("spark.master", master)
            app_name = submitted_app_name(submitted, app_name)
            settings = {key: value for key, value in settings.items() if key not in submitted}
        missing = missing_cluster_settings(master, {**launch_conf(), **settings})
        if missing:
            raise ConfigError(
                f"the bigdl engine on {master} needs {missing} (BigDL's Engine.init sizes its thread "
                "pools from them and refuses to start without)"
            )
        spark_conf = bigdl_init_spark_conf(settings).setMaster(master).setAppName(app_name)
        session = SparkSession.builder.config(conf=spark_conf).getOrCreate()
    else:
        session = SparkSession.builder.getOrCreate()
        _check_bigdl_on_classpath(session)
    init_nncontext(cluster_mode="spark-submit", spark_log_level="ERROR", redirect_spark_log=True)
    return session


def bigdl_init_spark_conf(settings: dict):
    """BigDL's init_spark_conf (its jars on the driver classpath through PYSPARK_SUBMIT_ARGS, its settings),
    safe when PYSPARK_SUBMIT_ARGS is already set: see _take_submit_args."""
    from bigdl.dllib.nncontext import init_spark_conf

    inherited = _take_submit_args()
    spark_conf = init_spark_conf(settings)
    _restore_submit_args(inherited)
    return spark_conf


def missing_cluster_settings(master: str, settings: dict) -> str | None:
    """What BigDL's Engine.init needs on a cluster master and `settings` lack (with the flags that set it), or
    None. Standalone/Mesos: executor cores and total cores; YARN/Kubernetes: executor cores and executors (with
    dynamic allocation: equal min and max executors)."""
    if master.startswith("local"):
        return None
    needed = {"spark.executor.cores": "--executor-cores N"}
    if master.startswith(("spark://", "mesos://")):
        needed["spark.cores.max"] = "--total-executor-cores M"
    elif settings.get("spark.dynamicAllocation.enabled", "false").lower() != "true":
        needed["spark.executor.instances"] = "--num-executors K"
    absent = [key for key in needed if not str(settings.get(key, "")).strip()]
    if not absent:
        return None
    return (
        ", ".join(absent)
        + ": add "
        + " ".join(f"`--conf {key}=...`" for key in absent)
        + " to the job's arguments, or "
        + " ".join(needed[key] for key in absent)
        + " to spark-submit"
    )


def _take_submit_args() -> list[str]:
    """Workaround (BigDL 2.4 init_spark_conf, nncontext.py): with PYSPARK_SUBMIT_ARGS already set, BigDL inserts
    "--driver-class-path JARS" right before "pyspark-shell" with no space ("...jarpyspark-shell"), and spark-submit
    stops with its usage text (JAVA_GATEWAY_EXITED). A process inherits the variable whenever its parent ran BigDL
    (a test session, a notebook, a scheduler). We take the variable away before BigDL runs and return its
    arguments without "pyspark-shell" and without BigDL's jars (BigDL adds them again); BIGDL_JARS, prepended to at
    every import of BigDL, loses its repeats."""
    jars = os.environ.get("BIGDL_JARS")
    if jars:
        os.environ["BIGDL_JARS"] = ":".join(dict.fromkeys(jars.split(":")))
    bigdl_jars = set((jars or "").split(":")) - {""}
    tokens = shlex.split(os.environ.pop("PYSPARK_SUBMIT_ARGS", ""))
    kept, index = [], 0
    while index < len(tokens):
        token = tokens[index]
        if token == "--driver-class-path" and index + 1 < len(tokens):
            own = [path for path in tokens[index + 1].split(":") if path and path not in bigdl_jars]
            if own:
                kept += [token, ":".join(own)]
            index += 2
            continue
        if token != "pyspark-shell":
            kept.append(token)
        index += 1
    return kept


def _restore_submit_args(inherited: list[str]) -> None:
    """Put the arguments _take_submit_args took back in front of what BigDL wrote (one --driver-class-path)."""
    if not inherited:
        return
    written = shlex.split(os.environ.get("PYSPARK_SUBMIT_ARGS", "pyspark-shell"))
    if "--driver-class-path" in inherited and "--driver-class-path" in written:
        mine = inherited.index("--driver-class-path") + 1
        theirs = written.index("--driver-class-path") + 1
        written[theirs] = written[theirs] + ":" + inherited[mine]
        inherited = inherited[: mine - 1] + inherited[mine + 1 :]
    os.environ["PYSPARK_SUBMIT_ARGS"] = shlex.join(
        inherited + [t for t in written if t != "pyspark-shell"] + ["pyspark-shell"]
    )


def _check_local_workers_python(master: str) -> None:
    """In local mode the Python workers run PYSPARK_PYTHON on this machine: it must be this env's interpreter
    (a PYSPARK_PYTHON left pointing at the main venv gives workers with pyspark 4 and numpy 2)."""
    workers = os.environ["PYSPARK_PYTHON"]
    if master.startswith("local") and os.path.abspath(workers) != os.path.abspath(sys.executable):
        raise ConfigError(
            f"PYSPARK_PYTHON={workers} but the bigdl engine runs in {sys.executable}: its Python "
            f"workers must run the same env; set PYSPARK_PYTHON={sys.executable} (or unset it)"
        )


def _redirect_bigdl_log(log_path: str) -> None:
    """Workaround (bigdl.log in the working directory): every init_nncontext() call, including the one inside
    Orca's Estimator.predict, redirects Spark's INFO log to `redire_spark_logs`' default path, which is fixed to
    os.getcwd() + "/bigdl.log" when BigDL is first imported; a job or a test run would leave a growing bigdl.log in
    whatever directory it was started from. We point that default at `log_path` (a BigDL-wide setting of this
    process: the function's default argument)."""
    from bigdl.dllib.utils import common

    bigdl_type, _ = common.redire_spark_logs.__defaults__
    common.redire_spark_logs.__defaults__ = (bigdl_type, log_path)


def _check_bigdl_on_classpath(session: SparkSession) -> None:
    if not bigdl_on_classpath(classic_jvm(session, "the bigdl engine")):
        raise BigDLNotOnClasspath(
            "a SparkSession without BigDL's jars is already running: call "
            "pipelines.engines.bigdl_engine.bigdl_python_env() before any other session is "
            "created (BigDL's jars must be on the classpath when the JVM starts)"
        )


if __name__ == "__main__":  # python -m pipelines.engines.bigdl_engine --spark-submit-args
    if sys.argv[1:] != ["--spark-submit-args"]:
        sys.exit(
            "usage: python -m pipelines.engines.bigdl_engine --spark-submit-args  (prints spark-submit's "
            "options for BigDL's jars)"
        )
    print(shlex.join(spark_submit_args()))
