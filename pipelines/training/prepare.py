"""Prepare a training set once, with Spark: images + annotations (a COCO instances JSON, or a local folder of Pascal
VOC XML files) -> Parquet shards each rank reads its part of.

    report = prepare_training_data(spark, PrepareSpec(images_uri, annotations_uri, out_uri, class_names))

Writes under ``out_uri``:
- ``train/`` and ``val/``: Parquet, one row per usable image: ``image_id``, ``file_name``, ``width``, ``height``,
  ``image`` (the original encoded bytes), ``labels`` (0-based foreground class per object, the model's
  ``class_names`` order), ``boxes`` (flat x1,y1,x2,y2 pixels per object), ``rles`` (COCO compressed RLE counts per
  object, masks of height x width); ``shard=k`` sub-directories, small row groups so a rank reads only what it
  needs (``pipelines.training.shards``);
- ``val_annotations.json``: COCO ground truth of the usable val images (for pycocotools);
- ``skipped/``: Parquet rows ``file_name``, ``split``, ``reason``, ``message`` of every image left out;
- ``prepare_report.json``: counts per reason (``no_annotations``, ``corrupt``, ``missing``, ``size_mismatch``)
  and the input signature; a later run with the same signature reuses the shards instead of preparing again.

Bad images never stop the job: each is counted and listed. Crowd annotations are left out (the loss has no crowd
handling); an object without a segmentation gets its box as its mask.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.datasets import coco_to_dataset, dataset_to_coco, split_train_val
from pipelines.datasets.coco import parse_coco_json
from pipelines.datasets.schema import Dataset
from pipelines.datasets.voc import read_voc_files
from pipelines.errors import UsageError
from pipelines.inference.image_sources import empty_files
from pipelines.io import storage, uris
from pipelines.ops.image_decode import ImageDecodeError, decode_image
from pipelines.spark.session_kind import qualify_root
from pipelines.training.shard_rows import image_rows as _rows
from pipelines.training.shards import VAL_ANNOTATIONS_NAME

REPORT_NAME = "prepare_report.json"
SKIP_REASONS = ("no_annotations", "missing", "corrupt", "size_mismatch")
ROW_GROUP_BYTES = 1 << 20
ROW_SCHEMA = T.StructType(
    [
        T.StructField("image_id", T.LongType(), False),
        T.StructField("file_name", T.StringType(), False),
        T.StructField("split", T.StringType(), False),
        T.StructField("shard", T.IntegerType(), False),
        T.StructField("width", T.IntegerType(), False),
        T.StructField("height", T.IntegerType(), False),
        T.StructField("labels", T.ArrayType(T.IntegerType()), False),
        T.StructField("boxes", T.ArrayType(T.FloatType()), False),
        T.StructField("rles", T.ArrayType(T.StringType()), False),
    ]
)
CHECKED_SCHEMA = T.StructType(
    ROW_SCHEMA.fields
    + [
        T.StructField("image", T.BinaryType(), True),
        T.StructField("reason", T.StringType(), True),
        T.StructField("message", T.StringType(), True),
    ]
)


@dataclass(frozen=True)
class PrepareSpec:
    """images_uri: the folder the COCO ``file_name`` values are relative to; annotations_uri: the COCO JSON;
    out_uri: where shards go; class_names: the model's foreground classes (dataset categories are mapped by name).
    val_fraction/split_seed: the deterministic split (pipelines.datasets.split_train_val)."""

    images_uri: str
    annotations_uri: str
    out_uri: str
    class_names: tuple[str, ...]
    num_shards: int = 4
    val_fraction: float = 0.2
    split_seed: int = 0
    reprepare: bool = False


@dataclass
class PrepareReport:
    signature: str
    counts: dict  # {"train": {"ok": n, "no_annotations": n, ...}, "val": {...}}
    out_uri: str
    reused: bool = False

    def usable(self, split: str) -> int:
        return int(self.counts.get(split, {}).get("ok", 0))

    def skipped(self, split: str | None = None) -> dict:
        splits = [split] if split else list(self.counts)
        return {reason: sum(int(self.counts.get(s, {}).get(reason, 0)) for s in splits) for reason in SKIP_REASONS}


def prepare_training_data(spark: SparkSession, spec: PrepareSpec) -> PrepareReport:
    """Validate and shard the data set (or reuse a previous preparation with the same signature)."""
    if spec.num_shards < 1:
        raise UsageError(f"data.num_shards={spec.num_shards} must be >= 1")
    for uri, key, what in (
        (spec.annotations_uri, "data.annotations", "COCO instances JSON or folder of VOC XML"),
        (spec.images_uri, "data.images", "images folder"),
    ):
        if not storage.exists(uri):
            raise UsageError(
                f"{uri}: no such {what}: check {key} (a synthetic set to try the job with: python -m "
                "pipelines.datasets.synthetic_roads --out DIR --count 200 --seed 1, then data.images="
                "DIR/images data.annotations=DIR/annotations.json)"
            )
    raw, read_dataset = annotations_source(spec)
    signature = _signature(spec, raw)
    report_uri = uris.join_uri(spec.out_uri, REPORT_NAME)
    if not spec.reprepare and storage.exists(report_uri):
        previous = json.loads(storage.read_bytes(report_uri))
        if previous.get("signature") == signature:
            return PrepareReport(signature, previous["counts"], spec.out_uri, reused=True)
    dataset = read_dataset()
    class_of = _class_index(dataset, spec)
    train, val = split_train_val(dataset, spec.val_fraction, spec.split_seed)
    rows = _rows(train, "train", class_of, spec.num_shards) + _rows(val, "val", class_of, 1)
    annotated = spark.createDataFrame(rows, ROW_SCHEMA)
    checked = _check_images(spark, annotated, spec.images_uri).persist()
    try:
        counts = _counts(checked)
        _write(checked, spec.out_uri)
        ok_val = {r.image_id for r in checked.where("split = 'val' AND reason IS NULL").select("image_id").collect()}
    finally:
        checked.unpersist()
    val_coco = dataset_to_coco(val.with_images([im for im in val.images if im.id in ok_val]))
    storage.write_bytes_atomic(uris.join_uri(spec.out_uri, VAL_ANNOTATIONS_NAME), json.dumps(val_coco).encode())
    report = PrepareReport(signature, counts, spec.out_uri)
    storage.write_bytes_atomic(report_uri, json.dumps({**asdict(report), "spec": asdict(spec)}, indent=2).encode())
    return report


def annotations_source(spec: PrepareSpec) -> tuple[bytes, Callable[[], Dataset]]:
    """(the annotations' bytes, for the preparation's signature; a reader of them as a Dataset): a COCO instances
    JSON (any store), or a local folder of Pascal VOC XML files (labelImg's; boxes, `<filename>` relative to
    data.images; `<name>` one of the model's classes)."""
    local = uris.to_local_path(spec.annotations_uri) if uris.is_local(spec.annotations_uri) else None
    if local is None or not Path(local).is_dir():
        raw = storage.read_bytes(spec.annotations_uri)
        return raw, lambda: coco_to_dataset(parse_coco_json(raw, spec.annotations_uri), spec.annotations_uri)
    files = sorted(Path(local).rglob("*.xml"))
    if not files:
        raise UsageError(
            f"{spec.annotations_uri}: a folder without *.xml files: point data.annotations at a COCO "
            "instances JSON or a folder of VOC XML files"
        )
    contents = [path.read_bytes() for path in files]  # read once: the signature's bytes are what is parsed
    raw = b"".join(
        str(path.relative_to(local)).encode() + b"\0" + content + b"\0" for path, content in zip(files, contents)
    )
    return raw, lambda: read_voc_files(files, spec.class_names, contents=contents)


def _signature(spec: PrepareSpec, annotations: bytes) -> str:
    key = {k: v for k, v in asdict(spec).items() if k not in ("out_uri", "reprepare")}
    key["annotations_sha256"] = hashlib.sha256(annotations).hexdigest()
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def _class_index(dataset: Dataset, spec: PrepareSpec) -> dict[int, int]:
    """COCO category id -> 0-based model class, by name; a dataset class the model lacks is an error."""
    wanted = {name: i for i, name in enumerate(spec.class_names)}
    unknown = [c.name for c in dataset.categories if c.name not in wanted]
    if unknown:
        raise UsageError(
            f"{spec.annotations_uri}: categories {unknown} are not model classes {list(spec.class_names)}:"
            " list them in model.class_names (the classes to train; the config's by default)"
        )
    return {c.id: wanted[c.name] for c in dataset.categories}


def _check_images(spark: SparkSession, annotated: DataFrame, images_uri: str) -> DataFrame:
    """Join the image bytes and give each row a skip reason (NULL when usable)."""
    root = storage.to_spark_uri(images_uri).rstrip("/")
    source = (
        spark.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .load(storage.spark_read_path(images_uri).rstrip("/"))
    )

    # zero-byte files are not in Spark's scan: added back without bytes, they are "corrupt (empty)", not "missing"
    empty = empty_files(spark, source, source.select("path")).select("path", F.unhex(F.lit("")).alias("content"))
    files = source.select("path", "content").unionByName(empty)
    qualified = qualify_root(spark, root).rstrip("/") + "/"
    files = files.select(
        F.expr(f"substring(path, {len(qualified) + 1})").alias("file_name"), F.col("content").alias("image")
    )
    joined = annotated.join(files, "file_name", "left")
    return joined.mapInPandas(_classify_batches, CHECKED_SCHEMA)


def _classify_batches(batches):
    for frame in batches:
        reasons, messages = [], []
        for row in frame.itertuples(index=False):
            reason = message = None
            if len(row.labels) == 0:
                reason, message = "no_annotations", "no (non-crowd) annotations: nothing to learn from"
            elif row.image is None:
                reason, message = "missing", "listed in the annotations but not found under the images folder"
            else:
                try:
                    height, width = decode_image(bytes(row.image), row.file_name).shape[:2]
                    if (width, height) != (row.width, row.height):
                        reason = "size_mismatch"
                        message = f"image is {width}x{height}, annotations say {row.width}x{row.height}"
                except ImageDecodeError as err:
                    reason, message = "corrupt", str(err)
            reasons.append(reason)
            messages.append(message)
        yield frame.assign(reason=reasons, message=messages)[[f.name for f in CHECKED_SCHEMA.fields]]


def _counts(checked: DataFrame) -> dict:
    counts: dict[str, dict[str, int]] = {"train": {"ok": 0}, "val": {"ok": 0}}
    grouped = checked.groupBy("split", F.coalesce("reason", F.lit("ok")).alias("reason")).count().collect()
    for row in grouped:
        counts.setdefault(row["split"], {"ok": 0})[row["reason"]] = int(row["count"])
    for split in counts.values():
        for reason in SKIP_REASONS:
            split.setdefault(reason, 0)
    return counts


def _write(checked: DataFrame, out_uri: str) -> None:
    base = storage.to_spark_uri(out_uri).rstrip("/")
    ok = checked.where("reason IS NULL").drop("reason", "message")
    for split in ("train", "val"):
        part = ok.where(F.col("split") == split).drop("split")
        shards = max(1, part.select("shard").distinct().count())
        (
            part.repartition(shards, "shard")
            .sortWithinPartitions("image_id")
            .write.mode("overwrite")
            .option("parquet.block.size", ROW_GROUP_BYTES)
            .partitionBy("shard")
            .parquet(f"{base}/{split}")
        )
    (
        checked.where("reason IS NOT NULL")
        .select("file_name", "split", "reason", "message")
        .coalesce(1)
        .write.mode("overwrite")
        .parquet(f"{base}/skipped")
    )


def read_skipped(spark: SparkSession, out_uri: str) -> pd.DataFrame:
    """The skipped images of a preparation (file_name, split, reason, message)."""
    return spark.read.parquet(storage.spark_read_path(out_uri).rstrip("/") + "/skipped").toPandas()
