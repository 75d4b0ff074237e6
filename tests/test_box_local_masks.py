"""Box-local masks (issue 13): RLE built from a box-local mask equals pycocotools' RLE of the full-size mask, and the
executors' new postprocess (box-local assembly, RLE and label map) equals the previous implementation, kept in
tests/reference_postprocess.py, on the bundled samples and on random R50-550-like outputs. Also the output options
(output.masks, output.score_threshold) in the executor function and in one real local Spark job."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from pycocotools import mask as coco_mask

from pipelines.inference.image_inference import ExecutorModel, new_row
from pipelines.inference.inference_job import run
from pipelines.inference.model_manifest import load_manifest
from pipelines.inference.openvino_runtime import CompiledIR, RuntimeSettings
from pipelines.inference.yolact_inference import YolactInference
from pipelines.io.storage import Location
from pipelines.ops import yolact_postprocess as yp
from pipelines.ops.image_decode import decode_image
from pipelines.ops.mask_outputs import (
    LabelMapBuilder,
    encode_rle_box,
    encode_rle_counts,
    read_label_map_png,
    rle_counts_box,
)
from pipelines.ops.preprocess import preprocess_rgb
from tests import reference_postprocess as ref
from tests.conftest import SAMPLES
from tests.job_helpers import DEFAULT_MODEL_DIR, job_config, read_rows


def coco_full(mask: np.ndarray, top: int, left: int, height: int, width: int) -> dict:
    """pycocotools.mask.encode of the full-size image holding `mask` at (top, left)."""
    full = np.zeros((height, width), np.uint8)
    full[top : top + mask.shape[0], left : left + mask.shape[1]] = mask
    rle = coco_mask.encode(np.asfortranarray(full))
    return {"size": [height, width], "counts": rle["counts"].decode("ascii")}


def assert_box_rle_equals_coco(mask, top, left, height, width):
    mask = np.asarray(mask, dtype=bool)
    expected = coco_full(mask, top, left, height, width)
    assert encode_rle_box(mask, top, left, height, width) == expected, (mask.shape, top, left, height, width)


# ------------------------------------------------------------------------------------------------- box-local RLE
@pytest.mark.parametrize("height, width", [(1, 1), (7, 5), (5, 7), (8000, 1), (1, 8000), (3, 2)])
def test_box_rle_equals_coco_for_every_position_of_full_and_empty_boxes(height, width):
    boxes = [
        (0, 0, height, width),
        (0, 0, 1, 1),
        (height - 1, width - 1, 1, 1),
        (0, width - 1, height, 1),
        (height - 1, 0, 1, width),
        (height // 2, width // 2, (height + 1) // 2, (width + 1) // 2),
    ]
    for top, left, h, w in boxes:
        for fill in (np.ones((h, w), bool), np.zeros((h, w), bool)):
            assert_box_rle_equals_coco(fill, top, left, height, width)
    # an empty window (a detection whose box was cropped away entirely), also with rows but no cols or vice versa
    for empty in (np.zeros((0, 0), bool), np.zeros((0, width), bool), np.zeros((height, 0), bool)):
        assert encode_rle_box(empty, 0, 0, height, width) == coco_full(empty, 0, 0, height, width)


def test_box_rle_hand_made_cases():
    # runs that continue from one column's last row into the next column's first row (full-height window)
    mask = np.array([[0, 1, 1], [1, 1, 0], [1, 1, 1]], bool)
    assert_box_rle_equals_coco(mask, 0, 2, 3, 6)
    assert rle_counts_box(mask, 0, 0, 3, 3).tolist() == [1, 6, 1, 1]  # columns 011 111 101
    # the image starts and ends inside a run of ones
    assert rle_counts_box(np.ones((2, 2), bool), 0, 0, 2, 2).tolist() == [0, 4]
    assert rle_counts_box(np.array([[1, 0], [0, 1]], bool), 0, 0, 2, 2).tolist() == [0, 1, 2, 1]
    # touching each border of a larger image
    for top, left in [(0, 0), (0, 7), (5, 0), (5, 7), (0, 3), (5, 3), (2, 0), (2, 7)]:
        assert_box_rle_equals_coco(np.array([[1, 0, 1], [1, 1, 0], [0, 1, 1]], bool), top, left, 8, 10)
    # a single pixel in each corner of a 1-row and a 1-column image
    for top, left, height, width in [(0, 0, 1, 8000), (0, 7999, 1, 8000), (0, 0, 8000, 1), (7999, 0, 8000, 1)]:
        assert_box_rle_equals_coco(np.ones((1, 1), bool), top, left, height, width)


def test_box_rle_random_masks_and_positions():
    rng = np.random.default_rng(13)
    for _ in range(2000):
        height, width = (int(v) for v in rng.integers(1, 40, 2))
        h, w = int(rng.integers(0, height + 1)), int(rng.integers(0, width + 1))
        if rng.random() < 0.3:  # full-height windows: runs that join across columns
            h = height
        top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        mask = rng.random((h, w)) < rng.choice([0.05, 0.5, 0.95])
        assert_box_rle_equals_coco(mask, top, left, height, width)


def test_box_rle_wide_masks_and_strided_views():
    # windows of many 8-column groups (the RLE scans 8 columns per test), full-height ones (runs joined across
    # columns), and masks given as strided views of a larger array
    rng = np.random.default_rng(14)
    for _ in range(200):
        height, width = int(rng.integers(1, 120)), int(rng.integers(1, 400))
        h = height if rng.random() < 0.3 else int(rng.integers(1, height + 1))
        w = int(rng.integers(1, width + 1))
        top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        mask = rng.random((h, 2 * w)) < rng.choice([0.01, 0.5, 0.99])
        assert_box_rle_equals_coco(mask[:, ::2], top, left, height, width)
        assert_box_rle_equals_coco(np.ascontiguousarray(mask[:, :w]), top, left, height, width)


def test_box_rle_rejects_windows_outside_the_image():
    with pytest.raises(ValueError, match="does not fit"):
        encode_rle_box(np.ones((2, 2), bool), 3, 0, 4, 4)
    with pytest.raises(ValueError, match="bool or 0/1 integers"):
        encode_rle_box(np.ones((2, 2), np.float32), 0, 0, 4, 4)


def test_label_map_painted_box_locally_equals_full_painting():
    rng = np.random.default_rng(5)
    height, width = 23, 31
    local, full = LabelMapBuilder(height, width), LabelMapBuilder(height, width)
    for _ in range(300):  # 300 instances: the uint8 -> uint16 switch happens on the way
        h, w = int(rng.integers(0, height + 1)), int(rng.integers(0, width + 1))
        top, left = int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1))
        mask = rng.random((h, w)) < 0.3
        local.add_box(mask, top, left)
        placed = np.zeros((height, width), bool)
        placed[top : top + h, left : left + w] = mask
        full.add(placed)
    np.testing.assert_array_equal(local.label_map(), full.label_map())
    assert local.label_map().dtype == np.uint16
    np.testing.assert_array_equal(read_label_map_png(local.png()), full.label_map())


# ------------------------------------------------------------------------------------ new vs previous postprocess
def random_detections(rng, n: int, mask_dim: int = 32) -> yp.Detections:
    """Boxes of every kind: inside, touching every border, 1-px, flipped, partly and wholly outside the image."""
    centers, sizes = rng.uniform(-0.2, 1.2, (n, 2)), rng.uniform(0.0005, 0.8, (n, 2))
    boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], 1).astype(np.float32)
    special = [
        [0.0, 0.0, 1.0, 1.0],
        [0.0, 0.2, 0.3, 1.0],
        [0.7, 0.0, 1.0, 0.4],
        [0.5, 0.5, 0.5005, 0.5003],
        [0.7, 0.6, 0.2, 0.1],
        [1.2, 0.1, 1.4, 0.3],
        [-0.5, -0.5, -0.1, -0.2],
        [0.999, 0.999, 1.0, 1.0],
    ]
    boxes[: len(special)] = special
    coeffs = rng.normal(0, 1, (n, mask_dim)).astype(np.float32)
    return yp.Detections(
        boxes=boxes,
        coeffs=coeffs,
        classes=rng.integers(0, 80, n).astype(np.int64),
        scores=np.sort(rng.uniform(0, 1, n).astype(np.float32))[::-1].copy(),
    )


def reference_outputs(det, proto, width, height, class_names=("a", "b")):
    instances, builder = ref.postprocess_image(det, proto, width, height, class_names)
    return instances, builder.labels


def new_outputs(det, proto, width, height):
    """The RLEs and label map of box_masks mask by mask, checked equal to the executors' one-call encoding."""
    boxes = list(yp.box_masks(det, proto, width, height))
    rles = [encode_rle_box(b.mask, b.top, b.left, height, width) for b in boxes]
    labels = LabelMapBuilder(height, width)
    for b in boxes:
        labels.add_box(b.mask, b.top, b.left)
    assert one_call_outputs(det, proto, width, height) == (rles, labels.label_map().tolist())
    return rles, labels.label_map()


def one_call_outputs(det, proto, width, height, first_label=1):
    """What the executors write: every mask's RLE and the label map (as lists) from MaskBlocks.encode; the same
    RLEs again without a label map to paint. Labels start at first_label (earlier instances of the map stay)."""
    blocks = yp.mask_blocks(det, proto, width, height)
    builder = LabelMapBuilder(height, width)
    builder.reserve(first_label - 1)
    rles = encode_rle_counts(*blocks.encode(builder), height, width)
    assert builder.count == first_label - 1 + len(det)
    unpainted = encode_rle_counts(*blocks.encode(), height, width)
    assert unpainted == rles and len(rles) == len(det)
    return rles, builder.label_map().tolist()


@pytest.mark.parametrize(
    "seed, width, height", [(0, 550, 550), (1, 1920, 1080), (2, 480, 640), (3, 1, 1), (4, 8000, 1), (5, 37, 3000)]
)
def test_new_masks_equal_previous_on_random_r50_like_outputs(seed, width, height):
    rng = np.random.default_rng(seed)
    proto = np.maximum(rng.normal(0, 1.5, (138, 138, 32)), 0).astype(np.float32)  # ReLU prototypes, R50 550
    det = random_detections(rng, 100)
    rles, labels = new_outputs(det, proto, width, height)
    ref_instances, ref_labels = reference_outputs(det, proto, width, height)
    assert rles == [inst["mask"] for inst in ref_instances]
    np.testing.assert_array_equal(labels, ref_labels)
    assert labels.dtype == ref_labels.dtype
    # and the full-size masks of the public API are the previous ones
    np.testing.assert_array_equal(
        yp.assemble_masks(det, proto, width, height), np.stack(list(ref.instance_masks(det, proto, width, height)))
    )


@pytest.mark.parametrize("proto_size, box_scale", [(138, 0.3), (138, 6.0), (64, 0.3), (200, 1.0)])
def test_box_local_probabilities_give_the_whole_protos_masks(proto_size, box_scale):
    """mask_blocks computes the probabilities only inside the padded boxes; the masks are the whole-proto
    reference's (small boxes, boxes covering the whole proto, boxes touching every border, 1-px, outside); without
    the crop each block is the whole proto."""
    rng = np.random.default_rng(proto_size)
    proto = np.maximum(rng.normal(0, 1.5, (proto_size, proto_size, 32)), 0).astype(np.float32)
    det = random_detections(rng, 60)
    centers = (det.boxes[:, :2] + det.boxes[:, 2:]) / 2
    halves = (det.boxes[:, 2:] - det.boxes[:, :2]) / 2 * np.float32(box_scale)
    det = yp.Detections(
        boxes=np.concatenate([centers - halves, centers + halves], 1).astype(np.float32),
        coeffs=det.coeffs,
        classes=det.classes,
        scores=det.scores,
    )
    for width, height in ((640, 480), (97, 1300)):
        np.testing.assert_array_equal(
            yp.assemble_masks(det, proto, width, height), np.stack(list(ref.instance_masks(det, proto, width, height)))
        )
        new_outputs(det, proto, width, height)  # the executors' one-call encoding
    np.testing.assert_array_equal(
        yp.assemble_masks(det, proto, 640, 480, crop=False),
        np.stack(list(ref.instance_masks(det, proto, 640, 480, crop=False))),
    )


@pytest.mark.parametrize("count, first_label", [(0, 1), (1, 1), (300, 1), (10, 250), (3, 256)])
def test_one_call_encoding_equals_mask_by_mask(count, first_label):
    """MaskBlocks.encode (all masks, RLEs and label map in one compiled call) equals box_masks, encode_rle_box and
    LabelMapBuilder.add_box: no detections, one, more than 255 (a uint16 label map), and labels that pass 255 part
    way or start above it."""
    rng = np.random.default_rng(count + first_label)
    proto = np.maximum(rng.normal(0, 1.5, (138, 138, 32)), 0).astype(np.float32)
    det = random_detections(rng, max(count, 8)).take(np.arange(count))
    width, height = 120, 90
    builder = LabelMapBuilder(height, width)
    for _ in range(first_label - 1):
        builder.add_box(np.zeros((0, 0), bool), 0, 0)
    boxes = list(yp.box_masks(det, proto, width, height))
    for b in boxes:
        builder.add_box(b.mask, b.top, b.left)
    rles, labels = one_call_outputs(det, proto, width, height, first_label)
    assert rles == [encode_rle_box(b.mask, b.top, b.left, height, width) for b in boxes]
    assert labels == builder.label_map().tolist()
    assert np.asarray(labels).max(initial=0) >= (first_label if count else 0)


@pytest.fixture(scope="module")
def bundled():
    manifest = load_manifest(DEFAULT_MODEL_DIR)
    ir = CompiledIR(manifest.path("ir_xml"), RuntimeSettings(precision="f32", threads=1, streams=1))
    return manifest, ir, np.load(manifest.path("priors"))


def sample_paths() -> list[Path]:
    return sorted(p for p in (SAMPLES / "images").iterdir() if p.suffix.lower() in (".jpg", ".jpeg", ".png"))


def make_task(manifest, tmp_path: Path, **options) -> YolactInference:
    return YolactInference(
        model_dir=str(manifest.root),
        model_sha256=manifest.model_sha256,
        class_names=tuple(manifest.class_names),
        input_spec=manifest.input,
        postprocess=manifest.postprocess,
        settings=RuntimeSettings(precision="f32"),
        output=Location(str(tmp_path / "out")),
        input_root=str(SAMPLES / "images"),
        **options,
    )


def assert_executor_postprocess_equals_previous(model_dir: Path, paths: list[Path], tmp_path: Path) -> int:
    """The job's postprocess_one (box-local) vs the previous code on the same raw outputs (f32, 1 thread, computed
    once and fed to both): same instances, same RLE strings, same label map pixels. Returns the detections seen."""
    manifest = load_manifest(model_dir)
    ir = CompiledIR(manifest.path("ir_xml"), RuntimeSettings(precision="f32", threads=1, streams=1))
    priors = np.load(manifest.path("priors"))
    task = make_task(manifest, tmp_path, score_threshold=0.0)  # every detection is written, as before
    model = ExecutorModel(manifest, None, {"priors": priors})
    post = {k: manifest.postprocess[k] for k in ("conf_thresh", "nms_thresh", "top_k", "max_num_detections")}
    total = 0
    for path in paths:
        rgb = decode_image(path.read_bytes(), str(path))
        np.testing.assert_array_equal(preprocess_rgb(rgb, manifest.input), ref.preprocess_rgb(rgb, manifest.input))
        shared = decode_image(path.read_bytes(), str(path), shared_memory=True)  # what the executors decode
        np.testing.assert_array_equal(preprocess_rgb(shared, manifest.input), ref.preprocess_rgb(rgb, manifest.input))
        out = ir.infer_one(preprocess_rgb(rgb, manifest.input))
        raw = {role: out[name] for role, name in manifest.outputs.items()}
        row = new_row(type("Record", (), {"path": "file:" + str(path)})())
        row["height"], row["width"] = rgb.shape[:2]
        task.postprocess_one(row, raw, model)

        det = yp.detect(raw["loc"], raw["conf"], raw["mask"], priors, **post)
        expected, builder = ref.postprocess_image(
            det, raw["proto"], rgb.shape[1], rgb.shape[0], tuple(manifest.class_names)
        )
        assert row["instances"] == expected, path.name
        labels = read_label_map_png(Path(row["mask_path"]).read_bytes())
        np.testing.assert_array_equal(labels, builder.labels)
        total += len(expected)
    return total


def test_executor_postprocess_equals_previous_on_bundled_samples(tmp_path):
    total = assert_executor_postprocess_equals_previous(DEFAULT_MODEL_DIR, sample_paths(), tmp_path)
    assert total > 500, "the bundled model gives ~100 detections on most samples"


def test_score_threshold_and_mask_options(bundled, tmp_path):
    manifest, ir, priors = bundled
    path = SAMPLES / "images" / "chelsea.jpg"
    rgb = decode_image(path.read_bytes(), str(path))
    out = ir.infer_one(preprocess_rgb(rgb, manifest.input))
    raw = {role: out[name] for role, name in manifest.outputs.items()}
    model = ExecutorModel(manifest, None, {"priors": priors})
    rows = {}
    for name, options in {
        "all": {"score_threshold": 0.0},
        "default": {},
        "rle": {"masks": "rle"},
        "none": {"masks": "none"},
        "high": {"score_threshold": 0.3},
    }.items():
        row = new_row(type("Record", (), {"path": "file:" + str(path)})())
        row["height"], row["width"] = rgb.shape[:2]
        make_task(manifest, tmp_path / name, **options).postprocess_one(row, raw, model)
        rows[name] = row
    conf = manifest.postprocess["conf_thresh"]
    assert [i for i in rows["all"]["instances"] if i["score"] > conf] == rows["default"]["instances"]
    assert len(rows["default"]["instances"]) < len(rows["all"]["instances"])
    assert all(i["score"] > 0.3 for i in rows["high"]["instances"]) and rows["high"]["instances"]
    assert rows["rle"]["instances"] == rows["default"]["instances"] and rows["rle"]["mask_path"] is None
    assert not (tmp_path / "rle").exists() and not (tmp_path / "none").exists()
    without_masks = [{**i, "mask": None} for i in rows["default"]["instances"]]
    assert rows["none"]["instances"] == without_masks and rows["none"]["mask_path"] is None
    with pytest.raises(ValueError, match=r"output.masks \(--masks\) is 'png'"):
        make_task(manifest, tmp_path, masks="png")
    with pytest.raises(ValueError, match="output.score_threshold"):
        make_task(manifest, tmp_path, score_threshold=1.5)


# ---------------------------------------------------------------------------------------------- the Spark job
def test_job_without_masks_has_the_full_runs_boxes_scores_and_classes(spark, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for path in sample_paths():
        shutil.copy(path, images / path.name)
    full_config = job_config(images, tmp_path / "full")
    none_config = job_config(images, tmp_path / "none")
    none_config["output"]["masks"] = "none"
    none_config["inference"]["pin_cores"] = True  # changes which cores run it, not what it writes
    full, boxes_only = run(spark, full_config), run(spark, none_config)
    assert full["counts"]["done"] == boxes_only["counts"]["done"] == len(sample_paths())
    assert boxes_only["runtime"]["pin_cores"] and not full["runtime"]["pin_cores"]
    full_rows = {r.path: r for r in read_rows(spark, tmp_path / "full", "detections")}
    none_rows = {r.path: r for r in read_rows(spark, tmp_path / "none", "detections")}
    assert set(full_rows) == set(none_rows)
    total = 0
    for path, row in none_rows.items():
        expected = full_rows[path]
        assert row.mask_path is None and expected.mask_path is not None
        assert [(i.class_id, i.class_name, i.score, list(i.box)) for i in row.instances] == [
            (i.class_id, i.class_name, i.score, list(i.box)) for i in expected.instances
        ]
        assert all(i.mask is None for i in row.instances) and all(i.mask is not None for i in expected.instances)
        total += len(row.instances)
    assert total > 0
    assert not (tmp_path / "none" / "masks").exists()
