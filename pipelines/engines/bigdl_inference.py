"""The bigdl engine as an Engine (pipelines.inference.engine), `BigDLEngine`: a wave DataFrame in, RESULT_SCHEMA rows
out, as the native engine's, so the writers, resume and summary are shared.

The paper's stages, with BigDL's own classes (pipelines.engines.bigdl_stages):
  image bytes -> decode on executors (our decoder: EXIF, CMYK, 16-bit...; failures become error rows)
  -> Spark image struct (BGR) -> DLlib ChainedPreprocessing through NNModel (resize, channel normalize, to tensor)
  -> Orca Estimator.from_openvino predict (the IR broadcast to every worker)
  -> the family's postprocess (the same numpy code as the native engine) -> masks written, rows out.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass

import numpy as np
import pandas as pd
from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.engines.bigdl_engine import bigdl_job_session, require_bigdl
from pipelines.engines.bigdl_stages import CV_8UC3, bigdl_predict, bigdl_preprocess, ir_outputs
from pipelines.errors import UsageError
from pipelines.inference.executor_cache import LazyModel
from pipelines.inference.image_inference import (
    RESULT_COLUMNS,
    ImageInference,
    fail,
    load_executor_model,
    new_row,
    timed,
)
from pipelines.inference.model_manifest import ModelManifest
from pipelines.job_config import SparkSettings
from pipelines.ops.image_decode import decode_image
from pipelines.results.result_schema import FRAME_COLUMNS, INSTANCES_TYPE, RESULT_SCHEMA

DECODED_SCHEMA = (
    "path string, size long, modification_time timestamp, height int, width int, "
    "image struct<origin:string, height:int, width:int, nChannels:int, mode:int, data:binary>, "
    "error_stage string, error_type string, error_message string, "
    "timings struct<read_s:double, preprocess_s:double, infer_s:double, postprocess_s:double, write_s:double>"
)


@dataclass(frozen=True)
class DecodeForBigDL:
    """mapInPandas: bytes -> Spark's image struct for BigDL's RowToImageFeature, or an error row."""

    task: ImageInference

    def __call__(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        guard = self.task.crash_guard.for_task() if self.task.crash_guard is not None else None
        for batch in batches:
            out = []
            for record in batch.itertuples(index=False):
                row = new_row(record)
                row.update(image=None)
                try:
                    with timed(row, "read"):
                        data = record.content if "content" in batch.columns else None
                        if data is None and self.task.fetch_bytes is not None:
                            data = self.task.fetch_bytes(record.path)
                    with timed(row, "preprocess"):
                        if guard is not None:
                            guard.check(record.path)
                            guard.in_flight([record.path])
                        rgb = decode_image(bytes(data), record.path, self.task.max_image_pixels)
                        height, width = int(rgb.shape[0]), int(rgb.shape[1])
                        # BigDL wraps `data` in an OpenCV Mat as it is: CV_8UC3 means BGR order.
                        row.update(
                            height=height,
                            width=width,
                            image={
                                "origin": record.path,
                                "height": height,
                                "width": width,
                                "nChannels": 3,
                                "mode": CV_8UC3,
                                "data": np.ascontiguousarray(rgb[..., ::-1]).tobytes(),
                            },
                        )
                except Exception as err:  # noqa: BLE001  (every failure becomes an error row)
                    fail(row, err)
                out.append(row)
            yield pd.DataFrame(out, columns=DECODED_COLUMNS)
        if guard is not None:
            guard.done()


DECODED_COLUMNS = [
    "path",
    "size",
    "modification_time",
    "height",
    "width",
    "image",
    "error_stage",
    "error_type",
    "error_message",
    "timings",
]


@dataclass(frozen=True)
class PostprocessRaw:
    """mapInPandas: the IR's flat outputs (one array<float> column per output) -> result rows."""

    task: ImageInference
    output_shapes: dict  # tensor name -> shape without the batch axis

    def __call__(self, batches: Iterator[pd.DataFrame]) -> Iterator[pd.DataFrame]:
        task = self.task
        model = LazyModel(
            (task.model_sha256, "arrays"), lambda: load_executor_model(task.model_dir, task.model_sha256, None)
        )()
        names = model.manifest.outputs
        resumed = time.perf_counter()
        for batch in batches:
            # Orca's predict runs as its rows are pulled: the wait for a batch is its inference, shared by its rows
            infer_s = (time.perf_counter() - resumed) / max(len(batch), 1)
            rows = []
            for record in batch.itertuples(index=False):
                row = new_row(record)
                row.update(
                    width=int(record.width),
                    height=int(record.height),
                    timings={**dict(record.timings), "infer_s": infer_s},
                )
                try:
                    raw = {
                        role: np.asarray(getattr(record, name), dtype=np.float32).reshape(self.output_shapes[name])
                        for role, name in names.items()
                    }
                    task.postprocess_one(row, raw, model)
                    row["status"] = "ok"
                except Exception as err:  # noqa: BLE001
                    fail(row, err, stage="postprocess")
                rows.append(row)
            if task.progress is not None:
                task.progress.add(len(rows))
            yield pd.DataFrame(rows, columns=RESULT_COLUMNS)
            resumed = time.perf_counter()


def bigdl_results(
    wave: DataFrame, task: ImageInference, manifest: ModelManifest, precision: str
) -> tuple[DataFrame, list[DataFrame]]:
    """The wave's images through BigDL preprocessing and Orca's OpenVINO Estimator: (RESULT_SCHEMA rows, the
    frames persisted for them: unpersist those once the rows are written). `decoded` feeds two branches (images,
    error rows): persisted, each image is decoded once; bigdl_predict persists its own input (see there)."""
    decoded = wave.mapInPandas(DecodeForBigDL(task), DECODED_SCHEMA).persist(StorageLevel.MEMORY_AND_DISK)
    failed = decoded.where("image IS NULL").select(
        "path",
        F.lit("error").alias("status"),
        "width",
        "height",
        F.lit(None).cast(INSTANCES_TYPE).alias("instances"),
        F.lit(None).cast("string").alias("mask_path"),
        "error_stage",
        "error_type",
        "error_message",
        "size",
        "modification_time",
        *[F.lit(None).cast(kind).alias(name) for name, kind in FRAME_COLUMNS.items()],
        "timings",
    )
    images = decoded.where("image IS NOT NULL").select(
        "path", "size", "modification_time", "height", "width", "timings", "image"
    )
    height, width = manifest.input_size
    chw = bigdl_preprocess(images, (height, width), tuple(manifest.input["mean"]), tuple(manifest.input["std"]))
    xml = manifest.path("ir_xml")
    raw, nested_input = bigdl_predict(chw, xml, precision=precision)
    shapes = {name: shape[1:] for name, _, shape in ir_outputs(xml)}
    done = raw.mapInPandas(PostprocessRaw(task, shapes), RESULT_SCHEMA)
    return done.unionByName(failed), [decoded, nested_input]


class BigDLEngine:
    """The bigdl engine (pipelines.inference.engine.Engine): its own env, BigDL's jars in the session; its executors
    run no Python model, so there is nothing to warm up; images only."""

    name: str = "bigdl"
    takes_videos: bool = False
    azure_sdk_fix: str = (
        "the bigdl engine's env (make bigdl-env) has no Azure SDK: run this input or output with --engine "
        "native, or read it as abfss:// through Spark's hadoop-azure"
    )
    env_hint: str | None = "make bigdl-env"
    worker_modules: tuple[str, ...] = ()  # classic sessions only: the workers run the job's own env

    def require(self) -> None:
        require_bigdl()

    def session(self, settings: SparkSettings) -> SparkSession:
        remote = settings.remote or os.environ.get("SPARK_REMOTE")
        if remote:
            raise UsageError(
                f"{remote}: the bigdl engine runs BigDL's JVM library beside the driver and needs a classic session, "
                "not a Spark Connect one: drop --remote (spark.remote, SPARK_REMOTE) or use --engine native"
            )
        return bigdl_job_session(settings)

    def start_workers(self, spark: SparkSession, run_id: str) -> AbstractContextManager:
        return contextlib.nullcontext()

    def warm_up(
        self, spark: SparkSession, task: ImageInference, partitions: int, run_id: str
    ) -> AbstractContextManager:
        return contextlib.nullcontext()

    def results(
        self, images: DataFrame, task: ImageInference, manifest: ModelManifest, precision: str
    ) -> tuple[DataFrame, list[DataFrame]]:
        return bigdl_results(images, task, manifest, precision)
