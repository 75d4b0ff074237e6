"""RLE encode/decode (pycocotools), label maps (overlap rule, dtype), label-map PNGs."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from PIL import Image
from pycocotools import mask as coco_mask

from pipelines.ops.mask_outputs import (
    LabelMapBuilder,
    decode_rle,
    encode_rle,
    label_map,
    label_map_png,
    read_label_map_png,
    rle_area,
)


def _random_masks(count: int, height: int, width: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    masks = []
    for _ in range(count):
        top, left = rng.integers(0, height), rng.integers(0, width)
        mask = np.zeros((height, width), bool)
        mask[top : top + rng.integers(1, 12), left : left + rng.integers(1, 12)] = True
        masks.append(mask)
    return masks


@pytest.mark.parametrize("shape", [(1, 1), (2, 3), (17, 5), (64, 48)])
def test_rle_round_trip_and_area(shape):
    rng = np.random.default_rng(sum(shape))
    for mask in [rng.random(shape) > 0.6, np.zeros(shape, bool), np.ones(shape, bool)]:
        rle = encode_rle(mask)
        assert rle["size"] == list(shape) and isinstance(rle["counts"], str)
        assert json.loads(json.dumps(rle)) == rle  # fits a JSON / string column
        assert np.array_equal(decode_rle(rle), mask) and decode_rle(rle).dtype == bool
        assert rle_area(rle) == int(mask.sum())
        assert int(coco_mask.area({"size": rle["size"], "counts": rle["counts"].encode()})) == int(mask.sum())


def test_rle_is_column_major_like_coco():
    mask = np.zeros((2, 3), bool)
    mask[0, 1] = True  # column-major index 2: runs of 2 background, 1 foreground, 3 background
    assert np.array_equal(decode_rle({"size": [2, 3], "counts": [2, 1, 3]}), mask)
    assert encode_rle(mask) == encode_rle(decode_rle({"size": [2, 3], "counts": [2, 1, 3]}))


def test_rle_accepts_integer_masks_and_rejects_soft_or_3d_masks():
    assert np.array_equal(decode_rle(encode_rle(np.array([[0, 1], [2, 0]], np.uint8))), [[False, True], [True, False]])
    with pytest.raises(ValueError, match="threshold"):
        encode_rle(np.full((2, 2), 0.7))
    with pytest.raises(ValueError, match="2-D"):
        encode_rle(np.zeros((2, 2, 1), bool))


def test_higher_score_wins_where_instances_overlap():
    first = np.zeros((4, 6), bool)
    first[:, :4] = True
    second = np.zeros((4, 6), bool)
    second[:, 2:] = True
    labels = label_map([first, second], [0.9, 0.8], 4, 6)
    assert labels.dtype == np.uint8
    assert labels[0].tolist() == [1, 1, 1, 1, 2, 2]
    # Same masks, scores not in descending order: label numbers follow the given order, overlaps the score.
    labels = label_map([first, second], [0.5, 0.8], 4, 6)
    assert labels[0].tolist() == [1, 1, 2, 2, 2, 2]
    # Equal scores: the earlier instance wins.
    assert label_map([first, second], [0.7, 0.7], 4, 6)[0].tolist() == [1, 1, 1, 1, 2, 2]


def test_label_numbers_follow_the_given_order_even_for_empty_masks():
    empty = np.zeros((3, 3), bool)
    dot = np.zeros((3, 3), bool)
    dot[1, 1] = True
    labels = label_map([empty, dot], [0.9, 0.5], 3, 3)
    assert labels[1, 1] == 2 and (labels == 1).sum() == 0


def test_dtype_is_uint8_below_256_instances_and_uint16_from_256():
    assert label_map(_random_masks(255, 40, 40), np.linspace(1, 0, 255), 40, 40).dtype == np.uint8
    masks = _random_masks(300, 40, 40)
    labels = label_map(masks, np.linspace(1, 0, 300), 40, 40)
    assert labels.dtype == np.uint16 and labels.max() > 255


def test_builder_equals_label_map_and_upgrades_to_uint16_keeping_labels():
    masks = _random_masks(300, 40, 40, seed=3)
    scores = np.linspace(1, 0, 300)
    builder = LabelMapBuilder(40, 40)
    for index, (mask, score) in enumerate(zip(masks, scores)):
        assert builder.add(mask, score=score) == index + 1
        if index == 254:
            before_upgrade = builder.label_map()
            assert before_upgrade.dtype == np.uint8
    after = builder.label_map()
    assert after.dtype == np.uint16
    assert np.array_equal(after, label_map(masks, scores, 40, 40))
    painted_early = before_upgrade > 0
    assert np.array_equal(after[painted_early], before_upgrade[painted_early])


def test_builder_accepts_rle_and_checks_order_and_shape():
    mask = np.eye(5, dtype=bool)
    builder = LabelMapBuilder(5, 5)
    builder.add(encode_rle(mask), score=0.9)
    assert np.array_equal(builder.label_map(), mask.astype(np.uint8))
    with pytest.raises(ValueError, match="score-descending"):
        builder.add(mask, score=0.95)
    with pytest.raises(ValueError, match="4x5 .*5x5"):
        builder.add(np.zeros((4, 5), bool))


def test_masks_and_scores_must_pair_up():
    masks = _random_masks(3, 8, 8)
    with pytest.raises(ValueError, match="2 masks but 3 scores"):
        label_map(masks[:2], [0.9, 0.8, 0.7], 8, 8)
    with pytest.raises(ValueError, match="more masks than scores"):
        label_map(masks, [0.9, 0.8], 8, 8)


@pytest.mark.parametrize("count,bit_depth", [(200, 8), (700, 16)])
def test_label_map_png_round_trip(count, bit_depth):
    builder = LabelMapBuilder(60, 50)
    for mask in _random_masks(count, 60, 50, seed=count):
        builder.add(mask)
    labels = builder.label_map()
    data = builder.png()
    assert data == label_map_png(labels)
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[24] == bit_depth  # IHDR bit depth byte
    restored = read_label_map_png(data)
    assert restored.dtype == labels.dtype and np.array_equal(restored, labels)
    with Image.open(io.BytesIO(data)) as image:
        assert image.size == (50, 60)
        image.verify()  # chunk CRCs


def test_read_label_map_png_rejects_colour_pngs():
    buffer = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buffer, "PNG")
    with pytest.raises(ValueError, match="grayscale"):
        read_label_map_png(buffer.getvalue())
