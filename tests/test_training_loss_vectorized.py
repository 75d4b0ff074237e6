"""The batched YOLACT loss equals the loss as it was (tests/reference_yolact_loss.py: one Python loop per image and
per object) on random batches: images with 0, 1 and many objects, duplicated objects (the greedy forced-match
path), more positives than masks_to_train (the seeded draw), full-size and pre-downsampled masks."""

from __future__ import annotations

import pytest
import torch

from pipelines.training.loss_targets import PackedTargets, Targets
from pipelines.training.yolact_loss import LOSS_KEYS, LossConfig, YolactLoss, num_positives
from tests import reference_yolact_loss as reference

SIZE, PROTO, SEGM, MASK_DIM, CLASSES = 64, 16, 8, 4, 5  # CLASSES includes the background


def random_priors(generator: torch.Generator, count: int = 400) -> torch.Tensor:
    centers = torch.rand(count, 2, generator=generator)
    sides = 0.05 + 0.5 * torch.rand(count, 2, generator=generator)
    return torch.cat([centers, sides], dim=1)


def random_targets(generator: torch.Generator, count: int, seed: int, duplicate: bool = False) -> Targets:
    corner = torch.rand(count, 2, generator=generator) * 0.6
    side = 0.08 + torch.rand(count, 2, generator=generator) * 0.35
    boxes = torch.cat([corner, (corner + side).clamp(max=1.0)], dim=1)
    if duplicate and count >= 2:
        boxes[1] = boxes[0]  # same box twice: both objects want the same best prior
    masks = torch.zeros(count, SIZE, SIZE)
    for index, (x1, y1, x2, y2) in enumerate((boxes * SIZE).tolist()):
        masks[index, int(y1) : int(y2), int(x1) : int(x2)] = torch.rand(
            int(y2) - int(y1), int(x2) - int(x1), generator=generator
        )
    labels = torch.randint(0, CLASSES - 1, (count,), generator=generator)
    return Targets(boxes, labels, masks, seed)


def random_outputs(generator: torch.Generator, batch: int, num_priors: int) -> dict[str, torch.Tensor]:
    def rand(*shape):
        return torch.randn(*shape, generator=generator).requires_grad_()

    return {
        "loc": rand(batch, num_priors, 4),
        "conf": rand(batch, num_priors, CLASSES),
        "mask": rand(batch, num_priors, MASK_DIM),
        "proto": rand(batch, PROTO, PROTO, MASK_DIM),
        "segm": rand(batch, CLASSES - 1, SEGM, SEGM),
    }


def reference_terms(cfg, priors, outputs, targets):
    loss = reference.YolactLoss(reference.LossConfig(**cfg.__dict__), priors)
    ref_targets = [reference.Targets(t.boxes, t.labels, t.masks, t.seed) for t in targets]
    matches = loss.match(ref_targets)
    sums = loss.sums(outputs, ref_targets, matches)
    return matches, reference.Normalizer(reference.num_positives(matches), len(targets)).apply(sums)


@pytest.mark.parametrize(
    "counts,masks_to_train,duplicate",
    [
        ([0, 0], 100, False),  # no object anywhere
        ([1], 100, False),  # a single object
        ([0, 1, 7, 3], 100, False),  # mixed
        ([12, 0, 20, 5], 100, True),  # many, with a duplicated box: greedy forced matching
        ([15, 9, 1, 0, 30], 6, True),  # more positives than masks_to_train: the seeded draw
    ],
)
def test_batched_loss_equals_the_reference(counts, masks_to_train, duplicate):
    generator = torch.Generator().manual_seed(sum(counts) * 31 + masks_to_train)
    priors = random_priors(generator)
    targets = [random_targets(generator, count, seed=100 + i, duplicate=duplicate) for i, count in enumerate(counts)]
    outputs = random_outputs(generator, len(counts), priors.shape[0])
    cfg = LossConfig(masks_to_train=masks_to_train)

    ref_matches, expected = reference_terms(cfg, priors, outputs, targets)
    expected_total = sum(expected.values())
    expected_grads = gradients(expected_total, outputs)

    loss = YolactLoss(cfg, priors)
    for packed in (PackedTargets.pack(targets), PackedTargets.pack(targets, [(PROTO, PROTO), (SEGM, SEGM)])):
        matches = loss.match(packed)
        for i, ref in enumerate(ref_matches):
            assert torch.equal(matches[i].conf, ref.conf)
            positive = ref.conf > 0
            assert torch.equal(matches[i].gt_index[positive], ref.gt_index[positive])
            torch.testing.assert_close(matches[i].loc[positive], ref.loc[positive], rtol=1e-6, atol=1e-6)
        assert num_positives(matches) == reference.num_positives(ref_matches)
        assert matches.counts == [int(ref.positive.sum()) for ref in ref_matches]  # read with the matching
        terms = normalized_terms(loss, outputs, packed, matches)
        for key in LOSS_KEYS:
            assert float(terms[key].detach()) == pytest.approx(float(expected[key].detach()), rel=1e-5, abs=1e-7), key
        grads = gradients(sum(terms.values()), outputs)
        for got, want in zip(grads, expected_grads):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def gradients(total, outputs):
    grads = torch.autograd.grad(total, list(outputs.values()), allow_unused=True)
    return [torch.zeros_like(v) if g is None else g for g, v in zip(grads, outputs.values())]


def normalized_terms(loss, outputs, packed, matches):
    from pipelines.training.yolact_loss import Normalizer

    return Normalizer(num_positives(matches), len(packed)).apply(loss.sums(outputs, packed, matches))


def test_sampled_masks_are_the_reference_draw():
    """masks_to_train 2 of 6 positives: the same two positives (seeded CPU draw) as the reference."""
    priors = torch.tensor([[0.5, 0.5, 0.5, 0.5]] * 6)
    gt = torch.zeros(1, 16, 16)
    gt[0, 4:12, 4:12] = 1
    target = Targets(torch.tensor([[0.25, 0.25, 0.75, 0.75]]), torch.tensor([0]), gt, seed=3)
    loss = YolactLoss(LossConfig(masks_to_train=2), priors)
    matches = loss.match([target])
    kept, scale = loss.kept_positives(matches.positive, [3])
    order = torch.randperm(6, generator=torch.Generator().manual_seed(3))[:2]
    assert sorted(torch.nonzero(kept[0]).squeeze(1).tolist()) == sorted(order.tolist())
    assert scale.tolist() == [3.0]
