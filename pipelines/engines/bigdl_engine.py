"""The `bigdl` engine: the paper's pipeline on BigDL 2.4 (DLlib image preprocessing + Orca OpenVINO Estimator).

Stages, each a DataFrame -> DataFrame function:
  decoded images (path, height, width, rgb)  --to_image_schema-->  Spark image struct (BGR bytes)
  image struct  --bigdl_preprocess-->  chw: flat array<float> [3*S_h*S_w], RGB, normalized (DLlib ChainedPreprocessing
                                       through an NNModel over a weighted identity)
  chw  --bigdl_predict-->  one flat array<float> column per IR output (Orca Estimator.from_openvino, the model
                           broadcast to every executor)
or `nnimage_reader_images` (BigDL's own reader, decodes with OpenCV) instead of the first step.

BigDL runs only in its own env (`make bigdl-env` -> .venv-bigdl: pyspark 3.5, numpy<2, openvino 2023.3 with the
legacy `openvino.inference_engine` API). This module imports in any env; BigDL is imported only inside functions,
and every entry point calls `require_bigdl()` on the driver before any Spark job starts.
"""

from __future__ import annotations

import importlib.util
import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.engines.bigdl_natives import installed_native_library_dir
from pipelines.errors import UsageError

# --precision f32|bf16|auto -> INFERENCE_PRECISION_HINT
from pipelines.inference.openvino_runtime import PRECISION_HINTS
from pipelines.job_config import ConfigError, SparkSettings

INSTALL_HINT = (
    "build the BigDL env with `make bigdl-env` (scripts/make_bigdl_env.sh, creates .venv-bigdl), then run the job "
    "with .venv-bigdl/bin/python (spark-submit: PYSPARK_PYTHON=.venv-bigdl/bin/python and "
    "PYSPARK_DRIVER_PYTHON=.venv-bigdl/bin/python); on a managed cluster (Databricks) install bigdl-dllib and its "
    "jars on the cluster, or run the native engine"
)

# OpenCV type of 8-bit, 3-channel pixels (CV_8UC3), as Spark's image schema and BigDL's NNImageSchema store it.
CV_8UC3 = 16

# Spark's image schema (pyspark.ml.image.ImageSchema.imageSchema); BigDL's RowToImageFeature reads it by position.
IMAGE_STRUCT = T.StructType(
    [
        T.StructField("origin", T.StringType(), True),
        T.StructField("height", T.IntegerType(), True),
        T.StructField("width", T.IntegerType(), True),
        T.StructField("nChannels", T.IntegerType(), True),
        T.StructField("mode", T.IntegerType(), True),
        T.StructField("data", T.BinaryType(), True),
    ]
)

# BigDL's dllib jar ships a log4j2-test.xml (logger "org" at INFO, additivity off) that wins over Spark's defaults:
# it floods the console with INFO lines that setLogLevel cannot silence (~2,600 for three images under spark-submit)
# and appends them all to a file named "/tmp/${sys:logFilename}". Point log4j2 at Spark's own defaults.
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
    from pipelines.spark.spark_session import DEFAULT_CONF

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
            # "java.net.SocketException: Socket is closed" (PythonRunner.compute), in 3 of 4 slow test runs with reuse
            # and 0 of 4 without. Most likely Spark 3.5's task monitor: a task killed when its job aborts has often
            # already released its worker to the idle pool (Orca's tasks do JVM work after the Python part), and
            # destroyPythonWorker then closes that pooled socket without removing it. Without reuse every task gets
            # a fresh worker forked by the daemon (each task re-imports openvino; Orca imports it per task anyway).
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
    jars
    and settings; fails on the driver, naming the install command, without BigDL."""
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
    # BigDL exports KMP_SETTINGS=1 to the driver and executors: Intel OpenMP then prints ~80 lines at startup.
    os.environ.setdefault("KMP_SETTINGS", "0")
    _redirect_bigdl_log(log_path or str(Path(tempfile.gettempdir()) / f"sparkseg-bigdl-{os.getpid()}.log"))

    from bigdl.dllib.nncontext import init_nncontext
    from bigdl.dllib.utils.engine import get_bigdl_classpath
    from pyspark import SparkConf, SparkContext

    from pipelines.spark.spark_session import submitted_app_name, submitted_conf

    if SparkContext._active_spark_context is None:
        # BigDL's jars: init_spark_conf puts them on the driver's classpath (PYSPARK_SUBMIT_ARGS
        # --driver-class-path) and adds BigDL's own settings (spark-bigdl.conf). Executors of a standalone
        # cluster on the same machine layout find them through extraClassPath (BigDL's init_spark_standalone
        # does the same); under spark-submit, its options (spark_submit_args) win.
        settings = {"spark.executor.extraClassPath": get_bigdl_classpath(), **bigdl_spark_conf(master, conf)}
        if os.environ.get("PYSPARK_GATEWAY_PORT"):  # started by spark-submit: its master and settings win
            SparkContext._ensure_initialized()
            if not bigdl_on_classpath(SparkContext._jvm):
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
        missing = missing_cluster_settings(master, {**dict(SparkConf().getAll()), **settings})
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
    if not bigdl_on_classpath(session.sparkContext._jvm):
        raise BigDLNotOnClasspath(
            "a SparkSession without BigDL's jars is already running: call "
            "pipelines.engines.bigdl_engine.bigdl_python_env() before any other session is "
            "created (BigDL's jars must be on the classpath when the JVM starts)"
        )


# ------------------------------------------------------------------------------------------------------- images


def to_image_schema(df: DataFrame, image_col: str = "image") -> DataFrame:
    """Decoded images -> Spark's image schema, as BigDL's RowToImageFeature reads it.

    df: columns `path`, `height`, `width`, `rgb` (H*W*3 uint8 bytes, RGB, row-major), as pipelines.ops.image_decode
    gives them. Returns df without `rgb`, plus `image_col`: struct(origin=path, height, width, nChannels=3,
    mode=16 (CV_8UC3), data). `data` is in BGR order: OpenCV's (and so Spark's and BigDL's) channel order for
    CV_8UC3; BigDL's ImageFeature wraps the bytes in an OpenCV Mat as they are.
    """
    _require_columns(
        df,
        ("path", "height", "width", "rgb"),
        "to_image_schema",
        "decode the image bytes first (pipelines.ops.image_decode)",
    )
    bgr = _rgb_to_bgr_udf()(F.col("path"), F.col("height").cast("int"), F.col("width").cast("int"), F.col("rgb"))
    image = F.struct(
        F.col("path").alias("origin"),
        F.col("height").cast("int").alias("height"),
        F.col("width").cast("int").alias("width"),
        F.lit(3).alias("nChannels"),
        F.lit(CV_8UC3).alias("mode"),
        bgr.alias("data"),
    )
    return df.withColumn(image_col, image.cast(IMAGE_STRUCT)).drop("rgb")


def _rgb_to_bgr_udf():
    from pyspark.sql.functions import pandas_udf

    @pandas_udf(T.BinaryType())
    def rgb_to_bgr(paths, heights, widths, rgbs):
        import numpy as np
        import pandas as pd

        out = []
        for path, height, width, rgb in zip(paths, heights, widths, rgbs):
            if rgb is None or len(rgb) != height * width * 3:
                size = None if rgb is None else len(rgb)
                raise ValueError(
                    f"to_image_schema: image '{path}': rgb has {size} bytes, expected "
                    f"height*width*3 = {height}*{width}*3; decode it with pipelines.ops.image_decode"
                )
            out.append(np.frombuffer(rgb, dtype=np.uint8).reshape(-1, 3)[:, ::-1].tobytes())
        return pd.Series(out, dtype=object)

    return rgb_to_bgr


def nnimage_reader_images(spark: SparkSession, uri: str, partitions: int, image_col: str = "image") -> DataFrame:
    """BigDL's NNImageReader over `uri` (a directory, glob or comma-separated list, as sc.binaryFiles takes).

    Returns `path`, `height`, `width` and `image_col` (the image struct, BGR), in `partitions` partitions.
    Decodes with OpenCV's IMREAD_COLOR (3 channels: alpha dropped, gray repeated), not with
    pipelines.ops.image_decode. Workaround: NNImageReader packs small files into one partition whatever
    minPartitions says (Spark's openCostInBytes), hence the repartition.
    """
    require_bigdl()
    if partitions < 1:
        raise ValueError(f"nnimage_reader_images: partitions must be >= 1, got {partitions}")
    from bigdl.dllib.nnframes import NNImageReader

    images = NNImageReader.readImages(uri, spark.sparkContext, minPartitions=partitions, image_codec=1)
    images = images.repartition(partitions)
    if image_col != "image":
        images = images.withColumnRenamed("image", image_col)
    return images.select(
        F.col(f"{image_col}.origin").alias("path"),
        F.col(f"{image_col}.height").alias("height"),
        F.col(f"{image_col}.width").alias("width"),
        F.col(image_col),
    )


# --------------------------------------------------------------------------------------------------- preprocess


def bigdl_preprocess(
    df_images: DataFrame,
    size: int | tuple[int, int],
    mean_rgb: tuple[float, float, float],
    std_rgb: tuple[float, float, float],
    image_col: str = "image",
    output_col: str = "chw",
    batch_size: int = 8,
) -> DataFrame:
    """Image struct -> `output_col`: array<float> [3*S_h*S_w], the network input in CHW order, RGB, normalized.

    size: S or (S_h, S_w). mean_rgb/std_rgb: per channel in R, G, B order, on the 0..255 scale (YOLACT: mean
    (123.68, 116.78, 103.94), std (58.40, 57.12, 57.38)). Drops `image_col`; keeps the other columns and adds
    `path`, `height`, `width` (the original size, for the postprocess) when missing.

    BigDL DLlib: ChainedPreprocessing(RowToImageFeature, ImageResize, ImageChannelNormalize, ImageMatToTensor,
    ImageFeatureToTensor) through an NNModel over a weighted identity: `(x * 1)` then a flatten.
    - BigDL's Mat is BGR: ImageChannelNormalize takes (mean_b, mean_g, mean_r, std_b, std_g, std_r), so the RGB
      constants are passed reversed. The BGR -> RGB flip the IR expects is folded into ImageMatToTensor(to_RGB=True)
      instead of a UDF after the model (same numbers, one less pass over the data).
    - Workaround: NNModel(Identity()) throws a NullPointerException (a model without weights); Mul() with its
      weight set to 1 is an identity that has one.
    - Workaround: NNModel only returns 1-D predictions per row ("unexpected batchResult dimension" for [3, H, W]),
      hence Reshape([3*H*W]). The IR needs [3][H][W]: bigdl_predict nests the flat column again.
    - Resize differs from our reference (pipelines.ops.preprocess: torch-style bilinear on float32, align_corners=False,
      no antialias). ImageResize is OpenCV INTER_LINEAR on the uint8 Mat: same sampling grid (half-pixel centres,
      edge clamp, no antialias), but 11-bit fixed-point weights and the result rounded to uint8 before the
      normalization. Measured against pipelines.ops.preprocess.preprocess_rgb (YOLACT mean/std, to 64x64): random
      uint8 images 37x53, 150x120, 300x200, 550x700: max |diff| 0.74-0.75 uint8 level, mean 0.27 level (0.013 /
      0.005 after the division by std); a smooth 480x640 gradient: max 0.38, mean 0.06 level; same size: exact.
      On the tiny test IR this moves the outputs by <= 0.005 (range ~1); Orca vs OpenVINO on the same tensor: 0.
    """
    require_bigdl()
    height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    if height < 1 or width < 1:
        raise ValueError(f"bigdl_preprocess: size must be positive, got {size}")
    mean_r, mean_g, mean_b = (float(v) for v in _three("mean_rgb", mean_rgb))
    std_r, std_g, std_b = (float(v) for v in _three("std_rgb", std_rgb))
    if min(std_r, std_g, std_b) <= 0:
        raise ValueError(f"bigdl_preprocess: std_rgb must be positive, got {std_rgb}")
    _require_columns(
        df_images,
        (image_col,),
        "bigdl_preprocess",
        "build the image struct with to_image_schema() or nnimage_reader_images()",
    )

    import numpy as np
    from bigdl.dllib.feature.common import ChainedPreprocessing
    from bigdl.dllib.feature.image import (
        ImageChannelNormalize,
        ImageFeatureToTensor,
        ImageMatToTensor,
        ImageResize,
        RowToImageFeature,
    )
    from bigdl.dllib.nn.layer import Mul, Reshape, Sequential
    from bigdl.dllib.nnframes import NNModel

    preprocessing = ChainedPreprocessing(
        [
            RowToImageFeature(),
            ImageResize(height, width),  # resize_mode=1: INTER_LINEAR
            ImageChannelNormalize(mean_b, mean_g, mean_r, std_b, std_g, std_r),  # BGR order (the Mat's)
            ImageMatToTensor(to_RGB=True),  # [3, H, W], channels flipped to RGB
            ImageFeatureToTensor(),
        ]
    )
    identity = Mul()
    identity.set_weights([np.ones((1,), dtype=np.float32)])
    model = Sequential().add(identity).add(Reshape([3 * height * width], batch_mode=True))
    nn_model = (
        NNModel(model, preprocessing).setFeaturesCol(image_col).setPredictionCol(output_col).setBatchSize(batch_size)
    )
    out = nn_model.transform(df_images)
    for name in ("path", "height", "width"):
        if name not in out.columns:
            source = "origin" if name == "path" else name
            out = out.withColumn(name, F.col(f"{image_col}.{source}"))
    return out.drop(image_col)


# ------------------------------------------------------------------------------------------------------ predict


def ir_outputs(ir_xml_path: str | Path) -> list[tuple[str, str, list[int]]]:
    """The IR's outputs in IR order: (tensor name, name in the legacy inference_engine API, shape).

    The legacy API (and so Orca's Estimator) names an output after the layer that produces it: its friendly
    name, plus ".<port>" when that layer has several outputs; not after the tensor names the exporter gave.
    """
    import openvino as ov

    model = ov.Core().read_model(str(ir_xml_path))
    outputs = []
    for output in model.outputs:
        producer = output.get_node().input_value(0)
        legacy = producer.get_node().get_friendly_name()
        if producer.get_node().get_output_size() != 1:
            legacy += f".{producer.get_index()}"
        tensor_name = output.get_any_name() if output.get_names() else legacy
        outputs.append((tensor_name, legacy, [int(d) for d in output.get_partial_shape().to_shape()]))
    return outputs


def ir_input_shape(ir_xml_path: str | Path) -> list[int]:
    """[1, C, H, W] of the IR's only input (static)."""
    import openvino as ov

    model = ov.Core().read_model(str(ir_xml_path))
    if len(model.inputs) != 1 or model.inputs[0].get_partial_shape().is_dynamic:
        raise ValueError(
            f"bigdl_predict: {ir_xml_path} must have one static input, got "
            f"{[str(i.get_partial_shape()) for i in model.inputs]}; export it with a fixed "
            "input shape (python -m model_export ...)"
        )
    shape = [int(d) for d in model.inputs[0].get_partial_shape().to_shape()]
    if len(shape) != 4:
        raise ValueError(f"bigdl_predict: {ir_xml_path} input must be [N, C, H, W], got {shape}")
    return shape


def nested_chw(flat_col: str, channels: int, height: int, width: int) -> Column:
    """array<float> [C*H*W] (CHW order) -> array<array<array<float>>> [C][H][W], natively in Spark SQL.

    Workaround: Orca feeds `np.array(column values)` to the legacy InferRequest, which cannot broadcast a flat
    [B, C*H*W] batch into the [B, C, H, W] input blob ("could not broadcast input array"); the column must
    already have the input's nesting. The paper did this with a Python UDF; slice() does it without a
    round trip through a Python worker.
    """
    plane = height * width
    return F.expr(
        f"transform(sequence(0, {channels - 1}), c -> transform(sequence(0, {height - 1}), "
        f"h -> slice({_sql_name(flat_col)}, c * {plane} + h * {width} + 1, {width})))"
    )


class Predictions(NamedTuple):
    """bigdl_predict's result: `frame`, the predictions; `persisted_input`, the nested input Orca read them from,
    persisted for them: unpersist it once `frame` is consumed (written, collected)."""

    frame: DataFrame
    persisted_input: DataFrame


def bigdl_predict(
    df: DataFrame, ir_xml_path: str | Path, input_col: str = "chw", batch_size: int = 1, precision: str = "f32"
) -> Predictions:
    """Run an OpenVINO IR over `input_col` with Orca's Estimator.from_openvino (the IR is broadcast to executors).

    input_col: array<float> [C*H*W] as bigdl_preprocess gives it, matching the IR input [1, C, H, W].
    Returns Predictions: `frame` has df's columns (except input_col) plus one array<float> column per IR output,
    named by the output's tensor name and in the IR's output order, holding that output flattened (shape without
    the batch axis, C order). batch_size: images per inference call; > 1 makes Orca reshape the IR's batch axis
    (the last batch is padded by repeating its last image), so use 1 for IRs with batch-dependent constants
    (YOLACT's reshapes). precision: f32 | bf16 | auto (OpenVINO's INFERENCE_PRECISION_HINT; auto: the device
    default, bf16 on CPUs with AVX512-BF16).

    The nested input is persisted (MEMORY_AND_DISK; `Predictions.persisted_input`): Orca's DataFrame predict
    zips the input's JVM rows with the Python workers' predictions computed from that same input, so each task
    evaluates the input twice, on two threads (the task's and the Python feeder's), from one deserialized plan.
    Shared mutable state in that plan then races: the lambda variables of nested_chw's transform(), and the one
    reused Row -> UnsafeRow serializer of any createDataFrame(RDD[Row]) upstream (NNModel's output). Measured
    before: a few images in 90 predicted from shifted input rows (raw outputs off by up to 3.8), a run stopped by
    "column 'chw' has 1051287933 values", a path of binary garbage in a standalone-cluster run. Persisted, a
    partition is computed once, under its block's write lock, and both readers get the cached copy.
    """
    require_bigdl()
    if precision not in PRECISION_HINTS:
        raise ValueError(f"bigdl_predict: precision '{precision}': choose one of {sorted(PRECISION_HINTS)}")
    if batch_size < 1:
        raise ValueError(f"bigdl_predict: batch_size must be >= 1, got {batch_size}")
    ir_xml_path = str(ir_xml_path)
    if not Path(ir_xml_path).is_file() or not Path(ir_xml_path).with_suffix(".bin").is_file():
        raise FileNotFoundError(
            f"bigdl_predict: IR {ir_xml_path} (and its .bin) not found; export one with python -m model_export"
        )
    _require_columns(df, (input_col,), "bigdl_predict", "run bigdl_preprocess() first")
    _, channels, height, width = ir_input_shape(ir_xml_path)
    outputs = ir_outputs(ir_xml_path)
    clashes = [name for name, _, _ in outputs if name in df.columns]
    if clashes:
        raise ValueError(
            f"bigdl_predict: the IR's output names {clashes} are already columns of the input; "
            "rename or drop those columns first"
        )

    if batch_size > 1:
        _check_batch_reshape(ir_xml_path, batch_size)

    from bigdl.orca.learn.openvino import Estimator

    estimator = Estimator.from_openvino(model_path=ir_xml_path)
    # Orca appends its outputs under their legacy names, in the legacy API's order: CNNNetwork keeps them in a
    # std::map, so they come sorted by name, not in the IR's order. We map them back by name.
    legacy_names = {legacy for _, legacy, _ in outputs}
    if set(estimator.output_dict) != legacy_names:
        raise RuntimeError(
            f"bigdl_predict: cannot map the IR's outputs {sorted(legacy_names)} to the legacy "
            f"API's {sorted(estimator.output_dict)}"
        )
    expected = channels * height * width
    size_error = F.raise_error(
        F.concat(
            F.lit(f"bigdl_predict: column '{input_col}' has "),
            F.size(input_col).cast("string"),
            F.lit(
                f" values, the IR {Path(ir_xml_path).name} needs {expected} ({channels}x{height}x{width}): "
                f"preprocess with size=({height}, {width})"
            ),
        )
    )
    nested_col = f"__{input_col}_nested"
    feed = (
        df.withColumn(
            nested_col,
            F.when(F.size(input_col) == expected, nested_chw(input_col, channels, height, width)).otherwise(size_error),
        )
        .drop(input_col)
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    config = {"CPU_THREADS_NUM": str(estimator.core_num), "CPU_BIND_THREAD": "HYBRID_AWARE"}  # Orca's defaults
    if PRECISION_HINTS[precision]:
        config["INFERENCE_PRECISION_HINT"] = PRECISION_HINTS[precision]
    predicted = estimator.predict(feed, feature_cols=[nested_col], batch_size=batch_size, config=config)
    # Orca's columns nest like the output's shape ([1, 3] -> array<array<float>>); flatten them to array<float>.
    keep = [F.col(_sql_name(c)) for c in df.columns if c != input_col]
    results = []
    for tensor_name, legacy, shape in outputs:
        column = F.col(_sql_name(legacy))
        for _ in range(max(len(shape) - 1, 0)):
            column = F.flatten(column)
        results.append(column.alias(tensor_name))
    return Predictions(predicted.select(*keep, *results), feed)


def _check_batch_reshape(ir_xml_path: str, batch_size: int) -> None:
    """Orca sets `net.batch_size = batch_size` on every executor; fail on the driver, clearly, when the IR cannot
    take it (YOLACT: "Interpolate layer only supports resize on spatial dimensions" from load_network)."""
    from openvino.inference_engine import IECore

    engine = IECore()
    network = engine.read_network(model=ir_xml_path, weights=str(Path(ir_xml_path).with_suffix(".bin")))
    try:
        network.batch_size = batch_size
        engine.load_network(network=network, device_name="CPU", num_requests=1)
    except RuntimeError as error:
        raise ValueError(
            f"bigdl_predict: {Path(ir_xml_path).name} cannot run batches of {batch_size} "
            f"({str(error).strip().splitlines()[-1]}); use batch_size=1"
        ) from error


# ------------------------------------------------------------------------------------------------------ helpers


def _require_columns(df: DataFrame, names, stage: str, fix: str) -> None:
    missing = [name for name in names if name not in df.columns]
    if missing:
        raise ValueError(f"{stage}: input has no column(s) {missing} (columns: {df.columns}); {fix}")


def _three(name: str, values) -> tuple:
    values = tuple(values)
    if len(values) != 3:
        raise ValueError(f"bigdl_preprocess: {name} needs 3 values (R, G, B), got {values}")
    return values


def _sql_name(name: str) -> str:
    """A column name quoted for SQL expressions (names from the legacy API may contain dots)."""
    return "`" + name.replace("`", "``") + "`"


if __name__ == "__main__":  # python -m pipelines.engines.bigdl_engine --spark-submit-args
    if sys.argv[1:] != ["--spark-submit-args"]:
        sys.exit(
            "usage: python -m pipelines.engines.bigdl_engine --spark-submit-args  (prints spark-submit's "
            "options for BigDL's jars)"
        )
    print(shlex.join(spark_submit_args()))
