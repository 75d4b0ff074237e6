"""Preparing a training set with Spark: bad images are counted and skipped (never fatal), shards are read back
per rank, and prepared data is reused when the inputs did not change."""

from __future__ import annotations

import json

import numpy as np

from pipelines.training.augment import AugmentConfig
from pipelines.training.batches import InputSpec, make_micro_batch
from pipelines.training.launcher import prepare, resolve_paths
from pipelines.training.prepare import read_skipped
from pipelines.training.shards import ShardIndex
from tests.fixtures_training import BAD_ENTRIES, TINY_IMAGES, make_tiny_roads, tiny_config, tiny_roads  # noqa: F401

CLASSES = ("pothole", "crack", "patch", "puddle")


def test_bad_images_are_counted_and_skipped(spark, tiny_roads, tmp_path):
    cfg = resolve_paths(tiny_config(tiny_roads, tmp_path / "prepared [1]", tmp_path / "run"))
    report = prepare(spark, cfg, CLASSES)
    assert not report.reused
    assert report.skipped() == {"no_annotations": 1, "missing": 1, "corrupt": 1, "size_mismatch": 0}
    assert report.usable("train") + report.usable("val") == TINY_IMAGES
    skipped = read_skipped(spark, str(tmp_path / "prepared [1]"))
    assert dict(zip(skipped.file_name, skipped.reason)) == {name: reason for reason, name in BAD_ENTRIES.items()}
    assert all(skipped.message.str.len() > 0)

    train = ShardIndex.open(str(tmp_path / "prepared [1]" / "train"))
    val = ShardIndex.open(str(tmp_path / "prepared [1]" / "val"))
    assert len(train) == report.usable("train") and len(val) == report.usable("val")
    assert list(train.image_ids) == sorted(train.image_ids)
    assert len({p.split("shard=")[1].split("/")[0] for p in train.files}) == 2
    val_coco = json.loads((tmp_path / "prepared [1]" / "val_annotations.json").read_text())
    assert sorted(im["id"] for im in val_coco["images"]) == list(val.image_ids)

    rows = train.read([0, len(train) - 1])
    assert set(rows) == {0, len(train) - 1}
    spec = InputSpec(64, (123.68, 116.78, 103.94), (58.40, 57.12, 57.38))
    first = make_micro_batch(rows, [0, len(train) - 1], spec, AugmentConfig(), seed=1, epoch=0)
    again = make_micro_batch(rows, [0, len(train) - 1], spec, AugmentConfig(), seed=1, epoch=0)
    assert first.images.shape == (2, 3, 64, 64)
    np.testing.assert_array_equal(first.images.numpy(), again.images.numpy())  # augmentation is seeded
    for target in first.targets:
        assert target.masks.shape[1:] == (64, 64) and target.boxes.shape[0] == target.labels.shape[0]
        assert ((target.boxes >= 0) & (target.boxes <= 1)).all()

    second = prepare(spark, cfg, CLASSES)
    assert second.reused and second.counts == report.counts


def test_a_split_the_run_needs_without_a_usable_image_stops_it_before_any_rank(tiny_roads, tmp_path):
    import pytest

    from pipelines.training.config import TrainConfigError
    from pipelines.training.launcher import check_splits
    from pipelines.training.prepare import PrepareReport

    def report(train: int, val: int) -> PrepareReport:
        return PrepareReport("sig", {"train": {"ok": train, "missing": 1}, "val": {"ok": val, "corrupt": 1}}, "x")

    evaluated = tiny_config(tiny_roads, tmp_path / "prepared", tmp_path / "run", **{"eval.every_epochs": 1})
    check_splits(evaluated, report(3, 1))
    check_splits(tiny_config(tiny_roads, tmp_path / "prepared", tmp_path / "run"), report(3, 0))  # no evaluation
    with pytest.raises(
        TrainConfigError,
        match=r"^the val split has no usable image to evaluate on \(skipped .*"
        r"'corrupt': 1.*set eval\.every_epochs: 0",
    ):
        check_splits(evaluated, report(3, 0))
    with pytest.raises(TrainConfigError, match=r"^no usable training image \(skipped .*'missing': 1.*prepare_report"):
        check_splits(evaluated, report(0, 1))


def test_a_folder_of_voc_xml_files_is_prepared_as_its_coco_twin(spark, tmp_path):
    """data.annotations may name a folder of Pascal VOC XML files (labelImg's): the same images and boxes as the
    COCO file of the same set (VOC has no masks: each object's mask is its box)."""
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset

    data = tmp_path / "roads"
    generate_road_dataset(
        data, 6, 3, RoadSceneConfig(width=96, height=72, min_instances=1, max_instances=3, formats=("coco", "voc"))
    )
    reports = {}
    for name, source in (("coco", data / "annotations.json"), ("voc", data / "voc")):
        cfg = resolve_paths(
            tiny_config(data, tmp_path / f"prepared_{name}", tmp_path / "run", **{"data.annotations": str(source)})
        )
        reports[name] = prepare(spark, cfg, CLASSES)
        rows = ShardIndex.open(str(tmp_path / f"prepared_{name}" / "train")).read(range(reports[name].usable("train")))
        reports[name] = (
            reports[name].counts,
            sorted((row["file_name"], list(row["labels"]), list(row["boxes"])) for row in rows.values()),
        )
    assert reports["voc"] == reports["coco"]


def test_unknown_category_is_a_clear_error(spark, tiny_roads, tmp_path):
    import pytest

    cfg = resolve_paths(tiny_config(tiny_roads, tmp_path / "prepared", tmp_path / "run"))
    with pytest.raises(ValueError, match="not model classes"):
        prepare(spark, cfg, ("pothole", "crack"))


def test_awkward_file_names_are_found_and_an_empty_file_is_corrupt_not_missing(spark, tmp_path):
    """Names with spaces, %, #, non-ASCII letters, an upper-case extension and a subdirectory are matched to their
    annotations; a zero-byte image (which Spark's binaryFile scan skips) is skipped as corrupt, with its reason."""
    data = make_tiny_roads(tmp_path / "data [x]")
    coco = json.loads((data / "annotations.json").read_text())
    names = ["a b.jpg", "pct%20x.jpg", "hash#1.jpg", "ünï.jpg", "sub dir/in sub.jpg", "UP.JPG"]
    for image, name in zip(coco["images"], names):
        (data / "images" / name).parent.mkdir(exist_ok=True)
        (data / "images" / image["file_name"]).rename(data / "images" / name)
        image["file_name"] = name
    empty = coco["images"][len(names)]["file_name"]
    (data / "images" / empty).write_bytes(b"")
    (data / "annotations.json").write_text(json.dumps(coco))

    report = prepare(spark, resolve_paths(tiny_config(data, tmp_path / "prepared", tmp_path / "run")), CLASSES)
    assert report.skipped() == {"no_annotations": 1, "missing": 1, "corrupt": 2, "size_mismatch": 0}
    assert report.usable("train") + report.usable("val") == TINY_IMAGES - 1
    skipped = read_skipped(spark, str(tmp_path / "prepared")).set_index("file_name")
    assert skipped.loc[empty, "reason"] == "corrupt" and "empty (0 bytes)" in skipped.loc[empty, "message"]


def test_a_missing_annotations_file_or_images_folder_is_a_clear_error(spark, tiny_roads, tmp_path):
    import pytest

    from pipelines.errors import UsageError

    for key, missing in (("data.annotations", tmp_path / "none.json"), ("data.images", tmp_path / "no images")):
        cfg = resolve_paths(tiny_config(tiny_roads, tmp_path / "prepared", tmp_path / "run", **{key: str(missing)}))
        with pytest.raises(UsageError, match=f"{missing}: no such .*: check {key}"):
            prepare(spark, cfg, CLASSES)
    cut = tmp_path / "cut.json"
    cut.write_text('{"images": [')
    cfg = resolve_paths(
        tiny_config(tiny_roads, tmp_path / "prepared", tmp_path / "run", **{"data.annotations": str(cut)})
    )
    with pytest.raises(UsageError, match=r"cut\.json: malformed JSON at line 1, column 13"):
        prepare(spark, cfg, CLASSES)
