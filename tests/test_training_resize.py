"""resize_bilinear: F.interpolate's values (bilinear, align_corners=False) with torch's generic kernel at every
thread count, for the stacks the training code resizes (1-6 masks, RGB images channels-last, batches of masks);
the input workers' RGBX pixels (resized, cropped and mirrored as 4-byte pixels) give the RGB image's values."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipelines.training.augment import Geometry, crop_image, fill_value
from pipelines.training.resize import resize_bilinear


def interpolate(x: torch.Tensor, size, threads: int) -> torch.Tensor:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return F.interpolate(x, size=size, mode="bilinear", align_corners=False)
    finally:
        torch.set_num_threads(before)


def resized(x: torch.Tensor, size, threads: int) -> torch.Tensor:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return resize_bilinear(x, size)
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("batch,channels", [(1, 1), (1, 2), (1, 3), (1, 4), (1, 6), (2, 3), (4, 5)])
@pytest.mark.parametrize("size", [(352, 352), (88, 88), (44, 44), (61, 130)])
def test_masks_equal_the_generic_kernel_at_any_thread_count(batch, channels, size):
    masks = (torch.rand(batch, channels, 97, 123, generator=torch.Generator().manual_seed(channels)) > 0.5).float()
    generic = interpolate(masks, size, threads=2)
    for threads in (1, 2, 3):
        out = resized(masks, size, threads)
        assert out.shape == generic.shape and torch.equal(out, generic), threads


def test_one_thread_alone_would_differ_for_three_channels():
    """Why the module exists: torch's own interpolate on one thread gives other values for 3 channels."""
    masks = (torch.rand(1, 3, 97, 123, generator=torch.Generator().manual_seed(0)) > 0.5).float()
    assert not torch.equal(interpolate(masks, (352, 352), 1), interpolate(masks, (352, 352), 2))
    assert torch.equal(resized(masks, (352, 352), 1), interpolate(masks, (352, 352), 2))


def test_channels_last_rgb_image():
    """An HWC image's channels-last view, float and uint8 (torch's uint8 kernel has no thread switch)."""
    pixels = np.random.default_rng(0).integers(0, 256, (91, 157, 3), dtype=np.uint8)
    for dtype in (np.float32, np.uint8):
        image = torch.from_numpy(pixels.astype(dtype)).permute(2, 0, 1)[None]
        generic = interpolate(image, (64, 80), threads=2)
        for threads in (1, 2):
            out = resized(image, (64, 80), threads)
            assert out.dtype == image.dtype and torch.equal(out, generic)


def test_empty_stack():
    assert resize_bilinear(torch.zeros(1, 0, 10, 12), (5, 6)).shape == (1, 0, 5, 6)
    assert resize_bilinear(torch.zeros(0, 3, 10, 12), (5, 6)).shape == (0, 3, 5, 6)


@pytest.mark.parametrize("shape,size", [((91, 157), (64, 80)), ((480, 640), (352, 352)), ((200, 130), (352, 352))])
def test_rgbx_pixels_resize_to_the_rgb_values(shape, size):
    """The input workers resize decoded RGBX pixels (4 bytes each, the padding byte anything) with torch's uint8
    kernel and drop the padding channel: R, G and B are those of the RGB image resized."""
    rgbx = np.random.default_rng(1).integers(0, 256, (*shape, 4), dtype=np.uint8)
    rgb = np.ascontiguousarray(rgbx[..., :3])
    for threads in (1, 2):
        four = resized(torch.from_numpy(rgbx).permute(2, 0, 1)[None], size, threads)[:, :3]
        assert torch.equal(four, resized(torch.from_numpy(rgb).permute(2, 0, 1)[None], size, threads))


def test_rgbx_windows_crop_and_mirror_as_rgb_ones():
    """augment.crop_image on a decoder's read-only RGBX buffer (its uint32 mirror, the fill's padding channel)
    gives the RGB image's window in its first three channels."""
    rgbx = np.random.default_rng(2).integers(0, 256, (37, 53, 4), dtype=np.uint8)
    rgbx.flags.writeable = False
    rgb = np.ascontiguousarray(rgbx[..., :3])
    mean = np.float32([123.7, 116.8, 103.9])
    for top, left, height, width in ((3, 5, 20, 30), (0, 0, 37, 53), (-4, -6, 50, 70), (10, 40, 20, 30)):
        for mirror in (False, True):
            g = Geometry(
                top,
                left,
                height,
                width,
                mirror,
                np.zeros(0, np.int64),
                np.zeros((0, 4), np.float32),
                np.zeros(0, np.int64),
            )
            four = crop_image(rgbx, g, fill_value(rgbx.dtype, mean, 4))
            assert four.flags.writeable and four.flags.c_contiguous and four.shape == (height, width, 4)
            assert np.array_equal(four[..., :3], crop_image(rgb, g, fill_value(rgb.dtype, mean)))


@pytest.mark.parametrize(
    "size,small", [(352, (88, 88)), (352, (44, 44)), (550, (138, 138)), (550, (69, 69)), (96, (16, 16)), (64, (8, 8))]
)
def test_masks_resized_twice_equal_torchs_but_for_ties_at_the_threshold(size, small):
    """augment.resized_mask_bits (the input workers' masks at the loss's sizes, without the S x S ones) against
    torch's two resizes and threshold (augment.resize_masks, then loss_targets.downsample_bits): random 0/1 masks of
    window sizes, empty and full ones, 1 and 2 threads. A pixel may differ only where torch's value is 0.5 within 2
    float32 ulps (the same bilinear sums, rounded in another order); at most 1 in 500 pixels."""
    from pipelines.training.augment import resize_masks, resized_mask_bits

    rng = np.random.default_rng(size + small[0])
    differ = total = 0
    for _case in range(12):
        height, width = int(rng.integers(1, 700)), int(rng.integers(1, 700))
        masks = (rng.random((3, height, width)) < rng.random()).astype(np.uint8)
        masks[0] = 0
        masks[1, : height // 2] = 1
        for threads in (1, 2):
            with_threads = torch.get_num_threads()
            torch.set_num_threads(threads)
            try:
                values = resize_bilinear(resize_masks(masks, size)[None], small)[0]
                got = resized_mask_bits(masks, size, [small])[small]
            finally:
                torch.set_num_threads(with_threads)
            assert got.dtype == torch.bool and got.shape == (3, *small)
            wrong = got != (values > 0.5)
            assert torch.all((values[wrong] - 0.5).abs() <= 2 * 2**-24), (height, width, threads)
            assert not got[0].any()
            differ, total = differ + int(wrong.sum()), total + wrong.numel()
    assert differ <= total / 500, (differ, total)
