"""Spark's own recipe for model inference, at default settings: binaryFile -> a pandas UDF that decodes and
preprocesses -> `pyspark.ml.functions.predict_batch_udf` running the OpenVINO IR (compiled with OpenVINO's
defaults, only the precision set) -> a pandas UDF for the YOLACT postprocess (same numpy code as the job,
RLE masks) -> Parquet. What a user writes from the Spark docs without sparkseg's partitioning, model cache and
thread settings; the bench row that shows what those are worth.

    python scripts/bench/udf_recipe.py --model EXPORT_DIR --images DIR --out DIR [--master local[2]] \
        [--precision f32|bf16] [--batch-size 8]

Prints one JSON line: images, seconds (from the first action to the written Parquet; session start excluded),
images_per_s, partitions.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd  # module level: pandas_udf reads the type hints in this module's globals

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))


def run(model_dir, images, out, master, precision, batch_size):
    """Run the recipe; return the measurements (see the module docstring)."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import SparkSession
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from pipelines.inference.model_manifest import load_manifest

    manifest = load_manifest(model_dir, verify=True)
    spec, post, classes = manifest.input, manifest.postprocess, tuple(manifest.class_names)
    _, channels, height, width = spec["shape"]
    xml, priors_path = str(manifest.path("ir_xml")), str(manifest.path("priors"))
    names = ["loc", "conf", "mask", "proto"]
    from pipelines.inference.openvino_runtime import openvino_core

    # each output's shape without its batch axis, to undo the flattening predict_batch_udf's arrays need
    shapes = {
        out.get_any_name(): tuple(out.get_partial_shape().to_shape())[1:]
        for out in openvino_core().read_model(xml).outputs
    }

    spark = (
        SparkSession.builder.master(master)
        .appName("sparkseg-bench-predict-batch-udf")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")

    @F.pandas_udf("struct<width:int, height:int, tensor:array<float>>")
    def preprocess(content: pd.Series) -> pd.DataFrame:
        from pipelines.ops.image_decode import decode_image
        from pipelines.ops.preprocess import preprocess_rgb

        out = {"width": [], "height": [], "tensor": []}
        for data in content:
            rgb = decode_image(bytes(data), "image")
            out["height"].append(rgb.shape[0])
            out["width"].append(rgb.shape[1])
            out["tensor"].append(preprocess_rgb(rgb, spec).reshape(-1))
        return pd.DataFrame(out)

    def make_predict_fn():
        from pipelines.inference.openvino_runtime import openvino_core

        config = {"INFERENCE_PRECISION_HINT": precision}
        compiled = openvino_core().compile_model(xml, "CPU", config)

        def predict(inputs: np.ndarray) -> dict:
            results = [compiled(image[None]) for image in inputs]
            return {name: np.stack([r[compiled.output(name)].reshape(-1) for r in results]) for name in names}

        return predict

    outputs_type = T.StructType([T.StructField(name, T.ArrayType(T.FloatType())) for name in names])
    infer = predict_batch_udf(
        make_predict_fn,
        return_type=outputs_type,
        batch_size=batch_size,
        input_tensor_shapes=[[channels, height, width]],
    )

    @F.pandas_udf("string")
    def postprocess(outputs: pd.DataFrame, widths: pd.Series, heights: pd.Series) -> pd.Series:
        from pipelines.inference.image_inference import ExecutorModel
        from pipelines.inference.openvino_runtime import RuntimeSettings
        from pipelines.inference.yolact_inference import YolactInference
        from pipelines.io.storage import Location

        task = YolactInference(
            model_dir=model_dir,
            model_sha256="",
            class_names=classes,
            input_spec=spec,
            postprocess=post,
            settings=RuntimeSettings(),
            output=Location(""),
            input_root="",
            masks="rle",
        )
        model = ExecutorModel(None, None, {"priors": np.load(priors_path)})
        results = []
        for index in range(len(outputs)):
            raw = {
                name: np.asarray(outputs[name].iloc[index], dtype=np.float32).reshape(shapes[name]) for name in names
            }
            row = {
                "width": int(widths.iloc[index]),
                "height": int(heights.iloc[index]),
                "timings": {"postprocess_s": 0.0},
            }
            task.postprocess_one(row, raw, model)
            results.append(json.dumps(row["instances"]))
        return pd.Series(results)

    started = time.perf_counter()
    files = spark.read.format("binaryFile").option("pathGlobFilter", "*.jpg").load(images)
    partitions = files.rdd.getNumPartitions()
    pre = files.select("path", preprocess("content").alias("pre"))
    predicted = pre.select("path", "pre.width", "pre.height", infer("pre.tensor").alias("out"))
    results = predicted.select("path", postprocess("out", "width", "height").alias("instances"))
    results.write.mode("overwrite").parquet(out)
    seconds = time.perf_counter() - started
    written = spark.read.parquet(out).count()
    spark.stop()
    return {
        "images": written,
        "seconds": round(seconds, 3),
        "images_per_s": round(written / seconds, 3),
        "partitions": partitions,
        "settings": {
            "master": master,
            "precision": precision,
            "batch_size": batch_size,
            "openvino": "compile_model defaults + INFERENCE_PRECISION_HINT",
        },
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--images", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)
    print(
        json.dumps(
            run(args.model, str(Path(args.images).resolve()), args.out, args.master, args.precision, args.batch_size)
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
