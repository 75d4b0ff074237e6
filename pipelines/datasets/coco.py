"""COCO JSON: ``images``, ``annotations`` (bbox ``[x, y, w, h]``, polygon or RLE segmentation, area, iscrowd),
``categories``, ``info``.

The COCO bbox is continuous pixels like the internal box: ``x1 = x, x2 = x + w``. Errors name the file and the
JSON field, with list positions counted from 0 (``annotations[4].bbox``). VOC's ``difficult``, ``truncated`` and
``pose`` are written as extra annotation keys only when they differ from their defaults (COCO tools ignore them).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pipelines.datasets.masks import mask_area
from pipelines.datasets.schema import (
    Annotation,
    AnnotationError,
    Category,
    Dataset,
    ImageRecord,
    PolygonMask,
    RleMask,
    Segmentation,
)
from pipelines.datasets.voc import POSES_DEFAULT

# Boxes may pass the image edge by this many pixels (float rounding in exported files) before it is an error.
BOX_TOLERANCE_PX = 0.01


def read_coco(path: str | Path, class_names: Sequence[str] | None = None, clip_boxes: bool = False) -> Dataset:
    """A COCO JSON file -> Dataset (category ids as in the file).

    ``class_names``: when given, every category name must be one of them.
    ``clip_boxes``: clip boxes that reach outside the image instead of failing.
    """
    path_str = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path_str}: no such COCO annotation file") from None
    return coco_to_dataset(parse_coco_json(text, path_str), path_str, class_names=class_names, clip_boxes=clip_boxes)


def parse_coco_json(raw: str | bytes, path: str) -> Any:
    """The parsed JSON of the annotation file `path`; JSON that does not parse is an AnnotationError naming where."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as err:
        raise AnnotationError(
            path, "json", f"malformed JSON at line {err.lineno}, column {err.colno} ({err.msg}): fix the file"
        ) from None
    except UnicodeDecodeError as err:
        raise AnnotationError(
            path, "json", f"not UTF-8 text ({err.reason} at byte {err.start}): is it a JSON file?"
        ) from None


def coco_to_dataset(
    data: Any, path: str = "<coco>", class_names: Sequence[str] | None = None, clip_boxes: bool = False
) -> Dataset:
    """A parsed COCO dict -> Dataset; ``path`` is used in error messages."""
    return _CocoReader(path, class_names, clip_boxes).dataset(data)


class _CocoReader:
    def __init__(self, path: str, class_names: Sequence[str] | None, clip_boxes: bool):
        self.path = path
        self.class_names = list(class_names) if class_names is not None else None
        self.clip_boxes = clip_boxes

    def fail(self, field: str, problem: str) -> AnnotationError:
        return AnnotationError(self.path, field, problem)

    def key(self, obj: Any, key: str, where: str, kind: type | tuple[type, ...]) -> Any:
        field = f"{where}.{key}" if where else key
        if not isinstance(obj, dict):
            raise self.fail(where or "json", f"{where or 'the file'} must be a JSON object")
        if key not in obj:
            raise self.fail(field, f"{field} is missing: add it")
        value = obj[key]
        if isinstance(value, bool) or not isinstance(value, kind):
            names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            raise self.fail(field, f"{field}={_short(value)} must be of type {names}")
        return value

    def dataset(self, data: Any) -> Dataset:
        categories = self.categories(self.key(data, "categories", "", list))
        images = self.images(self.key(data, "images", "", list))
        by_id = {im.id: im for im in images}
        known = {c.id for c in categories}
        ann_ids: dict[int, int] = {}
        for i, raw in enumerate(self.key(data, "annotations", "", list)):
            where = f"annotations[{i}]"
            image_id = self.key(raw, "image_id", where, int)
            image = by_id.get(image_id)
            if image is None:
                raise self.fail(
                    f"{where}.image_id",
                    f"{where}.image_id={image_id} is not the id of any image: fix the id or add the image",
                )
            ann = self.annotation(raw, where, image, known)
            if ann.id is not None:
                if ann.id in ann_ids:
                    raise self.fail(
                        f"{where}.id",
                        f"{where}.id={ann.id} duplicates annotations[{ann_ids[ann.id]}].id:"
                        " annotation ids must be unique",
                    )
                ann_ids[ann.id] = i
            image.annotations.append(ann)
        info = data.get("info", {})
        if not isinstance(info, dict):
            raise self.fail("info", f"info={_short(info)} must be a JSON object")
        return Dataset(categories=categories, images=images, info=dict(info))

    def unique_id(self, seen: dict[int, int], value: int, index: int, table: str, noun: str) -> None:
        """Record `value` as the id of `table`[index]; an id seen before fails naming both entries."""
        where = f"{table}[{index}]"
        if value in seen:
            raise self.fail(
                f"{where}.id", f"{where}.id={value} duplicates {table}[{seen[value]}].id: {noun} ids must be unique"
            )
        seen[value] = index

    def categories(self, raw: list) -> list[Category]:
        out: list[Category] = []
        seen: dict[int, int] = {}
        for i, item in enumerate(raw):
            where = f"categories[{i}]"
            cid = self.key(item, "id", where, int)
            name = self.key(item, "name", where, str)
            self.unique_id(seen, cid, i, "categories", "category")
            if self.class_names is not None and name not in self.class_names:
                raise self.fail(
                    f"{where}.name",
                    f"{where}.name={name!r} is not one of the classes "
                    f"{self.class_names}: fix the name or add the class",
                )
            out.append(Category(id=cid, name=name, supercategory=str(item.get("supercategory", ""))))
        return out

    def images(self, raw: list) -> list[ImageRecord]:
        out: list[ImageRecord] = []
        seen: dict[int, int] = {}
        for i, item in enumerate(raw):
            where = f"images[{i}]"
            image_id = self.key(item, "id", where, int)
            self.unique_id(seen, image_id, i, "images", "image")
            file_name = self.key(item, "file_name", where, str)
            sizes = {}
            for key in ("width", "height"):
                value = self.key(item, key, where, (int, float))
                if value <= 0 or value != int(value):
                    raise self.fail(
                        f"{where}.{key}",
                        f"{where}.{key}={value} must be a positive whole number of "
                        f"pixels: fix the size of {file_name!r}",
                    )
                sizes[key] = int(value)
            out.append(
                ImageRecord(
                    id=image_id,
                    file_name=file_name,
                    width=sizes["width"],
                    height=sizes["height"],
                    depth=int(item.get("depth", 3)),
                )
            )
        return out

    def annotation(self, raw: dict, where: str, image: ImageRecord, known: set[int]) -> Annotation:
        category_id = self.key(raw, "category_id", where, int)
        if category_id not in known:
            raise self.fail(
                f"{where}.category_id",
                f"{where}.category_id={category_id} is not one of the categories "
                f"{sorted(known)}: fix the id or add the category",
            )
        box = self.box(self.key(raw, "bbox", where, list), f"{where}.bbox", image)
        iscrowd = raw.get("iscrowd", 0)
        if iscrowd not in (0, 1):
            raise self.fail(f"{where}.iscrowd", f"{where}.iscrowd={_short(iscrowd)} must be 0 or 1")
        segmentation = self.segmentation(raw.get("segmentation"), f"{where}.segmentation", image)
        if "area" in raw:
            area = self.key(raw, "area", where, (int, float))
            if area < 0:
                raise self.fail(f"{where}.area", f"{where}.area={area} is negative: fix or remove it")
        elif segmentation is not None:
            area = mask_area(segmentation, image.height, image.width)
        else:
            area = (box[2] - box[0]) * (box[3] - box[1])
        ann_id = raw.get("id")
        if ann_id is not None:
            ann_id = self.key(raw, "id", where, int)
        return Annotation(
            category_id=category_id,
            box=box,
            area=area,
            segmentation=segmentation,
            iscrowd=bool(iscrowd),
            id=ann_id,
            difficult=bool(raw.get("difficult", 0)),
            truncated=bool(raw.get("truncated", 0)),
            pose=str(raw.get("pose", POSES_DEFAULT)),
        )

    def box(self, raw: list, field: str, image: ImageRecord) -> tuple[float, float, float, float]:
        if len(raw) != 4 or not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in raw):
            raise self.fail(field, f"{field}={_short(raw)} must be 4 numbers [x, y, width, height]")
        x, y, w, h = (float(v) for v in raw)
        if not all(math.isfinite(v) for v in (x, y, w, h)):
            raise self.fail(field, f"{field}={_short(raw)} has a non-finite number: fix the box")
        for value, name in ((w, "width"), (h, "height")):
            if value <= 0:
                raise self.fail(field, f"{field}={_short(raw)} has zero or negative {name} {value:g}: fix the box")
        x1, y1, x2, y2 = x, y, x + w, y + h
        if self.clip_boxes:
            x1, y1 = max(x1, 0.0), max(y1, 0.0)
            x2, y2 = min(x2, float(image.width)), min(y2, float(image.height))
            if x2 <= x1 or y2 <= y1:
                raise self.fail(
                    field,
                    f"{field}={_short(raw)} lies outside image {image.file_name!r} "
                    f"({image.width}x{image.height}): remove the object or fix the box",
                )
            return (x1, y1, x2, y2)
        edges = (
            (x1, "x", image.width, "width"),
            (y1, "y", image.height, "height"),
            (x2, "x+width", image.width, "width"),
            (y2, "y+height", image.height, "height"),
        )
        for value, name, limit, axis in edges:
            if value < -BOX_TOLERANCE_PX or value > limit + BOX_TOLERANCE_PX:
                raise self.fail(
                    field,
                    f"{field}={_short(raw)}: {name}={value:g} is outside the image {axis} {limit} "
                    f"of {image.file_name!r}: fix the box or the image size",
                )
        return (x1, y1, x2, y2)

    def segmentation(self, raw: Any, field: str, image: ImageRecord) -> Segmentation | None:
        if raw is None or raw == []:
            return None
        if isinstance(raw, list):
            polygons = []
            for j, poly in enumerate(raw):
                ok = isinstance(poly, list) and all(
                    isinstance(v, (int, float)) and not isinstance(v, bool) for v in poly
                )
                if not ok or len(poly) < 6 or len(poly) % 2:
                    raise self.fail(
                        f"{field}[{j}]",
                        f"{field}[{j}] must be a list of at least 3 x, y pairs (an even count of numbers, at least 6)",
                    )
                polygons.append([float(v) for v in poly])
            if not any(polygon_area(poly) > 0 for poly in polygons):
                raise self.fail(
                    field,
                    f"{field} encloses no area (every polygon's points lie on one line): fix the "
                    "outline, or remove the object",
                )
            return PolygonMask(polygons)
        if isinstance(raw, dict):
            size = raw.get("size")
            if size != [image.height, image.width]:
                raise self.fail(
                    f"{field}.size",
                    f"{field}.size={_short(size)} must be [height, width] = "
                    f"[{image.height}, {image.width}] of {image.file_name!r}",
                )
            counts = raw.get("counts")
            if isinstance(counts, str):
                return RleMask(size=(image.height, image.width), counts=counts)
            if isinstance(counts, list) and all(isinstance(v, int) and v >= 0 for v in counts):
                if sum(counts) != image.height * image.width:
                    raise self.fail(
                        f"{field}.counts",
                        f"{field}.counts add up to {sum(counts)} pixels, the image "
                        f"has {image.height * image.width}: fix the RLE",
                    )
                return RleMask(size=(image.height, image.width), counts=list(counts))
            raise self.fail(
                f"{field}.counts",
                f"{field}.counts must be a compressed RLE string or a list of non-negative run lengths",
            )
        raise self.fail(field, f"{field} must be a list of polygons or an RLE object")


def polygon_area(flat: list[float]) -> float:
    """The area a COCO polygon [x0, y0, x1, y1, ...] encloses (shoelace formula)."""
    xs, ys = flat[0::2], flat[1::2]
    return abs(sum(xs[i] * ys[i - 1] - xs[i - 1] * ys[i] for i in range(len(xs)))) / 2


def dataset_to_coco(dataset: Dataset) -> dict[str, Any]:
    """The COCO dict of a dataset. Annotations without an id get ids after the largest existing one."""
    known = {c.id for c in dataset.categories}
    next_id = 1 + max((a.id for im in dataset.images for a in im.annotations if a.id is not None), default=0)
    images, annotations = [], []
    used_ids: set[int] = set()
    for image in dataset.images:
        images.append({"id": image.id, "file_name": image.file_name, "width": image.width, "height": image.height})
        for ann in image.annotations:
            if ann.category_id not in known:
                raise ValueError(
                    f"image {image.file_name!r}: annotation category_id={ann.category_id} is not one "
                    f"of the categories {sorted(known)}"
                )
            if ann.id is None:
                ann_id, next_id = next_id, next_id + 1
            else:
                ann_id = ann.id
            if ann_id in used_ids:
                raise ValueError(
                    f"image {image.file_name!r}: annotation id {ann_id} is used twice: give each "
                    "annotation its own id (or None to have one assigned)"
                )
            used_ids.add(ann_id)
            item: dict[str, Any] = {
                "id": ann_id,
                "image_id": image.id,
                "category_id": ann.category_id,
                "bbox": [_plain(v) for v in ann.box_xywh],
                "area": _plain(ann.area),
                "iscrowd": int(ann.iscrowd),
            }
            if ann.segmentation is not None:
                item["segmentation"] = segmentation_to_coco(ann.segmentation)
            if ann.difficult:
                item["difficult"] = 1
            if ann.truncated:
                item["truncated"] = 1
            if ann.pose != POSES_DEFAULT:
                item["pose"] = ann.pose
            annotations.append(item)
    return {
        "info": dict(dataset.info),
        "images": images,
        "annotations": annotations,
        "categories": [{"id": c.id, "name": c.name, "supercategory": c.supercategory} for c in dataset.categories],
    }


def write_coco(dataset: Dataset, path: str | Path, indent: int | None = None) -> Path:
    """Write the COCO JSON of ``dataset`` to ``path`` (parent folders are created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dataset_to_coco(dataset), indent=indent) + "\n", encoding="utf-8")
    return path


def segmentation_to_coco(segmentation: Segmentation) -> Any:
    """PolygonMask -> list of lists; RleMask -> ``{"size": [h, w], "counts": str | list}``."""
    if isinstance(segmentation, PolygonMask):
        return [[_plain(v) for v in poly] for poly in segmentation.polygons]
    if isinstance(segmentation, RleMask):
        counts = segmentation.counts if isinstance(segmentation.counts, str) else list(segmentation.counts)
        return {"size": [int(segmentation.size[0]), int(segmentation.size[1])], "counts": counts}
    raise TypeError(f"segmentation must be a PolygonMask or an RleMask, got {type(segmentation).__name__}")


def _plain(value: float) -> int | float:
    """Whole numbers as JSON integers (as COCO files usually have them), others as floats."""
    value = float(value)
    return int(value) if value.is_integer() else value


def _short(value: Any, limit: int = 60) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
