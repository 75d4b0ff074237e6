"""The input workers' faster micro-batches equal the previous ones bit for bit (tests/reference_micro_batch.py: the
expand canvas built, cropped and mirrored, every mask decoded full size): images, colour draws, boxes, labels,
validity, seeds and masks (full size; packed at the loss's sizes, but for pixels at the threshold: TIES_PER_PIXEL),
for many seeds, epochs and images, with
expand, crop and mirror on and off, images without objects, objects on the borders and objects too small to keep.
Also ``augment.augment`` (the detector's) against the previous one."""

from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest
import torch
from PIL import Image
from pycocotools import mask as mask_utils

from pipelines.datasets.synthetic_roads import RoadSceneConfig, render_scene
from pipelines.training.augment import AugmentConfig, Geometry, augment, draw_geometry
from pipelines.training.batches import InputSpec, make_micro_batch, window_masks
from tests import reference_micro_batch as reference

MEAN, STD = (123.68, 116.78, 103.94), (58.40, 57.12, 57.38)
CONFIGS = {
    "default": AugmentConfig(),
    "no expand": AugmentConfig(expand=False),
    "expand only": AugmentConfig(sample_crop=False, mirror=False, expand_max_ratio=2.5),
    "crop and mirror, no colour": AugmentConfig(expand=False, photometric=False),
    "none on": AugmentConfig(photometric=False, expand=False, sample_crop=False, mirror=False),
    "big min box": AugmentConfig(min_box_px=12.0),
}


# ------------------------------------------------------------------------------------------------------ rows
def encode(image: np.ndarray, fmt: str) -> bytes:
    out = io.BytesIO()
    Image.fromarray(image).save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def make_row(image: np.ndarray, masks: list[np.ndarray], labels: list[int], fmt: str = "PNG") -> dict:
    """A prepared row (shards.ShardIndex.read's form) from an image and its objects' [H, W] masks."""
    boxes, rles = [], []
    for mask in masks:
        ys, xs = np.nonzero(mask)
        boxes += [float(xs.min()), float(ys.min()), float(xs.max() + 1), float(ys.max() + 1)]
        rles.append(mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))["counts"].decode("ascii"))
    return {
        "image": encode(image, fmt),
        "file_name": f"x.{fmt.lower()}",
        "labels": list(labels),
        "boxes": boxes,
        "rles": rles,
    }


def road_rows(count: int, seed: int, width: int, height: int, max_instances: int = 6) -> list[dict]:
    config = RoadSceneConfig(width=width, height=height, max_instances=max_instances, formats=("coco",))
    rows = []
    for i in range(count):
        scene = render_scene(np.random.default_rng([seed, i]), config)
        masks = [inst.mask for inst in scene.instances if inst.mask.any()]
        rows.append(make_row(scene.image, masks, [i % 4 for i in range(len(masks))], "JPEG"))
    return rows


def edge_rows(seed: int) -> list[dict]:
    """Objects on every border and corner, the whole image, single pixels and thin lines (dropped by min_box),
    an image without objects, odd sizes."""
    rng = np.random.default_rng(seed)
    rows = []
    for height, width in ((48, 64), (37, 53), (64, 31)):
        image = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        masks = []
        for y0, y1, x0, x1 in (
            (0, 9, 0, 11),
            (height - 7, height, width - 5, width),
            (0, height, width - 3, width),
            (5, 6, 7, 8),
            (0, 1, 0, width),
            (0, height, 0, width),
        ):
            mask = np.zeros((height, width), np.uint8)
            mask[y0:y1, x0:x1] = 1
            masks.append(mask)
        blob = rng.random((height, width)) < 0.3
        blob[: height // 3] = False
        masks.append(blob.astype(np.uint8))
        rows.append(make_row(image, masks, [1, 2, 3, 0, 1, 2, 3]))
    rows.append(make_row(rng.integers(0, 256, (40, 56, 3), dtype=np.uint8), [], []))
    return rows


@pytest.fixture(scope="module")
def small_rows() -> dict[int, dict]:
    rows = road_rows(12, 5, 96, 72, max_instances=8) + edge_rows(3) + road_rows(4, 9, 80, 100)
    return dict(enumerate(rows))


@pytest.fixture(scope="module")
def full_rows() -> dict[int, dict]:
    return dict(enumerate(road_rows(6, 4242, 640, 480)))


# -------------------------------------------------------------------------------------------------- checks
def assert_micro_batches_equal(new, old) -> None:
    assert new.indices == old.indices
    assert new.images.dtype == old.images.dtype and torch.equal(new.images, old.images)
    assert (new.colour is None) == (old.colour is None)
    if new.colour is not None:
        assert torch.equal(new.colour, old.colour)
    if isinstance(old.targets, list):
        assert len(new.targets) == len(old.targets)
        for a, b in zip(new.targets, old.targets):
            assert a.seed == b.seed
            for x, y in ((a.boxes, b.boxes), (a.labels, b.labels), (a.masks, b.masks)):
                assert x.dtype == y.dtype and x.shape == y.shape and torch.equal(x, y)
        return
    a, b = new.targets, old.targets
    assert a.seeds == b.seeds and a.full_masks is None and b.full_masks is None
    for x, y in ((a.boxes, b.boxes), (a.labels, b.labels), (a.valid, b.valid)):
        assert x.dtype == y.dtype and torch.equal(x, y)
    assert list(a.small_masks) == list(b.small_masks)
    for size in b.small_masks:
        x, y = a.small_masks[size], b.small_masks[size]
        assert x.dtype == y.dtype == torch.uint8 and x.shape == y.shape, size
        assert int((x != y).sum()) <= TIES_PER_PIXEL * x.numel(), (size, int((x != y).sum()), x.numel())


# The packed masks are made by compiled_loops' resample (torch's generic kernel's order, every machine the same),
# the previous code's by torch, whose kernels for some sizes and instruction sets round differently by an ulp: a
# pixel whose value is 0.5 within an ulp may then fall on the other side of the > 0.5 threshold. Only such pixels
# differ (tests/test_training_resize.py::test_masks_resized_twice_equal_torchs_but_for_ties_at_the_threshold);
# measured: none at the models' sizes on an AVX-512 machine, ~1 in 10^4 pixels of random masks at 96 -> 16 px.
TIES_PER_PIXEL = 2e-3  # (scripts/bench_loader.py allows the same)


@contextlib.contextmanager
def torch_threads(count: int):
    threads = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def reference_micro_batch(*args):
    """The previous code's micro-batch with torch's generic resize kernel: on one thread torch resizes 3-channel
    float inputs (3 masks, float images) with another kernel, which the current code never uses
    (pipelines/training/resize.py); at 2 threads or more the previous code used the generic kernel too."""
    with torch_threads(max(2, torch.get_num_threads())):
        return reference.make_micro_batch(*args)


def compare(rows, spec, cfg, seeds, epochs, mask_sizes, batch=4) -> list[int]:
    """Every micro-batch of rows, for each seed and epoch, made both ways and checked equal; returns how many
    objects each sample kept."""
    order, kept = list(rows), []
    for seed in seeds:
        for epoch in epochs:
            for start in range(0, len(order), batch):
                indices = order[start : start + batch][:: -1 if (seed + epoch) % 2 else 1]
                new = make_micro_batch(rows, indices, spec, cfg, seed, epoch, mask_sizes)
                old = reference_micro_batch(rows, indices, spec, cfg, seed, epoch, mask_sizes)
                assert_micro_batches_equal(new, old)
                kept += (
                    [len(t.labels) for t in new.targets]
                    if mask_sizes is None
                    else new.targets.valid.sum(dim=1).tolist()
                )
    return kept


def geometries(rows, cfg, seeds, epochs) -> list[tuple[Geometry, int, int, int]]:
    """(geometry, source height, width, source objects, objects in the micro-batch) of every sample compare()
    makes."""
    out = []
    for seed in seeds:
        for epoch in epochs:
            for index, row in rows.items():
                image = Image.open(io.BytesIO(row["image"]))
                boxes = np.asarray(row["boxes"], np.float32).reshape(-1, 4)
                rng = np.random.default_rng([seed, epoch, index])
                geometry = draw_geometry(image.height, image.width, boxes, np.asarray(row["labels"]), rng, cfg)
                made = make_micro_batch(rows, [index], InputSpec(64, MEAN, STD), cfg, seed, epoch, [(8, 8)])
                out.append((geometry, image.height, image.width, len(boxes), int(made.targets.valid.sum())))
    return out


# --------------------------------------------------------------------------------------------------- tests
@pytest.mark.parametrize("name", list(CONFIGS))
def test_packed_micro_batches_equal_the_previous_ones(small_rows, name):
    kept = compare(
        small_rows,
        InputSpec(64, MEAN, STD),
        CONFIGS[name],
        seeds=range(3),
        epochs=range(2),
        mask_sizes=[(16, 16), (8, 8)],
    )
    assert 0 in kept and max(kept) >= 3


def test_the_draws_cover_expand_crop_mirror_and_dropped_objects(small_rows):
    """The seeds the comparisons use reach every branch: expand fill (mirrored or not), crops inside the image,
    whole images, objects dropped by the crop and by min_box."""
    found = geometries(small_rows, CONFIGS["default"], range(3), range(2))
    outside = [g for g, h, w, _, _ in found if not g.within(h, w)]
    assert outside and any(g.mirror for g in outside) and any(not g.mirror for g in outside)
    assert any(g.within(h, w) and (g.height, g.width) != (h, w) for g, h, w, _, _ in found)  # crop inside
    assert any((g.top, g.left, g.height, g.width) == (0, 0, h, w) for g, h, w, _, _ in found)  # whole image
    assert any(0 < len(g.objects) < objects for g, _, _, objects, _ in found)  # crop drops
    assert any(kept < len(g.objects) for g, _, _, _, kept in found)  # min_box drops


def test_full_size_targets_and_validation_equal_the_previous_ones(small_rows):
    """mask_sizes None (float images, distorted and normalized here; full-size masks) and augment_cfg None."""
    spec = InputSpec(48, MEAN, STD)
    compare(small_rows, spec, CONFIGS["default"], seeds=[7], epochs=range(2), mask_sizes=None)
    compare(small_rows, spec, None, seeds=[0], epochs=[0], mask_sizes=None)
    compare(small_rows, spec, None, seeds=[0], epochs=[0], mask_sizes=[(12, 12), (6, 6)])


@pytest.mark.parametrize("mask_sizes", [[(16, 16), (8, 8)], None])
def test_one_thread_as_in_a_loader_worker_equals_two(small_rows, mask_sizes):
    """A loader worker runs one torch thread, a rank without workers its own threads: the micro-batches are the
    same (3 masks and float images included, which torch's one-thread kernel would resize otherwise), and equal the
    previous code's with the generic kernel. (96 px: torch takes yet another kernel for outputs of at most 64x64.)"""
    spec = InputSpec(96, MEAN, STD)
    with torch_threads(1):
        kept = compare(small_rows, spec, CONFIGS["default"], seeds=[11, 12], epochs=[0], mask_sizes=mask_sizes)
        one = [make_micro_batch(small_rows, [i], spec, CONFIGS["default"], 11, 0, mask_sizes) for i in small_rows]
    assert 3 in kept
    with torch_threads(2):
        two = [make_micro_batch(small_rows, [i], spec, CONFIGS["default"], 11, 0, mask_sizes) for i in small_rows]
    for a, b in zip(one, two):
        assert_micro_batches_equal(a, b)


@pytest.mark.parametrize("size,mask_sizes", [(352, [(88, 88), (44, 44)]), (550, [(138, 138), (69, 69)])])
def test_640x480_at_the_models_sizes_equal_the_previous_ones(full_rows, size, mask_sizes):
    spec = InputSpec(size, MEAN, STD)
    for cfg in (CONFIGS["default"], CONFIGS["no expand"]):
        compare(full_rows, spec, cfg, seeds=[1], epochs=[0, 1], mask_sizes=mask_sizes, batch=3)


def test_augment_equals_the_previous_one(small_rows):
    """augment.augment (the detector's geometric augmentation): the same image, masks, boxes and labels."""
    mean = np.float32(MEAN)
    for index, row in small_rows.items():
        sample = reference.row_to_sample(row)
        for epoch in range(4):
            new = augment(sample, np.random.default_rng([5, epoch, index]), CONFIGS["default"], mean)
            old = reference.augment(sample, np.random.default_rng([5, epoch, index]), CONFIGS["default"], mean)
            for x, y in (
                (new.image, old.image),
                (new.masks, old.masks),
                (new.boxes, old.boxes),
                (new.labels, old.labels),
            ):
                assert x.dtype == y.dtype and x.shape == y.shape and np.array_equal(x, y)


def test_window_masks_equal_cropping_full_masks():
    """Windows inside, across and outside the image, mirrored or not, and no objects."""
    rng = np.random.default_rng(1)
    height, width = 23, 31
    masks = (rng.random((4, height, width)) < 0.4).astype(np.uint8)
    rles = [mask_utils.encode(np.asfortranarray(m))["counts"].decode("ascii") for m in masks]
    objects, pad = np.array([3, 0, 2]), 50
    canvas = np.zeros((len(masks), height + 2 * pad, width + 2 * pad), np.float32)  # the expand canvas
    canvas[:, pad : pad + height, pad : pad + width] = masks
    for top, left, h, w in (
        (0, 0, height, width),
        (3, 4, 10, 20),
        (-5, -7, 40, 50),
        (-9, 20, 15, 30),
        (30, 0, 5, 5),
        (0, -40, 10, 10),
    ):
        for mirror in (False, True):
            for kept in (objects, objects[:0]):
                g = Geometry(top, left, h, w, mirror, kept, np.zeros((len(kept), 4), np.float32), kept)
                expected = canvas[kept, pad + top : pad + top + h, pad + left : pad + left + w]
                expected = expected[:, :, ::-1] if mirror else expected
                assert np.array_equal(window_masks(rles, kept, height, width, g), expected), (top, left, mirror)


def test_a_sample_without_objects(small_rows):
    empty = {0: small_rows[len(small_rows) - 5]}
    assert not empty[0]["labels"]
    for cfg in (CONFIGS["default"], None):
        new = make_micro_batch(empty, [0], InputSpec(32, MEAN, STD), cfg, 0, 0, [(8, 8), (4, 4)])
        assert new.targets.boxes.shape == (1, 0, 4) and new.targets.small_masks[(8, 8)].shape == (1, 0, 8, 8)
        assert_micro_batches_equal(
            new, reference_micro_batch(empty, [0], InputSpec(32, MEAN, STD), cfg, 0, 0, [(8, 8), (4, 4)])
        )
