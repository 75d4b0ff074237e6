"""The one in-memory form of an annotated image set, whatever file format it came from.

Coordinates are pixels in the continuous convention that COCO uses: pixel column ``i`` covers ``[i, i + 1)``, so
a box around columns 10..19 is ``x1=10, x2=20`` and a full-image box is ``(0, 0, width, height)``. Readers convert
their format's convention into this one (Pascal VOC's 1-based inclusive corners: see ``voc.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from pipelines.errors import UsageError


class AnnotationError(UsageError):
    """A problem in an annotation file.

    ``path``: the file, as given to the reader; ``field``: where in it (``object[2].bndbox.xmax``,
    ``images[3].id``); the message says what is wrong and what to do.
    """

    def __init__(self, path: str, field: str, problem: str):
        self.path = str(path)
        self.field = field
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True)
class Category:
    """One class: ``id`` as in COCO's ``category_id``, ``name`` as in VOC's ``<object><name>``."""

    id: int
    name: str
    supercategory: str = ""


@dataclass(frozen=True)
class PolygonMask:
    """COCO polygons: each ``[x0, y0, x1, y1, ...]`` in pixels (at least 3 points); the mask is their union."""

    polygons: list[list[float]]


@dataclass(frozen=True)
class RleMask:
    """COCO run-length encoding of a ``[height, width]`` mask in column-major order.

    ``counts``: a ``str`` is COCO's compressed form, a ``list[int]`` the uncompressed form (used for iscrowd).
    """

    size: tuple[int, int]
    counts: str | list[int]


Segmentation = PolygonMask | RleMask


@dataclass
class Annotation:
    """One object instance.

    ``box``: ``(x1, y1, x2, y2)`` float pixels; ``area``: pixels (the mask's pixel count when there is a mask, else
    the box area); ``difficult``/``truncated``/``pose`` are VOC's fields, kept so VOC round trips are lossless.
    ``id`` is COCO's annotation id when the source had one.
    """

    category_id: int
    box: tuple[float, float, float, float]
    area: float
    segmentation: Segmentation | None = None
    iscrowd: bool = False
    id: int | None = None
    difficult: bool = False
    truncated: bool = False
    pose: str = "Unspecified"

    @property
    def box_xywh(self) -> list[float]:
        x1, y1, x2, y2 = self.box
        return [x1, y1, x2 - x1, y2 - y1]


@dataclass
class ImageRecord:
    """One image: ``file_name`` relative to the image folder, ``width``/``height`` pixels, ``depth`` channels."""

    id: int
    file_name: str
    width: int
    height: int
    depth: int = 3
    annotations: list[Annotation] = field(default_factory=list)


@dataclass
class Dataset:
    """Categories, images with their annotations, and COCO's free-form ``info``."""

    categories: list[Category]
    images: list[ImageRecord]
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def class_names(self) -> list[str]:
        return [c.name for c in self.categories]

    def category_by_id(self) -> dict[int, Category]:
        return {c.id: c for c in self.categories}

    def category_by_name(self) -> dict[str, Category]:
        return {c.name: c for c in self.categories}

    def num_annotations(self) -> int:
        return sum(len(im.annotations) for im in self.images)

    def with_images(self, images: list[ImageRecord]) -> Dataset:
        """The same categories and info over another list of images."""
        return replace(self, images=list(images), info=dict(self.info))


def categories_from_names(class_names: list[str] | tuple[str, ...]) -> list[Category]:
    """Categories with ids 1..N in the given order; names must be unique and non-empty."""
    names = list(class_names)
    if not names:
        raise ValueError("class_names is empty: give the list of class names, e.g. ['pothole', 'crack']")
    seen: set[str] = set()
    for name in names:
        if not name or not str(name).strip():
            raise ValueError(f"class_names {names} has an empty name: remove it")
        if name in seen:
            raise ValueError(f"class_names {names} lists {name!r} twice: each class once")
        seen.add(name)
    return [Category(id=i + 1, name=n) for i, n in enumerate(names)]
