"""The bigdl engine's stages, each a DataFrame -> DataFrame function (BigDL 2.4: DLlib image preprocessing, Orca's
OpenVINO Estimator):
  decoded images (path, height, width, rgb)  --to_image_schema-->  Spark image struct (BGR bytes)
  image struct  --bigdl_preprocess-->  chw: flat array<float> [3*S_h*S_w], RGB, normalized (DLlib ChainedPreprocessing
                                       through an NNModel over a weighted identity)
  chw  --bigdl_predict-->  one flat array<float> column per IR output (Orca Estimator.from_openvino, the model
                           broadcast to every executor)
or `nnimage_reader_images` (BigDL's own reader, decodes with OpenCV) instead of the first step.

BigDL and OpenVINO are imported inside the functions: they exist only in the BigDL env (pipelines.engines.bigdl_engine),
and every stage calls `require_bigdl()` first.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.engines.bigdl_engine import require_bigdl

# --precision f32|bf16|auto -> INFERENCE_PRECISION_HINT
from pipelines.inference.openvino_runtime import PRECISION_HINTS
from pipelines.spark.session_kind import classic_context

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

    images = NNImageReader.readImages(
        uri, classic_context(spark, "the bigdl engine"), minPartitions=partitions, image_codec=1
    )
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
      normalization: within a uint8 level of the reference, exact at the same size (test_bigdl_engine.py
      measures it).
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
    reused Row -> UnsafeRow serializer of any createDataFrame(RDD[Row]) upstream (NNModel's output); unpersisted, a
    few images were predicted from shifted input rows. Persisted, a partition is computed once, under its block's
    write lock, and both readers get the cached copy.
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
