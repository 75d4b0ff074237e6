"""The element-wise chains that a GPU runs as fused kernels (pipelines/training/fused.py): they compile whole (no
graph break, which on a GPU would leave them unfused) and give the values of the plain functions.

Compiled here with the CPU backend (a C++ compiler instead of Triton): the same traced graph as on a GPU, other
generated code. Tolerances: the compiled kernels may contract a multiply and an add into one rounding and sum in
another order; float32's relative rounding is 6e-8 per operation, so sums of a few hundred terms stay within 1e-6
relative, and the colour's values (-2.2..2.7 after normalization) within 1e-5 absolute.
"""
from __future__ import annotations

import numpy as np
import torch

from pipelines.training import batches, photometric, yolact_loss
from pipelines.training.fused import FusedOnCuda

MEAN = torch.tensor([123.68, 116.78, 103.94])[None, :, None, None]
STD = torch.tensor([58.40, 57.12, 57.38])[None, :, None, None]


def colour_inputs(count: int, seed: int):
    rng = np.random.default_rng(seed)
    images = torch.from_numpy(rng.integers(0, 256, (count, 3, 24, 28), dtype=np.uint8))
    draws = photometric.draws_tensor([photometric.draw(rng) for _ in range(count)])
    return images, draws, MEAN, STD


def mask_inputs(slots: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 14, 18, slots, generator=generator) * 4).requires_grad_()
    boxes = torch.rand(3, slots, 4, generator=generator).sort(dim=2)[0]    # x1 < y1 < x2 < y2: a point form
    mask_t = (torch.rand(3, 14, 18, slots, generator=generator) > 0.5).float()
    return logits, boxes, mask_t


def test_the_colour_compiles_whole_and_gives_the_plain_values():
    compiled = torch.compile(batches._distorted_normalized, dynamic=True, fullgraph=True)
    for count, seed in ((4, 1), (6, 2)):
        inputs = colour_inputs(count, seed)
        torch.testing.assert_close(compiled(*inputs), batches._distorted_normalized(*inputs), rtol=0, atol=1e-5)


def test_the_mask_term_compiles_whole_and_gives_the_plain_values_and_gradients():
    compiled = torch.compile(yolact_loss._cropped_mask_bce, dynamic=True, fullgraph=True)
    for slots, seed in ((7, 3), (12, 4)):      # the number of masks changes from batch to batch
        logits, boxes, mask_t = mask_inputs(slots, seed)
        want = yolact_loss._cropped_mask_bce(logits, boxes, mask_t)
        (want_grad,) = torch.autograd.grad(want.sum(), logits)
        got = compiled(logits, boxes, mask_t)
        (got_grad,) = torch.autograd.grad(got.sum(), logits)
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got_grad, want_grad, rtol=1e-6, atol=1e-7)


def test_a_nan_prediction_makes_the_compiled_mask_term_nan_without_failing():
    compiled = torch.compile(yolact_loss._cropped_mask_bce, dynamic=True, fullgraph=True)
    logits, boxes, mask_t = mask_inputs(5, 5)
    poisoned = logits.detach().clone()
    poisoned[1, 3, 4, 2] = float("nan")
    got = compiled(poisoned, boxes, mask_t)
    assert torch.isnan(got[1, 2]) and torch.isfinite(got[0]).all() and torch.isfinite(got[2]).all()


def test_off_a_gpu_the_function_runs_as_it_is():
    fused = FusedOnCuda(yolact_loss._cropped_mask_bce)
    logits, boxes, mask_t = mask_inputs(6, 6)
    assert torch.equal(fused(logits, boxes, mask_t), yolact_loss._cropped_mask_bce(logits, boxes, mask_t))
    assert fused.compiled is None and not fused.failed
