"""The training code's bilinear resize (align_corners=False, no antialias): the same values at any torch thread
count, so that a micro-batch built in a loader worker (one thread) equals the one the rank builds itself (its
threads) and a CPU loss does not depend on ``distributed.threads_per_process``.

torch's CPU kernel for float inputs switches to its channels-last kernel when it runs on one thread and the input
has exactly 3 channels (a tuning for RGB images): images and 3-object mask stacks then differ from the other
thread counts' in the last bits (a thresholded mask now and then by a pixel), and that kernel is slower on
mask stacks. Resizing every channel as a plane of its own ([N*C, 1, H, W]) always runs the generic kernel, whose
values are those of any other thread count. uint8 inputs go to torch's uint8 kernel, which has no such switch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def resize_bilinear(x: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """x: [N, C, H, W] -> [N, C, h, w], ``F.interpolate(x, size, mode="bilinear", align_corners=False)``'s values
    with torch's generic kernel at every thread count (float) or its uint8 kernel (uint8)."""
    height, width = int(size[0]), int(size[1])
    if not x.is_floating_point():
        return F.interpolate(x, size=(height, width), mode="bilinear", align_corners=False)
    batch, channels = x.shape[:2]
    if batch * channels == 0:
        return x.new_zeros((batch, channels, height, width))
    planes = x.reshape(batch * channels, 1, *x.shape[2:]).contiguous()  # a copy only of a channels-last input
    out = F.interpolate(planes, size=(height, width), mode="bilinear", align_corners=False)
    return out.reshape(batch, channels, height, width)
