"""The element-wise chains that a GPU runs as fused kernels (pipelines/training/fused.py): they compile whole (no
graph break, which on a GPU would leave them unfused) and give the values of the plain functions.

Two ways of compiling here, neither of them a GPU's Triton kernels:
- the mask term with inductor's CPU backend (a C++ compiler instead of Triton): the whole path down to generated,
  compiled, run code, on a small graph;
- the rest with `compiled_up_to_code_generation`: everything torch.compile does before generating code (the traced
  graph, AOTAutograd's forward and backward graphs with inductor's decompositions and its partition between them,
  donated buffers), the graphs then run by PyTorch's own operators. The C++ code of the larger graphs is not what a
  GPU runs, and compiling it took ~4 of this file's ~5 minutes on 2 cores.
Tolerances: the compiled kernels may contract a multiply and an add into one rounding and sum in another order, and
the decompositions compute some operations as other ones; float32's relative rounding is 6e-8 per operation, so sums
of a few hundred terms stay within 1e-6 relative, and the colour's values (-2.2..2.7 after normalization) within 1e-5
absolute.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from pipelines.training import batches, loss_targets, photometric, yolact_loss
from pipelines.training.fused import FusedOnCuda

MEAN = torch.tensor([123.68, 116.78, 103.94])[None, :, None, None]
STD = torch.tensor([58.40, 57.12, 57.38])[None, :, None, None]


@pytest.fixture
def compiled_up_to_code_generation(monkeypatch):
    """torch.compile, also inside FusedOnCuda, with the backend that runs inductor's decompositions and partition,
    not its code generation."""
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="aot_eager_decomp_partition"))


def colour_inputs(count: int, seed: int):
    rng = np.random.default_rng(seed)
    images = torch.from_numpy(rng.integers(0, 256, (count, 3, 24, 28), dtype=np.uint8))
    draws = photometric.draws_tensor([photometric.draw(rng) for _ in range(count)])
    return images, draws, MEAN, STD


def mask_inputs(slots: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    logits = (torch.randn(3, 14, 18, slots, generator=generator) * 4).requires_grad_()
    boxes = torch.rand(3, slots, 4, generator=generator).sort(dim=2)[0]  # x1 < y1 < x2 < y2: a point form
    mask_t = (torch.rand(3, 14, 18, slots, generator=generator) > 0.5).float()
    return logits, boxes, mask_t


def test_the_colour_compiles_whole_and_gives_the_plain_values(compiled_up_to_code_generation):
    compiled = torch.compile(batches._distorted_normalized, dynamic=True, fullgraph=True)
    for count, seed in ((4, 1), (6, 2)):
        inputs = colour_inputs(count, seed)
        torch.testing.assert_close(compiled(*inputs), batches._distorted_normalized(*inputs), rtol=0, atol=1e-5)


def test_the_mask_term_compiles_whole_and_gives_the_plain_values_and_gradients():
    compiled = torch.compile(yolact_loss._cropped_mask_bce, dynamic=True, fullgraph=True)
    for slots, seed in ((7, 3), (12, 4)):  # the number of masks changes from batch to batch
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


def loss_arguments(counts: list[int], masks_to_train: int, seed: int):
    """loss_sums' arguments for a random batch (images with counts objects, small masks packed) and its outputs."""
    from tests.test_training_loss_vectorized import (
        PROTO,
        SEGM,
        random_outputs,
        random_priors,  # noqa: PLC0415
        random_targets,
    )

    generator = torch.Generator().manual_seed(seed)
    priors = random_priors(generator)
    targets = [random_targets(generator, count, seed=seed + i, duplicate=True) for i, count in enumerate(counts)]
    packed = loss_targets.PackedTargets.pack(targets, [(PROTO, PROTO), (SEGM, SEGM)])
    loss = yolact_loss.YolactLoss(yolact_loss.LossConfig(masks_to_train=masks_to_train), priors)
    matches = loss.match(packed)
    slots = matches.slots
    outputs = random_outputs(generator, len(counts), priors.shape[0])
    arguments = (
        outputs["loc"],
        outputs["conf"],
        outputs["mask"],
        outputs["proto"],
        outputs["segm"],
        matches.conf,
        matches.loc,
        matches.gt_box,
        matches.gt_index,
        slots.image_idx,
        slots.prior_idx,
        slots.slot_idx,
        slots.scale,
        slots.count,
        packed.masks_at((PROTO, PROTO)),
        packed.masks_at((SEGM, SEGM)),
        packed.labels,
        packed.valid,
        loss.cfg,
    )
    return arguments, list(outputs.values())


def test_the_whole_loss_compiles_whole_and_gives_the_plain_sums_and_gradients(compiled_up_to_code_generation):
    """The loss's four terms as one graph, run as FusedOnCuda runs it on a GPU: the plain sums within 1e-5 relative
    (sums of up to ~10^4 float32 terms, each compiled kernel free to reorder them) and the same gradients. The first
    call also runs a trial forward and backward: on the step's own graph that backward ran twice, which a backward
    with donated buffers refused (the loss ran unfused on GPUs) and which, with them off, gave wrong gradients."""
    compiled = FusedOnCuda(yolact_loss._loss_sums).run_compiled
    # counts and slots change from batch to batch; no object at all takes the graph's other branches
    for counts, masks_to_train, seed in (([12, 0, 20, 5], 100, 1), ([15, 9, 3], 6, 2), ([0, 0], 100, 3)):
        arguments, inputs = loss_arguments(counts, masks_to_train, seed)
        want = yolact_loss._loss_sums(*arguments)
        want_grads = torch.autograd.grad(sum(want.values()), inputs, allow_unused=True)
        got = compiled(*arguments)
        got_grads = torch.autograd.grad(sum(got.values()), inputs, allow_unused=True)
        for key in yolact_loss.LOSS_KEYS:
            torch.testing.assert_close(got[key], want[key], rtol=1e-5, atol=1e-6, msg=f"{counts}: {key}")
        for got_grad, want_grad in zip(got_grads, want_grads):
            if want_grad is None:
                assert got_grad is None or not got_grad.any()
            else:
                torch.testing.assert_close(got_grad, want_grad, rtol=1e-5, atol=1e-6)


def test_the_loss_gives_the_same_sums_through_fused_on_cuda_off_a_gpu():
    arguments, _ = loss_arguments([4, 1], 100, 4)
    got = yolact_loss.loss_sums(*arguments)
    want = yolact_loss._loss_sums(*arguments)
    assert all(torch.equal(got[key], want[key]) for key in yolact_loss.LOSS_KEYS)
    assert yolact_loss.loss_sums.compiled is None


def test_the_matching_compiles_whole_in_two_parts_and_gives_the_plain_matches(
    monkeypatch, compiled_up_to_code_generation
):
    """match_batch with its two parts compiled (as a GPU runs them) against the plain parts: the same classes and
    objects per prior, offsets within float32 rounding. Batches with and without two objects that want the same
    prior (the greedy path between the parts)."""
    from pipelines.training import boxes
    from tests.test_training_loss_vectorized import random_priors, random_targets  # noqa: PLC0415

    compiled = {
        name: torch.compile(getattr(boxes, "_" + name), dynamic=True, fullgraph=True)
        for name in ("best_overlaps", "match_targets")
    }
    for counts, duplicate, seed in (([12, 0, 20, 5], True, 5), ([3, 1], False, 6), ([7, 2, 9], False, 7)):
        generator = torch.Generator().manual_seed(seed)
        priors = random_priors(generator)
        packed = loss_targets.PackedTargets.pack(
            [random_targets(generator, count, seed + i, duplicate) for i, count in enumerate(counts)], [(4, 4)]
        )
        arguments = (packed.boxes, packed.labels, packed.valid, priors)
        want = boxes.match_batch(*arguments)
        with monkeypatch.context() as patched:
            for name, function in compiled.items():
                patched.setattr(boxes, name, function)
            got = boxes.match_batch(*arguments)
        assert torch.equal(got.conf, want.conf) and torch.equal(got.gt_index, want.gt_index), counts
        assert got.counts == want.counts == (want.conf > 0).sum(dim=1).tolist()
        torch.testing.assert_close(got.loc, want.loc, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(got.gt_box, want.gt_box, rtol=0, atol=0)


def test_the_first_compiled_call_compiles_the_backward_without_touching_gradients(compiled_up_to_code_generation):
    fused = FusedOnCuda(yolact_loss._cropped_mask_bce)
    logits, boxes, mask_t = mask_inputs(6, 7)
    result = fused.run_compiled(logits, boxes, mask_t)
    assert logits.grad is None
    result.sum().backward()  # the step's own backward runs on its graph, untouched by the trial
    (want,) = torch.autograd.grad(yolact_loss._cropped_mask_bce(logits, boxes, mask_t).sum(), logits)
    torch.testing.assert_close(logits.grad, want, rtol=1e-6, atol=1e-7)


def test_a_backward_that_cannot_compile_fails_in_the_forward_call():
    """backward_compiled_with_forward moves a backward's compile failure from the step's backward pass to the
    forward call, where FusedOnCuda falls back, on a recompilation too: a backend whose backward compiler fails
    from its second graph on, the second graph being size 1's specialization."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from pipelines.training.fused import backward_compiled_with_forward

    def compiled_with_failing_recompile():
        backward_graphs = []

        def backward(graph, example_inputs):
            backward_graphs.append(graph)
            if len(backward_graphs) > 1:
                raise RuntimeError("this backward cannot compile")
            return make_boxed_func(graph)

        torch._dynamo.reset()
        backend = aot_autograd(fw_compiler=lambda graph, example_inputs: make_boxed_func(graph), bw_compiler=backward)
        return torch.compile(yolact_loss._cropped_mask_bce, backend=backend, dynamic=True, fullgraph=True)

    compiled = compiled_with_failing_recompile()
    with backward_compiled_with_forward():
        compiled(*mask_inputs(6, 8)).sum().backward()
        with pytest.raises(Exception, match="this backward cannot compile"):
            compiled(*mask_inputs(1, 9))
    compiled = compiled_with_failing_recompile()
    compiled(*mask_inputs(6, 8)).sum().backward()
    result = compiled(*mask_inputs(1, 9))  # without it, the forward passes and the step's backward fails
    with pytest.raises(Exception, match="this backward cannot compile"):
        result.sum().backward()
    torch._dynamo.reset()


def test_a_run_of_varying_batches_compiles_a_few_graphs_not_one_per_step(monkeypatch):
    """On a GPU each new graph costs seconds of compiling and torch.compile gives up on a function after
    cache_size_limit graphs (8): over 40 micro-batches of 4 images whose object counts, masks to train and
    duplicate boxes vary as in training (an image with no object, one, a few, many; a batch of 0- and 1-object
    images; two objects wanting one prior: the greedy path), the loss and the matching's two parts compile a few
    graphs each (3 each with this torch: dynamic sizes, then the 0/1 and small-size specializations), none for a
    new count of objects or masks. Traced with a counting backend: the guards that decide a recompilation are the
    tracer's, whatever the backend."""
    from pipelines.training import boxes
    from tests.test_training_loss_vectorized import (
        PROTO,
        SEGM,
        random_outputs,
        random_priors,  # noqa: PLC0415
        random_targets,
    )

    graphs: dict[str, int] = {}

    def compiled(name, function):
        def counting(graph, example_inputs):
            graphs[name] = graphs.get(name, 0) + 1
            return graph.forward

        return torch.compile(function, backend=counting, dynamic=True, fullgraph=True)

    for name in ("best_overlaps", "match_targets"):
        monkeypatch.setattr(boxes, name, compiled(name, getattr(boxes, "_" + name)))
    loss_sums = compiled("loss_sums", yolact_loss._loss_sums)
    rng = np.random.default_rng(12)
    generator = torch.Generator().manual_seed(12)
    priors = random_priors(generator)
    loss = yolact_loss.YolactLoss(yolact_loss.LossConfig(masks_to_train=24), priors)
    batches = [[int(c) for c in rng.choice([0, 1, 2, 3, 5, 8, 13, 20], 4)] for _ in range(36)]
    batches += [[0, 1, 0, 0], [1, 1, 1, 1], [0, 0, 0, 0], [2, 0, 1, 0]]
    for step, counts in enumerate(batches):
        targets = [
            random_targets(generator, count, seed=step * 10 + i, duplicate=step % 3 == 0)
            for i, count in enumerate(counts)
        ]
        packed = loss_targets.PackedTargets.pack(targets, [(PROTO, PROTO), (SEGM, SEGM)])
        matches, outputs = loss.match(packed), random_outputs(generator, len(counts), priors.shape[0])
        slots = matches.slots
        loss_sums(
            outputs["loc"],
            outputs["conf"],
            outputs["mask"],
            outputs["proto"],
            outputs["segm"],
            matches.conf,
            matches.loc,
            matches.gt_box,
            matches.gt_index,
            slots.image_idx,
            slots.prior_idx,
            slots.slot_idx,
            slots.scale,
            slots.count,
            packed.masks_at((PROTO, PROTO)),
            packed.masks_at((SEGM, SEGM)),
            packed.labels,
            packed.valid,
            loss.cfg,
        )
    assert set(graphs) == {"best_overlaps", "match_targets", "loss_sums"}
    assert max(graphs.values()) <= 4, graphs
    torch._dynamo.reset()
