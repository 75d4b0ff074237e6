"""The YOLACT loss on hand-built cases: matching thresholds, hard negative mining ratio, mask loss normalization,
and the sampler's promise that every strategy sees the same global batch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from pipelines.ops.yolact_postprocess import decode_boxes
from pipelines.training.boxes import encode, jaccard, match, point_form
from pipelines.training.loss_targets import Targets
from pipelines.training.sampler import GlobalBatchSampler
from pipelines.training.yolact_loss import LossConfig, Normalizer, YolactLoss, hard_negatives


def square_prior(cx: float, cy: float, side: float) -> list[float]:
    return [cx, cy, side, side]


def test_matching_thresholds_and_forced_best_prior():
    truth = torch.tensor([[0.4, 0.4, 0.6, 0.6]])  # side 0.2, centre 0.5
    sides = {"pos": 0.2 / math.sqrt(0.55), "neutral": 0.2 / math.sqrt(0.45), "neg": 0.2 / math.sqrt(0.35)}
    priors = torch.tensor(
        [square_prior(0.5, 0.5, s) for s in sides.values()]
        + [square_prior(0.5, 0.5, 0.2 / math.sqrt(0.60)), square_prior(0.1, 0.1, 0.05)]
    )
    ious = jaccard(truth, point_form(priors))[0]
    assert ious[:3].tolist() == pytest.approx([0.55, 0.45, 0.35], abs=1e-5)
    m = match(truth, torch.tensor([2]), priors, pos_thresh=0.5, neg_thresh=0.4)
    # prior 3 (IoU 0.60) is the object's best prior: forced positive; 0.55 -> positive; 0.45 -> neutral (-1);
    # 0.35 -> background; a far prior -> background.
    assert m.conf.tolist() == [3, -1, 0, 3, 0]
    assert m.gt_index[0] == 0 and m.gt_index[3] == 0
    # regression targets decode back to the object's box through the inference decoder
    decoded = decode_boxes(m.loc[:1].numpy(), priors[:1].numpy())
    np.testing.assert_allclose(decoded[0], truth[0].numpy(), atol=1e-6)


def test_every_object_claims_its_best_prior_even_below_the_threshold():
    truths = torch.tensor([[0.0, 0.0, 0.1, 0.1], [0.5, 0.5, 0.9, 0.9]])
    priors = torch.tensor([square_prior(0.3, 0.3, 0.3), square_prior(0.7, 0.7, 0.2)])  # both IoU < 0.4
    m = match(truths, torch.tensor([0, 1]), priors)
    assert m.conf.tolist() == [1, 2]
    assert m.gt_index.tolist() == [0, 1]


def test_no_objects_means_all_background():
    m = match(torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), torch.tensor([square_prior(0.5, 0.5, 0.2)]))
    assert m.conf.tolist() == [0]


def test_hard_negative_mining_takes_three_negatives_per_positive_by_background_loss():
    num_priors, classes = 20, 3
    conf_t = torch.zeros(1, num_priors, dtype=torch.long)
    conf_t[0, [0, 1]] = 1  # 2 positives
    conf_t[0, 2] = -1  # 1 neutral, never a negative
    conf = torch.zeros(1, num_priors, classes)
    badness = torch.arange(num_priors, dtype=torch.float32)  # prior i: foreground logit i
    conf[0, :, 1] = badness
    conf[0, 2, 1] = 100.0  # the neutral would be the hardest "negative"
    negatives = hard_negatives(conf, conf_t, negpos_ratio=3)
    assert negatives.sum() == 6
    assert torch.nonzero(negatives[0]).squeeze(1).tolist() == list(range(14, 20))
    assert not negatives[0, :3].any()


def test_conf_loss_is_cross_entropy_over_positives_and_mined_negatives():
    priors = torch.tensor([square_prior(0.5, 0.5, 0.2)] + [square_prior(0.05 * i, 0.05, 0.02) for i in range(1, 9)])
    loss = YolactLoss(LossConfig(), priors)
    conf = torch.randn(1, 9, 3, generator=torch.Generator().manual_seed(0))
    conf_t = torch.zeros(1, 9, dtype=torch.long)
    conf_t[0, 0] = 2
    chosen = (conf_t > 0) | hard_negatives(conf, conf_t, 3)
    assert chosen.sum() == 4
    expected = F.cross_entropy(conf[chosen], conf_t[chosen], reduction="sum")
    assert loss.conf_sum(conf, conf_t) == pytest.approx(float(expected))


def test_mask_loss_is_bce_inside_the_box_divided_by_the_box_area_in_proto_pixels():
    size, proto_size = 32, 8
    box = torch.tensor([[0.25, 0.25, 0.75, 0.5]])  # 4 x 2 proto pixels
    gt_mask = torch.zeros(1, size, size)
    gt_mask[0, 8:16, 8:24] = 1.0
    target = Targets(boxes=box, labels=torch.tensor([0]), masks=gt_mask)
    priors = torch.tensor([[0.5, 0.375, 0.5, 0.25]])
    loss = YolactLoss(LossConfig(), priors)
    matches = loss.match([target])
    m = matches[0]
    assert m.conf.tolist() == [1]
    proto = torch.zeros(proto_size, proto_size, 1)  # every logit 0 -> p = 0.5 everywhere
    coeffs = torch.ones(1, 1)
    per_mask = loss.mask_sum(proto[None], coeffs[None], [target], matches)
    # crop window with 1 proto px padding: cols 1..6, rows 1..4 -> 6 x 4 = 24 pixels at p = 0.5, BCE ln 2 each
    assert float(per_mask) == pytest.approx(24 * math.log(2) / (4 * 2), rel=1e-5)
    outputs = {
        "loc": torch.zeros(1, 1, 4),
        "conf": torch.zeros(1, 1, 2),
        "mask": coeffs[None],
        "proto": proto[None],
        "segm": torch.zeros(1, 1, 4, 4),
    }
    sums = loss.sums(outputs, [target], matches)
    assert float(sums["mask"]) == pytest.approx(6.125 * 24 * math.log(2) / 8, rel=1e-5)
    terms = Normalizer(num_positives=2, num_images=4).apply(sums)
    assert float(terms["mask"]) == pytest.approx(float(sums["mask"]) / 2)
    assert float(terms["semantic"]) == pytest.approx(float(sums["semantic"]) / 4)


def test_masks_to_train_samples_positives_and_rescales():
    priors = torch.tensor([square_prior(0.5, 0.5, 0.5)] * 6)
    gt = torch.zeros(1, 16, 16)
    gt[0, 4:12, 4:12] = 1
    target = Targets(boxes=torch.tensor([[0.25, 0.25, 0.75, 0.75]]), labels=torch.tensor([0]), masks=gt, seed=3)
    coeffs = torch.zeros(6, 2)
    proto = torch.zeros(4, 4, 2)
    full = YolactLoss(LossConfig(masks_to_train=100), priors)
    matches = full.match([target])
    assert int(matches.positive.sum()) == 6
    sampled = YolactLoss(LossConfig(masks_to_train=2), priors)
    # identical per-positive losses: the sampled sum scaled by 6/2 equals the full sum
    assert float(sampled.mask_sum(proto[None], coeffs[None], [target], matches)) == pytest.approx(
        float(full.mask_sum(proto[None], coeffs[None], [target], matches))
    )


def test_encode_inverts_the_inference_decoder():
    rng = np.random.default_rng(0)
    priors = torch.from_numpy(
        np.concatenate([rng.uniform(0.2, 0.8, (50, 2)), rng.uniform(0.05, 0.3, (50, 2))], axis=1).astype(np.float32)
    )
    loc = torch.from_numpy(rng.normal(0, 1, (50, 4)).astype(np.float32))
    boxes = decode_boxes(loc.numpy(), priors.numpy())
    np.testing.assert_allclose(encode(torch.from_numpy(boxes), priors).numpy(), loc.numpy(), atol=2e-4)


@pytest.mark.parametrize("dp_size", [1, 2, 4])
def test_ranks_together_see_the_single_process_global_batch(dp_size):
    sampler = GlobalBatchSampler(num_samples=37, global_batch=8, micro_batch=2, seed=5)
    for epoch in range(2):
        for step in range(sampler.steps_per_epoch):
            single = sampler.micro_batches(epoch, step)
            split = [mb for rank in range(dp_size) for mb in sampler.micro_batches(epoch, step, rank, dp_size)]
            assert split == single
    order = sampler.order(0)
    assert sorted(order.tolist()) == list(range(37))
    assert not np.array_equal(order, sampler.order(1))
    with pytest.raises(ValueError, match="cannot be shared"):
        sampler.micro_batches(0, 0, 0, 3)


def test_model_loss_and_step_create_no_tensor_on_a_hard_coded_device():
    """Model, matching, loss, backward and an optimizer step on CPU data with the default device set to "meta":
    any tensor created without taking its device from the data lands on meta, and mixing it with the CPU
    tensors fails (or `.item()` on it does). That is what breaks the step on a GPU (e.g. a crop grid built on the CPU
    next to CUDA masks). Images with no object and with objects, more positives than masks_to_train."""
    from model_export.models.yolact import Yolact, get_config
    from pipelines.training.yolact_loss import num_positives

    torch.manual_seed(0)
    model = Yolact(get_config("yolact_r18_small", max_size=128))
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)

    def targets(count: int, seed: int) -> Targets:
        generator = torch.Generator().manual_seed(seed)
        corner = torch.rand(count, 2, generator=generator) * 0.5
        boxes = torch.cat([corner, corner + 0.3], dim=1)
        masks = torch.zeros(count, 128, 128)
        for index, (x1, y1, x2, y2) in enumerate((boxes * 128).long().tolist()):
            masks[index, y1:y2, x1:x2] = 1
        return Targets(boxes, torch.randint(0, 4, (count,), generator=generator), masks, seed)

    batch = [targets(0, 1), targets(3, 2)]
    loss = YolactLoss(LossConfig(masks_to_train=2), torch.from_numpy(model.priors(128)))
    images = torch.rand(2, 3, 128, 128)
    with torch.device("meta"):
        outputs = model(images)
        matches = loss.match(batch)
        terms = Normalizer(num_positives(matches), len(batch)).apply(loss.sums(outputs, batch, matches))
        optimizer.zero_grad()
        sum(terms.values()).backward()
        optimizer.step()
    assert all(value.device.type == "cpu" and torch.isfinite(value) for value in terms.values())
    assert all(p.device.type == "cpu" for p in model.parameters())


def test_matching_loss_and_colour_build_no_tensor_from_host_lists():
    """On a GPU a tensor made from a host list (torch.tensor, new_tensor) is a blocking copy: the host waits for every
    kernel queued on the stream, and in the loss that is the step's whole forward pass, so the device idles while
    the host launches the rest (the step goes at the host's pace). Matching, loss sums, backward and the colour's
    second call (its constants are made once per device) create no such tensor: recorded here on the CPU as
    `lift_fresh` of an array (a Python scalar, 0-d, goes to a kernel as an argument, without a copy)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from model_export.models.yolact import Yolact, get_config
    from pipelines.training import photometric
    from pipelines.training.batches import InputSpec, MicroBatch
    from pipelines.training.yolact_loss import num_positives

    class HostArrays(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.made = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten.lift_fresh.default and out.dim() > 0:
                self.made.append(tuple(out.shape))
            return out

    torch.manual_seed(0)
    model = Yolact(get_config("yolact_r18_small", max_size=128)).train()
    boxes = torch.tensor([[0.1, 0.1, 0.5, 0.6], [0.3, 0.2, 0.9, 0.8]])
    masks = torch.zeros(2, 128, 128)
    masks[:, 20:70, 15:60] = 1
    batch = [Targets(boxes, torch.tensor([0, 2]), masks, 1), Targets(boxes[:1], torch.tensor([1]), masks[:1], 2)]
    loss = YolactLoss(LossConfig(masks_to_train=3), torch.from_numpy(model.priors(128)))
    outputs = model(torch.rand(2, 3, 128, 128))
    spec = InputSpec(128, (123.68, 116.78, 103.94), (58.40, 57.12, 57.38))
    colour = photometric.draws_tensor([photometric.draw(np.random.default_rng(3)) for _ in range(2)])
    micro_batch = MicroBatch(
        images=torch.randint(0, 256, (2, 3, 16, 16), dtype=torch.uint8), targets=[], indices=[0, 1], colour=colour
    )
    micro_batch.finish_images(spec)
    with HostArrays() as recorded:
        matches = loss.match(batch)
        terms = Normalizer(num_positives(matches), len(batch)).apply(loss.sums(outputs, batch, matches))
        sum(terms.values()).backward()
        micro_batch.finish_images(spec)
    assert recorded.made == []
