"""Pascal VOC XML (labelImg style), one file per image.

Box convention: VOC's ``<bndbox>`` holds 1-based, inclusive pixel indices: ``xmin=1, xmax=W`` covers the whole
width. The internal box is continuous (``schema.py``), so reading does ``x1 = xmin - 1, y1 = ymin - 1, x2 = xmax,
y2 = ymax`` and writing does the reverse. Integer VOC boxes round-trip exactly (and are written as integers);
fractional ones are written with 10 significant digits.

Errors name the file and the field; objects are counted from 0 in the order they appear (``object[0]`` is the
first ``<object>``).
"""

from __future__ import annotations

import io
import math
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from pathlib import Path

from pipelines.datasets.schema import (
    Annotation,
    AnnotationError,
    Category,
    Dataset,
    ImageRecord,
    categories_from_names,
)

POSES_DEFAULT = "Unspecified"


def read_voc_dir(xml_dir: str | Path, class_names: Sequence[str], clip_boxes: bool = False) -> Dataset:
    """Every ``*.xml`` under ``xml_dir`` (sorted by path), image ids 1..N in that order.

    ``class_names``: the allowed ``<name>`` values; they become categories 1..N in this order.
    ``clip_boxes``: clip boxes that reach outside the image instead of failing (boxes still empty after clipping
    fail).
    """
    xml_dir = Path(xml_dir)
    if not xml_dir.is_dir():
        raise FileNotFoundError(f"{xml_dir}: no such directory of VOC XML files")
    paths = sorted(xml_dir.rglob("*.xml"))
    if not paths:
        raise FileNotFoundError(f"{xml_dir}: no *.xml files in it: point xml_dir at the VOC Annotations folder")
    return read_voc_files(paths, class_names, clip_boxes=clip_boxes)


def read_voc_files(
    paths: Sequence[str | Path],
    class_names: Sequence[str],
    clip_boxes: bool = False,
    contents: Sequence[bytes] | None = None,
) -> Dataset:
    """The given XML files in the given order, image ids 1..N. ``contents``: the files' bytes, where the caller
    already read them (parsed instead of reading the files again)."""
    categories = categories_from_names(list(class_names))
    images = [
        read_voc_xml(
            path, categories, image_id=i + 1, clip_boxes=clip_boxes, content=None if contents is None else contents[i]
        )
        for i, path in enumerate(paths)
    ]
    return Dataset(categories=categories, images=images)


def read_voc_xml(
    path: str | Path,
    categories: Sequence[Category],
    image_id: int,
    clip_boxes: bool = False,
    content: bytes | None = None,
) -> ImageRecord:
    """One VOC XML file (``content``: its bytes, if already read) -> ImageRecord; raises AnnotationError naming
    ``path`` and the field."""
    path_str = str(path)
    try:
        root = ET.parse(path if content is None else io.BytesIO(content)).getroot()
    except ET.ParseError as err:
        line, column = err.position
        raise AnnotationError(
            path_str, "xml", f"malformed XML at line {line}, column {column} ({err}): fix or re-export the file"
        ) from err
    if root.tag != "annotation":
        raise AnnotationError(
            path_str, "annotation", f"root element is <{root.tag}>, expected <annotation>: is this a VOC file?"
        )
    reader = _VocReader(path_str, {c.name: c for c in categories}, clip_boxes)
    return reader.image(root, image_id)


class _VocReader:
    def __init__(self, path: str, by_name: dict[str, Category], clip_boxes: bool):
        self.path = path
        self.by_name = by_name
        self.clip_boxes = clip_boxes

    def fail(self, field: str, problem: str) -> AnnotationError:
        return AnnotationError(self.path, field, problem)

    def text(self, parent: ET.Element, tag: str, field: str, required: bool = True) -> str | None:
        node = parent.find(tag)
        if node is None or node.text is None or not node.text.strip():
            if required:
                raise self.fail(field, f"{field} is missing or empty: add <{tag}>")
            return None
        return node.text.strip()

    def number(self, parent: ET.Element, tag: str, field: str) -> float:
        raw = self.text(parent, tag, field)
        try:
            value = float(raw)
        except ValueError:
            raise self.fail(field, f"{field}={raw!r} is not a number: write a pixel value") from None
        if not math.isfinite(value):
            raise self.fail(field, f"{field}={raw} is not a finite number: write a pixel value")
        return value

    def flag(self, parent: ET.Element, tag: str, field: str) -> bool:
        raw = self.text(parent, tag, field, required=False)
        if raw is None:
            return False
        if raw not in ("0", "1"):
            raise self.fail(field, f"{field}={raw!r} must be 0 or 1")
        return raw == "1"

    def image(self, root: ET.Element, image_id: int) -> ImageRecord:
        file_name = self.text(root, "filename", "filename")
        size = root.find("size")
        if size is None:
            raise self.fail(
                "size", "size is missing: add <size><width>W</width><height>H</height><depth>3</depth></size>"
            )
        width = self.size_value(size, "width")
        height = self.size_value(size, "height")
        depth = self.size_value(size, "depth") if size.find("depth") is not None else 3
        annotations = [
            self.annotation(obj, f"object[{i}]", width, height) for i, obj in enumerate(root.findall("object"))
        ]
        return ImageRecord(
            id=image_id, file_name=file_name, width=width, height=height, depth=depth, annotations=annotations
        )

    def size_value(self, size: ET.Element, tag: str) -> int:
        field = f"size.{tag}"
        value = self.number(size, tag, field)
        if value <= 0 or value != int(value):
            raise self.fail(
                field,
                f"{field}={_format_number(value)} must be a positive whole number of pixels: "
                "fix the <size> to match the image",
            )
        return int(value)

    def annotation(self, obj: ET.Element, where: str, width: int, height: int) -> Annotation:
        name = self.text(obj, "name", f"{where}.name")
        category = self.by_name.get(name)
        if category is None:
            raise self.fail(
                f"{where}.name",
                f"{where}.name={name!r} is not one of the classes {list(self.by_name)}: "
                "fix the label or add the class to the class list",
            )
        bndbox = obj.find("bndbox")
        if bndbox is None:
            raise self.fail(f"{where}.bndbox", f"{where}.bndbox is missing: add <bndbox> with xmin, ymin, xmax, ymax")
        corners = {tag: self.number(bndbox, tag, f"{where}.bndbox.{tag}") for tag in ("xmin", "ymin", "xmax", "ymax")}
        x1, y1, x2, y2 = self.box(corners, where, width, height)
        return Annotation(
            category_id=category.id,
            box=(x1, y1, x2, y2),
            area=(x2 - x1) * (y2 - y1),
            difficult=self.flag(obj, "difficult", f"{where}.difficult"),
            truncated=self.flag(obj, "truncated", f"{where}.truncated"),
            pose=self.text(obj, "pose", f"{where}.pose", required=False) or POSES_DEFAULT,
        )

    def box(self, c: dict[str, float], where: str, width: int, height: int) -> tuple[float, float, float, float]:
        for low, high, extent, axis in (("xmin", "xmax", width, "width"), ("ymin", "ymax", height, "height")):
            if c[high] < c[low]:
                raise self.fail(
                    f"{where}.bndbox.{high}",
                    f"{where}.bndbox.{high}={_format_number(c[high])} < {low}={_format_number(c[low])}: "
                    f"the box has zero or negative {axis}: fix the box",
                )
            if self.clip_boxes:
                if c[low] > extent or c[high] < 1:
                    raise self.fail(
                        f"{where}.bndbox",
                        f"{where}.bndbox {low}..{high}={_format_number(c[low])}..{_format_number(c[high])} lies "
                        f"outside the image {axis} {extent}: remove the object or fix the box",
                    )
                c[low], c[high] = max(c[low], 1.0), min(c[high], float(extent))
                continue
            for tag in (low, high):
                if not 1 <= c[tag] <= extent:
                    raise self.fail(
                        f"{where}.bndbox.{tag}",
                        f"{where}.bndbox.{tag}={_format_number(c[tag])} is outside the image {axis} {extent} "
                        f"(VOC boxes are 1-based: 1 <= {tag} <= {extent}): fix the box or the <size>",
                    )
        return (c["xmin"] - 1, c["ymin"] - 1, c["xmax"], c["ymax"])


def voc_xml_string(image: ImageRecord, categories: Sequence[Category], folder: str = "images") -> str:
    """The labelImg-style XML text of one image (UTF-8, 4-space indent, trailing newline)."""
    by_id = {c.id: c.name for c in categories}
    root = ET.Element("annotation")
    _sub(root, "folder", folder)
    _sub(root, "filename", Path(image.file_name).name)
    _sub(root, "path", image.file_name)
    source = _sub(root, "source")
    _sub(source, "database", "Unknown")
    size = _sub(root, "size")
    _sub(size, "width", str(image.width))
    _sub(size, "height", str(image.height))
    _sub(size, "depth", str(image.depth))
    _sub(root, "segmented", "0")
    for ann in image.annotations:
        if ann.category_id not in by_id:
            raise ValueError(
                f"image {image.file_name!r}: annotation category_id={ann.category_id} is not one of the "
                f"categories {sorted(by_id)}"
            )
        x1, y1, x2, y2 = ann.box
        obj = _sub(root, "object")
        _sub(obj, "name", by_id[ann.category_id])
        _sub(obj, "pose", ann.pose)
        _sub(obj, "truncated", "1" if ann.truncated else "0")
        _sub(obj, "difficult", "1" if ann.difficult else "0")
        bndbox = _sub(obj, "bndbox")
        for tag, value in (("xmin", x1 + 1), ("ymin", y1 + 1), ("xmax", x2), ("ymax", y2)):
            _sub(bndbox, tag, _format_number(value))
    ET.indent(root, space="    ")
    return ET.tostring(root, encoding="unicode") + "\n"


def write_voc_dir(dataset: Dataset, out_dir: str | Path, folder: str = "images") -> list[Path]:
    """One ``<image stem>.xml`` per image in ``out_dir``; returns the paths written, in image order."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, str] = {}
    paths = []
    for image in dataset.images:
        xml_name = Path(image.file_name).stem + ".xml"
        if xml_name in written:
            raise ValueError(
                f"images {written[xml_name]!r} and {image.file_name!r} would both be written to {xml_name}: "
                "VOC keeps one XML per image stem, rename one of them"
            )
        written[xml_name] = image.file_name
        path = out_dir / xml_name
        path.write_text(voc_xml_string(image, dataset.categories, folder=folder), encoding="utf-8")
        paths.append(path)
    return paths


def _sub(parent: ET.Element, tag: str, text: str | None = None) -> ET.Element:
    node = ET.SubElement(parent, tag)
    if text is not None:
        node.text = text
    return node


def _format_number(value: float) -> str:
    """Integers without a decimal point (as labelImg writes them), other values with 10 significant digits."""
    rounded = round(value)
    if abs(value - rounded) < 1e-9:
        return str(int(rounded))
    return f"{value:.10g}"
