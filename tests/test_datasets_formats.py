"""VOC and COCO readers/writers, masks through pycocotools, and the train/val split."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import numpy as np
from pycocotools.coco import COCO

from pipelines.datasets import (
    Annotation,
    Dataset,
    ImageRecord,
    PolygonMask,
    categories_from_names,
    decode_mask,
    mask_area,
    mask_box,
    mask_iou,
    read_coco,
    read_voc_dir,
    rle_from_mask,
    split_train_val,
    to_coco_rle,
    write_coco,
    write_voc_dir,
)

CLASSES = ["pothole", "crack", "patch", "puddle"]

LABELIMG_XML = """<annotation>
\t<folder>images</folder>
\t<filename>{name}.jpg</filename>
\t<path>/home/someone/images/{name}.jpg</path>
\t<source>
\t\t<database>Unknown</database>
\t</source>
\t<size>
\t\t<width>{w}</width>
\t\t<height>{h}</height>
\t\t<depth>3</depth>
\t</size>
\t<segmented>0</segmented>
{objects}</annotation>
"""

OBJECT_XML = """\t<object>
\t\t<name>{label}</name>
\t\t<pose>{pose}</pose>
\t\t<truncated>{truncated}</truncated>
\t\t<difficult>{difficult}</difficult>
\t\t<bndbox>
\t\t\t<xmin>{xmin}</xmin>
\t\t\t<ymin>{ymin}</ymin>
\t\t\t<xmax>{xmax}</xmax>
\t\t\t<ymax>{ymax}</ymax>
\t\t</bndbox>
\t</object>
"""

# (file stem, width, height, [(label, xmin, ymin, xmax, ymax, pose, truncated, difficult)])
VOC_IMAGES = [
    ("0001", 640, 480, [("pothole", 1, 1, 640, 480, "Unspecified", 0, 0), ("crack", 10, 20, 10, 60, "Left", 1, 0)]),
    (
        "0002",
        320,
        240,
        [("puddle", 100, 50, 200, 51, "Unspecified", 0, 1), ("patch", 5.5, 6.25, 300.75, 239, "Unspecified", 0, 0)],
    ),
    ("0003", 64, 48, []),
]


def write_labelimg_dir(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for stem, w, h, objects in VOC_IMAGES:
        body = "".join(
            OBJECT_XML.format(
                label=o[0], xmin=o[1], ymin=o[2], xmax=o[3], ymax=o[4], pose=o[5], truncated=o[6], difficult=o[7]
            )
            for o in objects
        )
        (folder / f"{stem}.xml").write_text(LABELIMG_XML.format(name=stem, w=w, h=h, objects=body))
    return folder


def voc_fields(dataset: Dataset) -> list[tuple]:
    names = {c.id: c.name for c in dataset.categories}
    return [
        (
            im.file_name,
            im.width,
            im.height,
            im.depth,
            [(names[a.category_id], a.box, a.pose, a.truncated, a.difficult) for a in im.annotations],
        )
        for im in dataset.images
    ]


def test_voc_reader_converts_one_based_inclusive_corners_to_continuous_boxes(tmp_path):
    dataset = read_voc_dir(write_labelimg_dir(tmp_path / "voc"), CLASSES)
    first = dataset.images[0]
    assert (first.file_name, first.width, first.height, first.id) == ("0001.jpg", 640, 480, 1)
    assert first.annotations[0].box == (0.0, 0.0, 640.0, 480.0)  # xmin=1..xmax=W is the whole image
    assert first.annotations[1].box == (9.0, 19.0, 10.0, 60.0)  # a 1-pixel-wide box
    assert first.annotations[1].area == 41.0
    assert dataset.class_names == CLASSES
    assert [c.id for c in dataset.categories] == [1, 2, 3, 4]


def test_voc_to_coco_to_voc_keeps_every_box_label_and_size(tmp_path):
    original = read_voc_dir(write_labelimg_dir(tmp_path / "voc"), CLASSES)
    write_coco(original, tmp_path / "coco.json")
    via_coco = read_coco(tmp_path / "coco.json", class_names=CLASSES)
    assert voc_fields(via_coco) == voc_fields(original)
    write_voc_dir(via_coco, tmp_path / "voc_again")
    again = read_voc_dir(tmp_path / "voc_again", CLASSES)
    assert voc_fields(again) == voc_fields(original)
    # The corner values written are the ones that were read, digit for digit.
    text = (tmp_path / "voc_again" / "0002.xml").read_text()
    for snippet in (
        "<xmin>5.5</xmin>",
        "<ymin>6.25</ymin>",
        "<xmax>300.75</xmax>",
        "<ymax>239</ymax>",
        "<width>320</width>",
        "<height>240</height>",
        "<name>patch</name>",
        "<difficult>1</difficult>",
    ):
        assert snippet in text
    # Writing again gives the same bytes.
    write_voc_dir(again, tmp_path / "voc_third")
    for path in sorted((tmp_path / "voc_again").glob("*.xml")):
        assert (tmp_path / "voc_third" / path.name).read_bytes() == path.read_bytes()


def test_coco_written_from_voc_loads_in_pycocotools(tmp_path):
    dataset = read_voc_dir(write_labelimg_dir(tmp_path / "voc"), CLASSES)
    write_coco(dataset, tmp_path / "coco.json")
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(tmp_path / "coco.json"))
    assert sorted(coco.getCatIds()) == [1, 2, 3, 4]
    assert len(coco.getImgIds()) == 3
    boxes = [coco.anns[i]["bbox"] for i in coco.getAnnIds(imgIds=[1])]
    assert boxes == [[0, 0, 640, 480], [9, 19, 1, 41]]


def ring_mask(height: int, width: int) -> np.ndarray:
    ys, xs = np.mgrid[:height, :width]
    r = np.hypot(ys - height / 2, xs - width / 2)
    return (r < 15) & (r > 6)


def test_polygon_and_rle_masks_survive_a_coco_round_trip(tmp_path):
    height, width = 60, 80
    ring = ring_mask(height, width)
    polygons = PolygonMask([[10.0, 10.0, 40.5, 12.0, 35.25, 40.0, 12.0, 30.0], [50.0, 5.0, 70.0, 5.0, 60.0, 25.0]])
    compressed = rle_from_mask(ring)
    uncompressed = rle_from_mask(ring, compressed=False)
    assert isinstance(compressed.counts, str) and isinstance(uncompressed.counts, list)
    segmentations = [polygons, compressed, uncompressed]
    annotations = [
        Annotation(
            category_id=1,
            box=mask_box(s, height, width),
            area=float(mask_area(s, height, width)),
            segmentation=s,
            iscrowd=s is uncompressed,
        )
        for s in segmentations
    ]
    dataset = Dataset(
        categories=categories_from_names(CLASSES),
        images=[ImageRecord(id=7, file_name="a.png", width=width, height=height, annotations=annotations)],
    )
    write_coco(dataset, tmp_path / "masks.json")
    back = read_coco(tmp_path / "masks.json")
    for before, after in zip(annotations, back.images[0].annotations):
        assert after.segmentation == before.segmentation  # same form: polygons, RLE string, RLE list
        assert mask_area(after.segmentation, height, width) == mask_area(before.segmentation, height, width)
        assert after.area == before.area
        assert mask_iou(after.segmentation, before.segmentation, height, width) == 1.0
        assert after.box == before.box
    # Compressed and uncompressed RLE describe the same ring, and decode to it exactly.
    assert np.array_equal(decode_mask(compressed, height, width), ring.astype(np.uint8))
    assert np.array_equal(decode_mask(uncompressed, height, width), ring.astype(np.uint8))
    assert back.images[0].annotations[2].iscrowd
    # pycocotools reads the file we wrote and agrees on every mask.
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(tmp_path / "masks.json"))
    for ann, ours in zip(coco.loadAnns(coco.getAnnIds(imgIds=[7])), back.images[0].annotations):
        assert np.array_equal(coco.annToMask(ann), decode_mask(ours.segmentation, height, width))


def test_mask_helpers_agree_with_numpy():
    height, width = 30, 40
    mask = np.zeros((height, width), dtype=bool)
    mask[5:12, 20:31] = True
    rle = rle_from_mask(mask)
    assert mask_area(rle, height, width) == 77
    assert mask_box(rle, height, width) == (20.0, 5.0, 31.0, 12.0)
    other = rle_from_mask(np.roll(mask, 1, axis=1))
    assert abs(mask_iou(rle, other, height, width) - 70 / 84) < 1e-9
    assert to_coco_rle(rle, height, width)["size"] == [height, width]
    empty = rle_from_mask(np.zeros((height, width), dtype=bool), compressed=False)
    assert empty.counts == [height * width]
    full = rle_from_mask(np.ones((height, width), dtype=bool), compressed=False)
    assert full.counts == [0, height * width]


def test_coco_round_trip_keeps_ids_info_and_extra_voc_fields(tmp_path):
    data = {
        "info": {"description": "tiny"},
        "images": [
            {"id": 10, "file_name": "x.jpg", "width": 100, "height": 50},
            {"id": 3, "file_name": "y.jpg", "width": 20, "height": 20},
        ],
        "annotations": [
            {
                "id": 99,
                "image_id": 10,
                "category_id": 5,
                "bbox": [1.5, 2, 10, 20.25],
                "area": 7,
                "iscrowd": 0,
                "difficult": 1,
                "pose": "Rear",
            },
            {"id": 4, "image_id": 3, "category_id": 2, "bbox": [0, 0, 20, 20], "area": 400, "iscrowd": 0},
        ],
        "categories": [{"id": 2, "name": "crack", "supercategory": "road"}, {"id": 5, "name": "puddle"}],
    }
    (tmp_path / "in.json").write_text(json.dumps(data))
    dataset = read_coco(tmp_path / "in.json")
    write_coco(dataset, tmp_path / "out.json")
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["info"] == data["info"]
    assert [im["id"] for im in out["images"]] == [10, 3]
    assert out["annotations"][0] == {**data["annotations"][0], "bbox": [1.5, 2, 10, 20.25]}
    assert out["annotations"][1] == data["annotations"][1]
    assert out["categories"] == [
        {"id": 2, "name": "crack", "supercategory": "road"},
        {"id": 5, "name": "puddle", "supercategory": ""},
    ]


def test_split_is_deterministic_disjoint_and_independent_of_image_order():
    images = [ImageRecord(id=i, file_name=f"{i}.jpg", width=10, height=10) for i in range(1, 21)]
    dataset = Dataset(categories=categories_from_names(CLASSES), images=images)
    train, val = split_train_val(dataset, val_fraction=0.25, seed=3)
    assert len(val.images) == 5 and len(train.images) == 15
    train_ids, val_ids = {im.id for im in train.images}, {im.id for im in val.images}
    assert not train_ids & val_ids and train_ids | val_ids == set(range(1, 21))
    again_train, again_val = split_train_val(dataset.with_images(images[::-1]), val_fraction=0.25, seed=3)
    assert {im.id for im in again_val.images} == val_ids
    _, other_val = split_train_val(dataset, val_fraction=0.25, seed=4)
    assert {im.id for im in other_val.images} != val_ids
    assert [im.id for im in train.images] == sorted(train_ids)  # original order kept
    assert train.categories == dataset.categories
