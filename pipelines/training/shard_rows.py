"""The rows of prepared training shards, in plain Python (no Spark): the Spark preparation
(``pipelines.training.prepare``) builds its rows with ``image_rows``; ``write_plain_shards`` writes the same
Parquet layout (``train/shard=k/``) with pyarrow alone, for machines without Java (the GPU benchmark) and tests.

Row: image_id, file_name, width, height, image (encoded bytes), labels (0-based model classes), boxes (flat
x1,y1,x2,y2 pixels per object), rles (COCO compressed RLE counts per object); see ``prepare``.
"""

from __future__ import annotations

from pathlib import Path

from pipelines.datasets import to_coco_rle
from pipelines.datasets.schema import Dataset, ImageRecord

PLAIN_ROWS_PER_GROUP = 8


def image_rows(dataset: Dataset, split: str, class_of: dict[int, int], num_shards: int) -> list[tuple]:
    rows = []
    for position, image in enumerate(sorted(dataset.images, key=lambda im: im.id)):
        labels, boxes, rles = object_columns(image, class_of)
        rows.append(
            (
                int(image.id),
                image.file_name,
                split,
                position % num_shards,
                int(image.width),
                int(image.height),
                labels,
                boxes,
                rles,
            )
        )
    return rows


def object_columns(image: ImageRecord, class_of: dict[int, int]) -> tuple[list[int], list[float], list[str]]:
    labels, boxes, rles = [], [], []
    for ann in image.annotations:
        if ann.iscrowd:
            continue
        x1, y1, x2, y2 = (float(v) for v in ann.box)
        if ann.segmentation is not None:
            rle = to_coco_rle(ann.segmentation, image.height, image.width)
        else:
            from pycocotools import mask as mask_utils

            rle = mask_utils.merge(
                mask_utils.frPyObjects([[x1, y1, x2, y1, x2, y2, x1, y2]], image.height, image.width)
            )
        labels.append(class_of[ann.category_id])
        boxes.extend([x1, y1, x2, y2])
        counts = rle["counts"]
        rles.append(counts.decode("ascii") if isinstance(counts, bytes) else counts)
    return labels, boxes, rles


def write_plain_shards(
    dataset: Dataset,
    images_dir: str | Path,
    out_dir: str | Path,
    class_names: tuple[str, ...],
    num_shards: int = 4,
    split: str = "train",
) -> int:
    """Every image of dataset (no validation of the images: they are trusted) -> out_dir/split/shard=k/*.parquet
    in small row groups, readable by ``shards.ShardIndex``. Returns the row count."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    wanted = {name: i for i, name in enumerate(class_names)}
    class_of = {c.id: wanted[c.name] for c in dataset.categories if c.name in wanted}
    rows = [r for r in image_rows(dataset, split, class_of, num_shards) if r[6]]  # objects only, as prepare
    for shard in range(num_shards):
        mine = [r for r in rows if r[3] == shard]
        if not mine:
            continue
        columns = {
            "image_id": [r[0] for r in mine],
            "file_name": [r[1] for r in mine],
            "width": [r[4] for r in mine],
            "height": [r[5] for r in mine],
            "image": [(Path(images_dir) / r[1]).read_bytes() for r in mine],
            "labels": [r[6] for r in mine],
            "boxes": [r[7] for r in mine],
            "rles": [r[8] for r in mine],
        }
        schema = pa.schema(
            [
                ("image_id", pa.int64()),
                ("file_name", pa.string()),
                ("width", pa.int32()),
                ("height", pa.int32()),
                ("image", pa.binary()),
                ("labels", pa.list_(pa.int32())),
                ("boxes", pa.list_(pa.float32())),
                ("rles", pa.list_(pa.string())),
            ]
        )
        target = Path(out_dir) / split / f"shard={shard}"
        target.mkdir(parents=True, exist_ok=True)
        pq.write_table(
            pa.table(columns, schema=schema), target / "part-00000.parquet", row_group_size=PLAIN_ROWS_PER_GROUP
        )
    return len(rows)
