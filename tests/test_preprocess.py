"""preprocess_rgb: the network input in one pass equals, bit for bit, the resize then numpy's normalization (and,
within float32 rounding, torch's F.interpolate then (x - mean) / std, the reference's FastBaseTransform)."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipelines.ops.image_ops import resize_bilinear, resize_normalized_planes
from pipelines.ops.preprocess import preprocess_rgb

MEAN = (103.94, 116.78, 123.68)
STD = (57.38, 57.12, 58.40)


def spec(height, width, order="RGB"):
    return {
        "shape": [1, 3, height, width],
        "mean": list(MEAN),
        "std": list(STD),
        "channel_order": order,
        "resize": {"mode": "bilinear", "keep_aspect_ratio": False},
    }


def two_steps(rgb, height, width, order):
    """What preprocess_rgb did before its one-pass kernel: the resize, then the channels, then numpy's math."""
    image = resize_bilinear(rgb, (height, width))[..., :3]
    if order == "BGR":
        image = image[..., ::-1]
    chw = np.ascontiguousarray(image.transpose(2, 0, 1))
    chw -= np.asarray(MEAN, dtype=np.float32).reshape(-1, 1, 1)
    chw /= np.asarray(STD, dtype=np.float32).reshape(-1, 1, 1)
    return chw


@pytest.mark.parametrize(
    "in_shape, size",
    [
        ((480, 640, 3), (550, 550)),  # up rows, down cols
        ((1080, 1920, 4), (550, 550)),  # RGBX (decode_image(shared_memory=True)), down
        ((37, 1, 3), (64, 64)),  # one column
        ((1, 1, 4), (256, 256)),  # one pixel
        ((256, 256, 3), (256, 256)),  # identity
    ],
)
@pytest.mark.parametrize("order", ["RGB", "BGR"])
def test_one_pass_equals_the_resize_then_the_normalization(in_shape, size, order):
    rgb = np.random.default_rng(sum(in_shape)).integers(0, 256, in_shape, dtype=np.uint8)
    got = preprocess_rgb(rgb, spec(*size, order))
    assert got.dtype == np.float32 and got.shape == (3,) + size and got.flags.c_contiguous
    np.testing.assert_array_equal(got, two_steps(rgb, *size, order))


def test_one_pass_matches_torch_fast_base_transform():
    rgb = np.random.default_rng(7).integers(0, 256, (333, 517, 3), dtype=np.uint8)
    got = preprocess_rgb(rgb, spec(550, 550, "BGR"))
    x = torch.from_numpy(rgb[..., ::-1].astype(np.float32).copy()).permute(2, 0, 1)[None]
    x = F.interpolate(x, (550, 550), mode="bilinear", align_corners=False)
    want = ((x - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1))[0].numpy()
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


def test_channels_not_named_are_not_read_and_bad_channels_are_refused():
    rgbx = np.random.default_rng(3).integers(0, 256, (20, 30, 4), dtype=np.uint8)
    other = rgbx.copy()
    other[..., 3] = 255 - other[..., 3]
    planes = resize_normalized_planes(rgbx, (9, 11), (0, 1, 2), np.zeros(3), np.ones(3))
    np.testing.assert_array_equal(planes, resize_normalized_planes(other, (9, 11), (0, 1, 2), np.zeros(3), np.ones(3)))
    with pytest.raises(ValueError, match="channels"):
        resize_normalized_planes(rgbx, (9, 11), (0, 1, 4), np.zeros(3), np.ones(3))
