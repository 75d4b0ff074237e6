"""resize_bilinear against torch F.interpolate(bilinear, align_corners=False, antialias=False)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipelines.ops.compiled_loops import resample, resample_above
from pipelines.ops.image_ops import bilinear_axis, resize_bilinear


def torch_resize(x: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    t = torch.from_numpy(np.asarray(x, dtype=np.float32))
    t = t[None, None] if t.ndim == 2 else t.permute(2, 0, 1)[None]
    out = F.interpolate(t, size=size, mode="bilinear", align_corners=False, antialias=False)[0]
    return out[0].numpy() if x.ndim == 2 else out.permute(1, 2, 0).numpy()


@pytest.mark.parametrize(
    "in_shape, size",
    [
        ((5, 7), (11, 13)),  # up, odd sizes
        ((13, 17), (4, 6)),  # down
        ((1, 1), (3, 5)),  # 1x1 input
        ((1, 5), (3, 1)),  # one row in, one column out
        ((6, 9, 3), (17, 5)),  # channels, up rows / down cols
        ((138, 138, 2), (550, 333)),  # proto-like upsampling to a non-square image
        ((97, 61, 3), (41, 29)),  # down, odd
        ((8, 8), (8, 8)),  # identity
    ],
)
def test_resize_bilinear_matches_torch(in_shape, size):
    x = np.random.default_rng(0).random(in_shape, dtype=np.float32)
    got = resize_bilinear(x, size)
    assert got.dtype == np.float32 and got.shape == size + in_shape[2:]
    np.testing.assert_allclose(got, torch_resize(x, size), rtol=1e-5, atol=1e-6)


def test_resize_bilinear_uint8_input_reads_as_float32():
    x = np.random.default_rng(1).integers(0, 256, (31, 45, 3), dtype=np.uint8)
    np.testing.assert_allclose(
        resize_bilinear(x, (55, 20)), torch_resize(x.astype(np.float32), (55, 20)), rtol=1e-5, atol=1e-4
    )


def test_bilinear_axis_indices_and_weights_match_torch_sampling():
    # Resizing the identity along one axis reveals torch's source indices and weights.
    in_size, out_size = 7, 19
    i0, i1, w1 = bilinear_axis(in_size, out_size)
    weights = np.zeros((out_size, in_size), dtype=np.float32)
    np.add.at(weights, (np.arange(out_size), i0), 1 - w1)
    np.add.at(weights, (np.arange(out_size), i1), w1)
    np.testing.assert_allclose(weights, torch_resize(np.eye(in_size, dtype=np.float32), (out_size, in_size)), atol=1e-7)
    assert np.all(np.diff(i0) >= 0) and np.all(np.diff(i1) >= 0) and np.all((i1 - i0 >= 0) & (i1 - i0 <= 1))
    assert i1.max() == in_size - 1 and w1.dtype == np.float32


@pytest.mark.parametrize("in_shape, size", [((23, 31), (57, 40)), ((97, 61), (13, 9)), ((6, 1), (6, 11))])
def test_a_window_of_the_tables_gives_the_whole_resize_there_and_its_threshold(in_shape, size):
    x = np.random.default_rng(2).random(in_shape, dtype=np.float32)
    rows, cols = bilinear_axis(in_shape[0], size[0]), bilinear_axis(in_shape[1], size[1])
    whole = resize_bilinear(x, size)
    r0, r1, c0, c1 = size[0] // 4, size[0] - 1, size[1] // 3, size[1]
    window = np.full((r1 - r0, c1 - c0), np.nan, np.float32)
    resample(x, *(a[r0:r1] for a in rows), *(a[c0:c1] for a in cols), window)
    np.testing.assert_array_equal(window, whole[r0:r1, c0:c1])
    above = np.zeros_like(window, dtype=bool)
    threshold = float(np.median(whole))
    resample_above(x, *(a[r0:r1] for a in rows), *(a[c0:c1] for a in cols), threshold, above)
    np.testing.assert_array_equal(above, whole[r0:r1, c0:c1] > np.float32(threshold))


def test_channels_are_resized_as_separate_planes():
    x = np.random.default_rng(3).integers(0, 256, (19, 23, 4), dtype=np.uint8)
    together = resize_bilinear(x, (40, 9))
    for c in range(4):
        np.testing.assert_array_equal(together[..., c], resize_bilinear(np.ascontiguousarray(x[..., c]), (40, 9)))


@pytest.mark.parametrize(
    "x, size",
    [
        (np.zeros((2, 2, 2, 2)), (3, 3)),
        (np.zeros((0, 4)), (3, 3)),
        (np.zeros((4, 4)), (0, 3)),
        (np.zeros((4, 4)), (3,)),
    ],
)
def test_resize_bilinear_rejects_bad_input(x, size):
    with pytest.raises(ValueError, match="resize_bilinear"):
        resize_bilinear(x, size)
