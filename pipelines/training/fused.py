"""Chains of small operations in the training step as compiled graphs on a GPU.

On a GPU the colour distortion (~30 passes over a micro-batch's images) and the mask term of the loss (~10 passes
each way over [B, Ph, Pw, K] floats: 200 MB per pass for yolact_r18_small's batch of 64) are bound by memory
traffic, not arithmetic; the rest of the loss and the matching are ~200 small kernels a step that the host launches
one by one, slower than the device runs them. ``FusedOnCuda`` runs such a function through ``torch.compile`` where
its first argument is on a CUDA device: one kernel per chain reads the inputs once and writes the result once (the
backward pass too), and the host launches a few kernels instead of hundreds. The values are those of the same
operations, up to float32 rounding (the compiled kernels may contract or reorder them: tests/test_training_fused.py).
Elsewhere (CPUs, where the chunked eager code is as fast) the function runs as it is.

Sizes are compiled as dynamic (``dynamic=True``), so the varying numbers of objects and masks per batch compile
once. A function that cannot be compiled on this machine (no Triton, an unsupported operation, forward or backward:
each compilation compiles both, and the first call runs both) runs as it is, with one warning.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable

import torch
import torch._functorch.config

LOG = logging.getLogger(__name__)


class FusedOnCuda:
    """fn, compiled where its first argument is on a CUDA device (on the first such call); elsewhere, and where
    compiling fails, ``fallback`` (default: fn as it is), which must give fn's values."""

    def __init__(self, fn: Callable, fallback: Callable | None = None):
        self.fn = fn
        self.fallback = fallback or fn
        self.compiled: Callable | None = None
        self.failed = False
        self.__doc__ = fn.__doc__

    def __call__(self, *args):
        if self.failed or not args[0].is_cuda:
            return self.fallback(*args)
        try:
            return self.run_compiled(*args)
        except Exception as err:  # noqa: BLE001  (any compiler failure: the plain function is always right)
            LOG.warning(
                "%s runs unfused on this machine: torch.compile failed (%s: %s)",
                self.fn.__name__,
                type(err).__name__,
                err,
            )
            self.failed = True
            return self.fallback(*args)

    def run_compiled(self, *args):
        """fn through torch.compile, on the arguments' device. The first call compiles it and first runs it forward
        and backward on copies of the arguments (_trial_run), so that what fails to compile or run fails here."""
        with backward_compiled_with_forward():
            if self.compiled is None:
                self.compiled = torch.compile(self.fn, dynamic=True, fullgraph=True)
                _trial_run(self.compiled, args)
            return self.compiled(*args)


def backward_compiled_with_forward():
    """A context in which torch.compile compiles a graph's backward when it compiles its forward (AOTAutograd's
    force_non_lazy_backward_lowering), on the first call and on every recompilation (a new specialization of a
    size): a backward that cannot compile then fails in the forward call, where FusedOnCuda can still fall back,
    not in the step's backward pass. A torch without the setting: as torch does (the first call's _trial_run
    still checks)."""
    config = torch._functorch.config  # noqa: SLF001  (AOTAutograd's setting, documented in that module)
    if not hasattr(config, "force_non_lazy_backward_lowering"):
        return contextlib.nullcontext()
    return config.patch(force_non_lazy_backward_lowering=True)


def _trial_run(compiled: Callable, args) -> None:
    """Run compiled forward and backward on copies of args (leaves that need a gradient where the argument does),
    so that a backward that fails to compile or to run fails here, where the plain function can still take over,
    not in the step's backward pass. Copies, because a compiled backward may reuse the buffers it saved (donated
    buffers) and so runs once per forward: the step's own graph is left for the step's backward."""
    copies = [a.detach().clone().requires_grad_(a.requires_grad) if torch.is_tensor(a) else a for a in args]
    result = compiled(*copies)
    outputs = [
        t for t in (result.values() if isinstance(result, dict) else [result]) if torch.is_tensor(t) and t.requires_grad
    ]
    inputs = [c for c in copies if torch.is_tensor(c) and c.requires_grad]
    if outputs and inputs:
        torch.autograd.grad(sum(t.float().sum() for t in outputs), inputs, allow_unused=True)
