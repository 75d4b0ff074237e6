"""Element-wise chains of the training step as fused kernels on a GPU.

On a GPU the colour distortion (~30 passes over a micro-batch's images) and the mask term of the loss (~10 passes
each way over [B, Ph, Pw, K] floats: 200 MB per pass for yolact_r18_small's batch of 64) are bound by memory
traffic, not arithmetic. ``FusedOnCuda`` runs such a function through ``torch.compile`` where its first argument
is on a CUDA device: one kernel per chain reads the inputs once and writes the result once (the backward pass too).
The values are those of the same operations, up to float32 rounding (the compiled kernels may contract or reorder
them: within 1e-6 relative, tests/test_training_fused.py). Elsewhere (CPUs, where the chunked eager code is as fast)
the function runs as it is.

Sizes are compiled as dynamic (``dynamic=True``), so the varying number of masks per batch compiles once. A
function that cannot be compiled on this machine (no Triton, an unsupported operation) runs as it is, with one
warning.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

import torch

LOG = logging.getLogger(__name__)


class FusedOnCuda:
    """fn, compiled where its first argument is on a CUDA device (on the first such call), as it is elsewhere."""

    def __init__(self, fn: Callable):
        self.fn = fn
        self.compiled: Callable | None = None
        self.failed = False
        self.__doc__ = fn.__doc__

    def __call__(self, *args):
        if self.failed or not args[0].is_cuda:
            return self.fn(*args)
        if self.compiled is None:
            self.compiled = torch.compile(self.fn, dynamic=True, fullgraph=True)
        try:
            return self.compiled(*args)
        except Exception as err:  # noqa: BLE001  (any compiler failure: the plain function is always right)
            LOG.warning("%s runs unfused on this machine: torch.compile failed (%s: %s)", self.fn.__name__,
                        type(err).__name__, err)
            self.failed = True
            return self.fn(*args)
