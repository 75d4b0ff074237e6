"""Broken annotation files fail with an AnnotationError that names the file and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pipelines.datasets import AnnotationError, read_coco, read_voc_dir, read_voc_files

CLASSES = ["pothole", "crack", "patch", "puddle"]

GOOD_OBJECT = (
    "<object><name>pothole</name><bndbox><xmin>10</xmin><ymin>10</ymin><xmax>50</xmax><ymax>40</ymax></bndbox></object>"
)


def voc(
    size: str = "<size><width>640</width><height>480</height><depth>3</depth></size>", objects: str = GOOD_OBJECT
) -> str:
    return f"<annotation><folder>images</folder><filename>0001.jpg</filename>{size}{objects}</annotation>"


def bad_object(xmin="10", ymin="10", xmax="50", ymax="40", name="pothole") -> str:
    return (
        f"<object><name>{name}</name><bndbox><xmin>{xmin}</xmin><ymin>{ymin}</ymin><xmax>{xmax}</xmax>"
        f"<ymax>{ymax}</ymax></bndbox></object>"
    )


def test_box_outside_the_image_names_the_file_the_object_and_the_fix(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("annotations").mkdir()
    Path("annotations/0001.xml").write_text(voc(objects=GOOD_OBJECT * 2 + bad_object(xmax="812")))
    with pytest.raises(AnnotationError) as caught:
        read_voc_dir("annotations", CLASSES)
    err = caught.value
    assert isinstance(err, ValueError)
    assert (err.path, err.field) == ("annotations/0001.xml", "object[2].bndbox.xmax")
    assert str(err) == (
        "annotations/0001.xml: object[2].bndbox.xmax=812 is outside the image width 640 "
        "(VOC boxes are 1-based: 1 <= xmax <= 640): fix the box or the <size>"
    )


VOC_CASES = {
    "missing size": (voc(size=""), "size", r"size is missing"),
    "missing width": (voc(size="<size><height>480</height></size>"), "size.width", r"size\.width is missing"),
    "zero image size": (
        voc(size="<size><width>0</width><height>480</height></size>"),
        "size.width",
        r"size\.width=0 must be a positive whole number",
    ),
    "box left of the image": (
        voc(objects=bad_object(xmin="0")),
        "object[0].bndbox.xmin",
        r"xmin=0 is outside the image width 640 \(VOC boxes are 1-based",
    ),
    "box below the image": (
        voc(objects=bad_object(ymax="481")),
        "object[0].bndbox.ymax",
        r"ymax=481 is outside the image height 480",
    ),
    "negative box width": (
        voc(objects=bad_object(xmin="60", xmax="50")),
        "object[0].bndbox.xmax",
        r"xmax=50 < xmin=60: the box has zero or negative width",
    ),
    "negative box height": (
        voc(objects=GOOD_OBJECT + bad_object(ymin="41", ymax="40")),
        "object[1].bndbox.ymax",
        r"zero or negative height",
    ),
    "unknown class": (
        voc(objects=bad_object(name="pothol")),
        "object[0].name",
        r"object\[0\]\.name='pothol' is not one of the classes "
        r"\['pothole', 'crack', 'patch', 'puddle'\]",
    ),
    "missing name": (
        voc(objects="<object><bndbox><xmin>1</xmin></bndbox></object>"),
        "object[0].name",
        r"object\[0\]\.name is missing",
    ),
    "missing bndbox": (
        voc(objects="<object><name>crack</name></object>"),
        "object[0].bndbox",
        r"object\[0\]\.bndbox is missing",
    ),
    "not a number": (
        voc(objects=bad_object(ymin="ten")),
        "object[0].bndbox.ymin",
        r"object\[0\]\.bndbox\.ymin='ten' is not a number",
    ),
    "malformed xml": (
        "<annotation><size><width>640</width></annotation>",
        "xml",
        r"malformed XML at line 1, column \d+",
    ),
    "not a voc file": ("<html></html>", "annotation", r"root element is <html>"),
}


@pytest.mark.parametrize("case", sorted(VOC_CASES))
def test_broken_voc_fails_naming_file_and_field(tmp_path, case):
    text, field, pattern = VOC_CASES[case]
    path = tmp_path / "broken.xml"
    path.write_text(text)
    with pytest.raises(AnnotationError) as caught:
        read_voc_files([path], CLASSES)
    assert caught.value.path == str(path)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{path}: ")
    assert re.search(pattern, str(caught.value)), str(caught.value)


def test_voc_clip_boxes_clips_instead_of_failing(tmp_path):
    path = tmp_path / "a.xml"
    path.write_text(voc(objects=bad_object(xmin="0", xmax="812")))
    dataset = read_voc_files([path], CLASSES, clip_boxes=True)
    assert dataset.images[0].annotations[0].box == (0.0, 9.0, 640.0, 40.0)
    path.write_text(voc(objects=bad_object(xmin="700", xmax="812")))
    with pytest.raises(AnnotationError, match=r"lies outside the image width 640"):
        read_voc_files([path], CLASSES, clip_boxes=True)


def coco(**changes) -> dict:
    data = {
        "images": [
            {"id": 1, "file_name": "a.jpg", "width": 640, "height": 480},
            {"id": 2, "file_name": "b.jpg", "width": 320, "height": 240},
        ],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 30, 20], "area": 600, "iscrowd": 0},
            {"id": 2, "image_id": 2, "category_id": 2, "bbox": [0, 0, 320, 240], "area": 600, "iscrowd": 0},
        ],
        "categories": [{"id": 1, "name": "pothole"}, {"id": 2, "name": "crack"}],
    }
    for dotted, value in changes.items():
        *parents, last = dotted.split("__")
        target = data
        for part in parents:
            target = target[int(part)] if part.isdigit() else target[part]
        if value is DELETE:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return data


DELETE = object()

COCO_CASES = {
    "duplicate image id": (coco(images__1__id=1), "images[1].id", r"images\[1\]\.id=1 duplicates images\[0\]\.id"),
    "missing image width": (coco(images__1__width=DELETE), "images[1].width", r"images\[1\]\.width is missing"),
    "zero image height": (coco(images__0__height=0), "images[0].height", r"must be a positive whole number"),
    "unknown category": (
        coco(annotations__1__category_id=9),
        "annotations[1].category_id",
        r"category_id=9 is not one of the categories \[1, 2\]",
    ),
    "unknown image": (coco(annotations__0__image_id=5), "annotations[0].image_id", r"image_id=5 is not the id"),
    "box outside": (
        coco(annotations__1__bbox=[100, 0, 300, 240]),
        "annotations[1].bbox",
        r"x\+width=400 is outside the image width 320 of 'b\.jpg'",
    ),
    "negative box x": (coco(annotations__0__bbox=[-3, 0, 10, 10]), "annotations[0].bbox", r"x=-3 is outside"),
    "zero box width": (coco(annotations__0__bbox=[10, 10, 0, 20]), "annotations[0].bbox", r"zero or negative width 0"),
    "short bbox": (coco(annotations__0__bbox=[10, 10, 5]), "annotations[0].bbox", r"must be 4 numbers"),
    "missing categories": (coco(categories=DELETE), "categories", r"categories is missing"),
    "duplicate annotation id": (coco(annotations__1__id=1), "annotations[1].id", r"duplicates annotations\[0\]"),
    "rle size mismatch": (
        coco(annotations__0__segmentation={"size": [10, 10], "counts": "PT1"}),
        "annotations[0].segmentation.size",
        r"must be \[height, width\] = \[480, 640\]",
    ),
    "odd polygon": (
        coco(annotations__0__segmentation=[[1, 2, 3, 4, 5, 6, 7]]),
        "annotations[0].segmentation[0]",
        r"at least 3 x, y pairs",
    ),
    "zero-area polygon": (
        coco(annotations__0__segmentation=[[10, 10, 20, 20, 30, 30], [5, 5, 5, 9, 5, 20]]),
        "annotations[0].segmentation",
        r"encloses no area \(every polygon's points lie on one",
    ),
    "rle counts sum": (
        coco(annotations__0__segmentation={"size": [480, 640], "counts": [5, 5]}),
        "annotations[0].segmentation.counts",
        r"add up to 10 pixels",
    ),
}


@pytest.mark.parametrize("case", sorted(COCO_CASES))
def test_broken_coco_fails_naming_file_and_field(tmp_path, case):
    data, field, pattern = COCO_CASES[case]
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(data))
    with pytest.raises(AnnotationError) as caught:
        read_coco(path)
    assert caught.value.path == str(path)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{path}: {field}")
    assert re.search(pattern, str(caught.value)), str(caught.value)


def test_coco_class_not_in_the_given_class_list(tmp_path):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(coco(categories__1__name="crak")))
    with pytest.raises(AnnotationError) as caught:
        read_coco(path, class_names=CLASSES)
    assert caught.value.field == "categories[1].name"
    assert "categories[1].name='crak' is not one of the classes" in str(caught.value)
    assert read_coco(path).class_names == ["pothole", "crak"]


def test_malformed_coco_json(tmp_path):
    path = tmp_path / "instances.json"
    path.write_text('{"images": [}')
    with pytest.raises(AnnotationError) as caught:
        read_coco(path)
    assert (caught.value.path, caught.value.field) == (str(path), "json")
    assert "malformed JSON at line 1, column 13" in str(caught.value)


def test_coco_box_within_rounding_tolerance_is_accepted(tmp_path):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(coco(annotations__1__bbox=[0, 0, 320.001, 240])))
    assert read_coco(path).images[1].annotations[0].box == (0.0, 0.0, 320.001, 240.0)
