"""YOLACT numpy postprocess: hand-built cases from docs/yolact.md (priors, box decoding, Fast NMS, mask assembly and
crop), and plain torch references on random data."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import torchvision

from pipelines.ops import compiled_loops
from pipelines.ops.image_ops import resize_bilinear
from pipelines.ops.yolact_detect import _fast_nms_prefixes
from pipelines.ops.yolact_postprocess import (
    Detections,
    assemble_masks,
    box_pixels,
    crop_masks,
    decode_boxes,
    detect,
    instance_masks,
    make_priors,
    mask_probabilities,
    pairwise_iou,
    postprocess,
)

LEVELS_550 = [(69, 69), (35, 35), (18, 18), (9, 9), (5, 5)]
SCALES_550 = [24, 48, 96, 192, 384]


# ------------------------------------------------------------------------------------------------------------ helpers
def box_priors(boxes_xyxy) -> np.ndarray:
    """Priors (cx, cy, w, h) whose decoding with zero offsets is the given x1y1x2y2 boxes."""
    b = np.asarray(boxes_xyxy, dtype=np.float64)
    return np.stack(
        [(b[:, 0] + b[:, 2]) / 2, (b[:, 1] + b[:, 3]) / 2, b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]], axis=1
    ).astype(np.float32)


def hand_detect(boxes_xyxy, fg_scores, **kwargs) -> Detections:
    """detect() on priors that decode to exactly these boxes; fg_scores [N, C] foreground scores."""
    fg = np.asarray(fg_scores, dtype=np.float32).reshape(len(boxes_xyxy), -1)
    conf = np.concatenate([np.full((len(fg), 1), 0.01, np.float32), fg], axis=1)
    coeffs = np.arange(len(fg) * 2, dtype=np.float32).reshape(-1, 2)  # row i = prior i's coefficients
    return detect(np.zeros((len(fg), 4), np.float32), conf, coeffs, box_priors(boxes_xyxy), **kwargs)


def prior_ids(det: Detections) -> list[int]:
    return [int(c[0]) // 2 for c in det.coeffs]


def random_head(seed: int, n: int = 400, num_classes: int = 6, mask_dim: int = 8):
    """Clustered boxes (so NMS has work) and well-separated, distinct scores (no ties)."""
    rng = np.random.default_rng(seed)
    priors = np.concatenate([rng.uniform(0.3, 0.7, (n, 2)), rng.uniform(0.05, 0.3, (n, 2))], 1).astype(np.float32)
    loc = rng.normal(0, 0.5, (n, 4)).astype(np.float32)
    fg = (rng.permutation(n * num_classes) / (n * num_classes) * 0.3).astype(np.float32).reshape(n, num_classes)
    conf = np.concatenate([np.full((n, 1), 0.5, np.float32), fg], axis=1)
    mask = rng.uniform(-1, 1, (n, mask_dim)).astype(np.float32)
    return loc, conf, mask, priors


def torch_decode(loc, priors):
    loc, priors = torch.from_numpy(loc), torch.from_numpy(priors)
    boxes = torch.cat(
        (priors[:, :2] + loc[:, :2] * 0.1 * priors[:, 2:], priors[:, 2:] * torch.exp(loc[:, 2:] * 0.2)), 1
    )
    boxes[:, :2] -= boxes[:, 2:] / 2
    boxes[:, 2:] += boxes[:, :2]
    return boxes


def torch_jaccard(a, b):
    """a [n, A, 4], b [n, B, 4] -> [n, A, B], as the reference's jaccard."""
    max_xy = torch.min(a[:, :, None, 2:], b[:, None, :, 2:])
    min_xy = torch.max(a[:, :, None, :2], b[:, None, :, :2])
    inter = torch.clamp(max_xy - min_xy, min=0).prod(3)
    area_a = ((a[:, :, 2] - a[:, :, 0]) * (a[:, :, 3] - a[:, :, 1]))[:, :, None]
    area_b = ((b[:, :, 2] - b[:, :, 0]) * (b[:, :, 3] - b[:, :, 1]))[:, None, :]
    return inter / (area_a + area_b - inter)


def torch_candidates(loc, conf, mask, priors, conf_thresh):
    boxes = torch_decode(loc, priors)
    scores = torch.from_numpy(conf)[:, 1:].t()
    keep = scores.max(dim=0).values > conf_thresh
    return boxes[keep], torch.from_numpy(mask)[keep], scores[:, keep]


def torch_fast_nms(loc, conf, mask, priors, conf_thresh=0.05, nms_thresh=0.5, top_k=200, max_num=100):
    """Fast NMS as docs/yolact.md ("Fast NMS") describes it: sort per class, top_k, IoU, triu, max over higher-scored,
    keep <= thresh."""
    boxes, masks, scores = torch_candidates(loc, conf, mask, priors, conf_thresh)
    scores, idx = scores.sort(1, descending=True)
    idx, scores = idx[:, :top_k], scores[:, :top_k]
    num_classes, k = idx.shape
    class_boxes = boxes[idx.reshape(-1)].view(num_classes, k, 4)
    class_masks = masks[idx.reshape(-1)].view(num_classes, k, -1)
    iou = torch_jaccard(class_boxes, class_boxes).triu_(diagonal=1)
    keep = iou.max(dim=1).values <= nms_thresh
    classes = torch.arange(num_classes)[:, None].expand_as(keep)[keep]
    scores, order = scores[keep].sort(0, descending=True)
    order = order[:max_num]
    return class_boxes[keep][order], class_masks[keep][order], classes[order], scores[:max_num]


def torch_cross_class_nms(loc, conf, mask, priors, conf_thresh=0.05, nms_thresh=0.5, top_k=200):
    boxes, masks, scores = torch_candidates(loc, conf, mask, priors, conf_thresh)
    scores, classes = scores.max(dim=0)
    _, idx = scores.sort(0, descending=True)
    idx = idx[:top_k]
    iou = torch_jaccard(boxes[idx][None], boxes[idx][None])[0].triu_(diagonal=1)
    idx = idx[iou.max(dim=0).values <= nms_thresh]
    return boxes[idx], masks[idx], classes[idx], scores[idx]


def torchvision_per_class_nms(loc, conf, mask, priors, conf_thresh=0.05, nms_thresh=0.5, max_num=100):
    """Traditional NMS per class with torchvision.ops.nms (greedy, IoU > thresh suppresses)."""
    boxes, masks, scores = torch_candidates(loc, conf, mask, priors, conf_thresh)
    picked, classes, picked_scores = [], [], []
    for c, class_scores in enumerate(scores):
        above = torch.nonzero(class_scores > conf_thresh)[:, 0]
        kept = above[torchvision.ops.nms(boxes[above], class_scores[above], nms_thresh)]
        picked.append(kept)
        classes.append(torch.full_like(kept, c))
        picked_scores.append(class_scores[kept])
    picked, classes, picked_scores = torch.cat(picked), torch.cat(classes), torch.cat(picked_scores)
    picked_scores, order = picked_scores.sort(0, descending=True)
    order = order[:max_num]
    return boxes[picked[order]], masks[picked[order]], classes[order], picked_scores[:max_num]


def assert_same_detections(det: Detections, expected):
    boxes, masks, classes, scores = (t.numpy() for t in expected)
    np.testing.assert_array_equal(det.classes, classes)
    np.testing.assert_array_equal(det.scores, scores)
    np.testing.assert_array_equal(det.coeffs, masks)
    np.testing.assert_allclose(det.boxes, boxes, rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------------------ priors, decode
def test_priors_550_count_order_and_first_values():
    priors = make_priors(LEVELS_550, SCALES_550)
    assert priors.shape == (19248, 4) and priors.dtype == np.float32
    half, root = 0.5 / 69, math.sqrt(0.5)
    expected_first = np.array(
        [
            [half, half, 24 / 550, 24 / 550],
            [half, half, 24 * root / 550, 24 * root / 550],
            [half, half, 24 * math.sqrt(2) / 550, 24 * math.sqrt(2) / 550],
            [1.5 / 69, half, 24 / 550, 24 / 550],
        ],
        dtype=np.float32,
    )
    np.testing.assert_array_equal(priors[:4], expected_first)
    # Row-major cells: the first prior of the second row, then the first prior of level P4.
    np.testing.assert_array_equal(priors[3 * 69], np.float32([half, 1.5 / 69, 24 / 550, 24 / 550]))
    level1 = 3 * 69 * 69
    np.testing.assert_array_equal(priors[level1], np.float32([0.5 / 35, 0.5 / 35, 48 / 550, 48 / 550]))
    side = 384 * math.sqrt(2) / 550
    np.testing.assert_array_equal(priors[-1], np.float32([4.5 / 5, 4.5 / 5, side, side]))
    assert np.all(priors[:, 2] == priors[:, 3])  # square anchors


def test_priors_700_count_and_non_square_option():
    assert make_priors(
        [(88, 88), (44, 44), (22, 22), (11, 11), (6, 6)], [30, 61, 122, 244, 488], max_size=700
    ).shape == (30963, 4)
    priors = make_priors([(2, 3)], [100], square_anchors=False)
    assert priors.shape == (18, 4)
    np.testing.assert_array_equal(
        priors[1], np.float32([0.5 / 3, 0.25, 100 * math.sqrt(0.5) / 550, 100 / math.sqrt(0.5) / 550])
    )
    with pytest.raises(ValueError, match="pred_scales"):
        make_priors([(2, 2)], [24, 48])


def test_decode_formula_by_hand_and_against_torch():
    prior = np.float32([[0.5, 0.5, 0.2, 0.4]])
    loc = np.float32([[1.0, -1.0, 0.0, math.log(2) / 0.2]])
    # cx = .5 + 1*.1*.2, cy = .5 - .1*.4, w = .2, h = .4*2; x2 = x1 + w
    np.testing.assert_allclose(decode_boxes(loc, prior), [[0.42, 0.06, 0.62, 0.86]], atol=1e-6)
    loc, _, _, priors = random_head(3, n=200)
    got = decode_boxes(loc, priors)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, torch_decode(loc, priors).numpy(), rtol=0, atol=1e-6)


# -------------------------------------------------------------------------------------------------------------- Detect
# A chain of three boxes: IoU(A, B) = IoU(B, C) = 0.6, IoU(A, C) = 1/3.
CHAIN = [[0.10, 0.1, 0.30, 0.3], [0.15, 0.1, 0.35, 0.3], [0.20, 0.1, 0.40, 0.3]]


def test_fast_nms_a_suppressed_box_still_suppresses():
    det = hand_detect(CHAIN, [0.9, 0.8, 0.7])
    assert prior_ids(det) == [0]  # B is suppressed by A, and C by B although B itself was suppressed


def test_per_class_nms_only_kept_boxes_suppress():
    det = hand_detect(CHAIN, [0.9, 0.8, 0.7], nms="per_class")
    assert prior_ids(det) == [0, 2]
    np.testing.assert_array_equal(det.scores, np.float32([0.9, 0.7]))


def test_cross_class_nms_suppresses_across_classes():
    fg = [[0.9, 0.05], [0.1, 0.8], [0.7, 0.1]]  # A and C class 0, B class 1
    cross = hand_detect(CHAIN, fg, nms="cross_class")
    assert prior_ids(cross) == [0] and cross.classes.tolist() == [0]
    per_class_fast = hand_detect(CHAIN, fg)  # class 0 ranks A, C, B; class 1 ranks B, C, A
    assert list(zip(prior_ids(per_class_fast), per_class_fast.classes.tolist())) == [(0, 0), (1, 1), (2, 0)]
    per_class = hand_detect(CHAIN, fg, nms="per_class")
    assert list(zip(prior_ids(per_class), per_class.classes.tolist())) == [(0, 0), (1, 1), (2, 0)]


@pytest.mark.parametrize("nms", ["fast", "per_class", "cross_class"])
def test_iou_equal_to_threshold_does_not_suppress(nms):
    half_overlap = [[0.0, 0.0, 0.75, 0.5], [0.25, 0.0, 1.0, 0.5]]  # IoU exactly 0.5 (dyadic, exact in float32)
    assert prior_ids(hand_detect(half_overlap, [0.9, 0.8], nms=nms)) == [0, 1]
    assert prior_ids(hand_detect(half_overlap, [0.9, 0.8], nms=nms, nms_thresh=0.49)) == [0]


def test_conf_filter_uses_max_foreground_score_and_keeps_all_class_scores():
    far_apart = [[0.0, 0.0, 0.1, 0.1], [0.4, 0.4, 0.5, 0.5], [0.8, 0.8, 0.9, 0.9]]
    fg = [
        [0.6, 0.01],  # candidate; its class-1 score 0.01 stays
        [0.05, 0.05],  # max == 0.05: not a candidate (strict >)
        [0.04, 0.051],
    ]  # candidate through class 1 only
    det = hand_detect(far_apart, fg)
    assert list(zip(prior_ids(det), det.classes.tolist())) == [(0, 0), (2, 1), (2, 0), (0, 1)]
    np.testing.assert_array_equal(det.scores, np.float32([0.6, 0.051, 0.04, 0.01]))
    np.testing.assert_array_equal(det.boxes[0], np.float32(far_apart[0]))
    assert det.boxes.dtype == det.coeffs.dtype == det.scores.dtype == np.float32 and det.classes.dtype == np.int64
    # Traditional NMS applies conf_thresh per class.
    per_class = hand_detect(far_apart, fg, nms="per_class")
    assert list(zip(prior_ids(per_class), per_class.classes.tolist())) == [(0, 0), (2, 1)]


def test_no_candidate_gives_empty_detections():
    det = hand_detect(CHAIN, [0.05, 0.01, 0.0])
    assert len(det) == 0 and det.boxes.shape == (0, 4) and det.coeffs.shape == (0, 2)
    assert det.classes.dtype == np.int64 and det.scores.dtype == np.float32
    classes, scores, boxes, masks = postprocess(det, np.zeros((5, 5, 2), np.float32), 7, 3)
    assert classes.shape == scores.shape == (0,) and boxes.shape == (0, 4) and masks.shape == (0, 3, 7)


def test_max_num_detections_cap():
    grid = [[x / 15, y / 10, x / 15 + 0.03, y / 10 + 0.03] for y in range(10) for x in range(15)]  # 150, disjoint
    scores = np.linspace(0.9, 0.1, 150, dtype=np.float32)
    for nms in ("fast", "per_class"):
        det = hand_detect(grid, scores, nms=nms)
        assert len(det) == 100 and prior_ids(det) == list(range(100)), nms
        assert np.all(np.diff(det.scores) < 0)
    assert len(hand_detect(grid, scores, max_num_detections=7)) == 7
    assert len(hand_detect(grid, scores, nms="cross_class")) == 150  # no cap, as the reference (top_k only)
    assert len(hand_detect(grid, scores, nms="cross_class", top_k=120)) == 120


def test_unknown_nms_and_bad_shapes_are_rejected():
    with pytest.raises(ValueError, match="fast, per_class, cross_class"):
        hand_detect(CHAIN, [0.9, 0.8, 0.7], nms="soft")
    with pytest.raises(ValueError, match=r"conf must be \[N, C\]"):
        detect(np.zeros((3, 4)), np.zeros((2, 5)), np.zeros((3, 8)), np.zeros((3, 4)))
    with pytest.raises(ValueError, match=r"priors must be \[N, 4\]"):
        detect(np.zeros((3, 4)), np.zeros((3, 5)), np.zeros((3, 8)), np.zeros((19248, 4)))


@pytest.mark.parametrize("seed, top_k, max_num", [(0, 200, 100), (1, 50, 100), (2, 200, 20), (3, 1000, 1000)])
def test_fast_nms_matches_plain_torch_reference(seed, top_k, max_num):
    head = random_head(seed)
    det = detect(*head, top_k=top_k, max_num_detections=max_num)
    assert len(det) > 6  # NMS removed some but not all
    assert_same_detections(det, torch_fast_nms(*head, top_k=top_k, max_num=max_num))


@pytest.mark.parametrize(
    "seed, n, num_classes, k, levels",
    [
        (0, 19248, 80, 200, 0),  # R50 550's priors and classes
        (1, 3000, 8, 200, 5),  # scores on 5 levels: ties everywhere, also at rank k
        (2, 150, 4, 200, 0),  # fewer candidates than k
        (3, 500, 3, 1, 2),  # k = 1 among ties
        (4, 3000, 3, 200, -1),  # the sampled candidates score highest: the floor guessed from them keeps too few
        (5, 3000, 3, 200, -2),  # the sampled candidates score lowest: the floor keeps too many
    ],
)
def test_class_top_k_is_the_stable_sorts_first_k(seed, n, num_classes, k, levels):
    """Candidates as numpy's max (a NaN in a row makes it none; the threshold compared in float32) and each class's
    k best by descending score, of equal scores the lower position: a stable sort's first k, also where the
    kernel's guess from a sample of the candidates is wrong."""
    rng = np.random.default_rng(seed)
    conf = rng.random((n, num_classes + 1), dtype=np.float32) * np.float32(0.2)
    if levels > 0:
        conf = np.round(conf * levels) / levels
    if levels < 0:  # every prior a candidate (class 0 above 0.05); the kernel samples every 16th candidate
        conf[:, 1] = 0.5
        conf[::16, 1:] = 0.9 if levels == -1 else 0.06
    else:
        conf[::7, 2] = np.nan
        conf[::11, 1:] = np.float32(0.05)  # exactly the threshold: not above it
    conf = conf.astype(np.float32)
    candidates, order, ranked = compiled_loops.class_top_k(conf, np.float32(0.05), k)
    foreground = conf[:, 1:]
    expected = np.flatnonzero(foreground.max(axis=1) > 0.05)
    scores = foreground[expected].T
    expected_order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    assert np.array_equal(candidates, expected)
    assert np.array_equal(order, expected_order)
    assert np.array_equal(ranked, np.take_along_axis(scores, expected_order, axis=1))


def full_fast_nms_detect(loc, conf, mask, priors, conf_thresh=0.05, nms_thresh=0.5, top_k=200, max_num=100):
    """The previous Fast NMS, kept as the reference: every class's top_k decided, then the max_num best (stable)."""
    fg = conf[:, 1:]
    candidates = np.flatnonzero(fg.max(axis=1) > conf_thresh)
    boxes, coeffs = decode_boxes(loc[candidates], priors[candidates]), mask[candidates]
    scores = np.ascontiguousarray(fg[candidates].T)
    k = min(top_k, scores.shape[1])
    order = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    class_boxes = boxes[order]
    keep = np.triu(pairwise_iou(class_boxes, class_boxes), k=1).max(axis=1) <= nms_thresh
    rows = np.broadcast_to(np.arange(order.shape[0])[:, None], order.shape)
    rows, cols = rows[keep], order[keep]
    kept = scores[rows, cols]
    best = np.argsort(-kept, kind="stable")[:max_num]
    return boxes[cols[best]], coeffs[cols[best]], rows[best], kept[best]


@pytest.mark.parametrize(
    "seed, num_classes, top_k, max_num, levels",
    [
        (0, 80, 200, 100, 0),  # R50-like: many classes, few decisions needed
        (1, 80, 200, 100, 7),  # scores on 7 levels: ties everywhere, also at the cut-off
        (2, 4, 200, 100, 0),  # few classes: the cut-off needs most entries
        (3, 80, 200, 300, 3),  # more detections wanted than the first budget holds
        (4, 80, 50, 1000, 0),  # everything
        (5, 30, 200, 100, -1),  # near-identical boxes: one kept per class, so every decision is needed
    ],
)
def test_fast_nms_deciding_only_what_the_best_need_equals_deciding_all(seed, num_classes, top_k, max_num, levels):
    loc, conf, mask, priors = random_head(seed, n=300, num_classes=num_classes)
    if levels < 0:  # and each class scoring above the next: the first classes fill the first budget
        priors[:] = priors[0]
        loc *= 0.01
        conf[:, 1:] = conf[:, 1:] * 0.01 + np.linspace(0.3, 0.06, num_classes, dtype=np.float32)
    if levels > 0:
        fg = conf[:, 1:]
        conf[:, 1:] = np.round(fg / fg.max() * levels) / levels * 0.3
    det = detect(loc, conf, mask, priors, top_k=top_k, max_num_detections=max_num)
    boxes, coeffs, classes, scores = full_fast_nms_detect(loc, conf, mask, priors, top_k=top_k, max_num=max_num)
    assert len(det) == min(max_num, len(full_fast_nms_detect(loc, conf, mask, priors, top_k=top_k, max_num=10**6)[3]))
    np.testing.assert_array_equal(det.classes, classes)
    np.testing.assert_array_equal(det.scores, scores)
    np.testing.assert_array_equal(det.boxes, boxes)
    np.testing.assert_array_equal(det.coeffs, coeffs)


def test_compiled_fast_nms_decisions_equal_the_numpy_iou_blocks_on_degenerate_boxes():
    """The compiled decisions against the former numpy ones (pairwise_iou over [c, D, D] blocks, triu, max <=
    threshold): zero-area and identical boxes (0/0 is NaN: dropped), NaN and infinite coordinates, IoUs landing on
    the threshold."""
    rng = np.random.default_rng(11)
    corners = np.round(rng.random((60, 2), dtype=np.float32) * 8) / 8
    sizes = np.round(rng.random((60, 2), dtype=np.float32) * 4) / 8
    boxes = np.concatenate([corners, corners + sizes], axis=1).astype(np.float32)  # IoUs like 1/2, 1/3 exactly
    boxes[5] = boxes[6] = [0.25, 0.25, 0.25, 0.5]  # zero area, twice
    boxes[9, 2] = np.nan
    boxes[12] = [0.1, 0.1, np.inf, 0.4]
    boxes[13] = [-np.inf, 0.0, 0.3, 0.3]
    order = np.stack([rng.permutation(60)[:40] for _ in range(7)])
    depth = np.array([40, 0, 1, 17, 40, 39, 2])
    for threshold in (0.5, 1 / 3, 0.3, 0.0):
        class_boxes = boxes[order]
        with np.errstate(invalid="ignore"):
            iou = np.triu(pairwise_iou(class_boxes, class_boxes), k=1)
            want = (iou.max(axis=1) <= threshold) & (np.arange(order.shape[1]) < depth[:, None])
        np.testing.assert_array_equal(_fast_nms_prefixes(boxes, order, depth, threshold), want)


@pytest.mark.parametrize("seed", [4, 5])
def test_cross_class_and_per_class_match_torch_references(seed):
    head = random_head(seed)
    assert_same_detections(detect(*head, nms="cross_class"), torch_cross_class_nms(*head))
    per_class = detect(*head, nms="per_class", max_num_detections=60)
    assert_same_detections(per_class, torchvision_per_class_nms(*head, max_num=60))


# --------------------------------------------------------------------------------------------------- masks and boxes
def test_box_pixels_sorts_clamps_and_truncates():
    boxes = np.float32(
        [
            [0.1, 0.2, 0.5, 0.9],  # 10.1, 10.2, 50.5, 45.9
            [0.5, 0.9, 0.1, 0.2],  # flipped: sorted per axis
            [-0.2, -0.1, 1.3, 1.01],  # clamped to the image
            [1.2, 0.5, 1.5, 0.6],
        ]
    )  # wholly right: x1 only clamped below (reference behaviour)
    got = box_pixels(boxes, width=101, height=51)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, [[10, 10, 50, 45], [10, 10, 50, 45], [0, 0, 101, 51], [121, 25, 101, 30]])
    with pytest.raises(ValueError, match="width and height"):
        box_pixels(boxes, 0, 10)


def constant_proto_det(boxes, logit: float, proto_hw=(16, 16)) -> tuple[Detections, np.ndarray]:
    """Detections whose mask logit is ``logit`` at every proto pixel."""
    n = len(boxes)
    det = Detections(
        boxes=np.float32(boxes),
        coeffs=np.ones((n, 1), np.float32),
        classes=np.zeros(n, np.int64),
        scores=np.linspace(0.9, 0.5, n, dtype=np.float32),
    )
    return det, np.full(proto_hw + (1,), logit, np.float32)


def test_crop_pads_one_proto_pixel_and_compares_as_floats():
    boxes = [
        [0.25, 0.5, 0.5, 0.75],  # proto x 4..8 -> cols 3..8, y 8..12 -> rows 7..12
        [0.0, 0.0, 0.1, 0.1],  # x1 - 1 clamped at 0; x2 = 1.6 + 1 -> cols 0..2
        [0.26, 0.26, 0.49, 0.49],  # 4.16 - 1 = 3.16 -> first col 4; 7.84 + 1 = 8.84 -> last col 8
        [1.5, 0.2, 1.9, 0.4],
    ]  # outside: empty
    det, proto = constant_proto_det(boxes, logit=10.0)
    masks = assemble_masks(det, proto, width=16, height=16)  # same size as proto: no interpolation
    expected = np.zeros((4, 16, 16), bool)
    expected[0, 7:13, 3:9] = True
    expected[1, 0:3, 0:3] = True
    expected[2, 4:9, 4:9] = True
    np.testing.assert_array_equal(masks, expected)
    assert assemble_masks(det, proto, 16, 16, crop=False).all()


def test_mask_threshold_is_strict():
    det, proto = constant_proto_det([[0.0, 0.0, 1.0, 1.0]], logit=0.0)  # sigmoid(0) == 0.5 exactly
    assert not assemble_masks(det, proto, 16, 16).any()
    det, proto = constant_proto_det([[0.0, 0.0, 1.0, 1.0]], logit=1e-3)
    assert assemble_masks(det, proto, 16, 16).all()


def random_masks_case(seed: int, n: int = 14, proto_hw=(11, 14), mask_dim: int = 8):
    rng = np.random.default_rng(seed)
    proto = (np.maximum(rng.normal(0, 1, proto_hw + (mask_dim,)), 0) + 0.05).astype(np.float32)  # no all-zero pixel
    coeffs = rng.uniform(-1, 1, (n, mask_dim)).astype(np.float32)
    coeffs[:, 0] += 0.5
    centers, sizes = rng.uniform(-0.1, 1.1, (n, 2)), rng.uniform(0.01, 0.6, (n, 2))
    boxes = np.concatenate([centers - sizes / 2, centers + sizes / 2], 1).astype(np.float32)
    boxes[0] = [0.7, 0.6, 0.2, 0.1]  # flipped corners
    boxes[1] = [0.0, 0.0, 1.0, 1.0]  # whole image
    boxes[2] = [0.5, 0.5, 0.501, 0.502]  # tiny
    boxes[3] = [1.2, 0.1, 1.4, 0.3]  # outside
    det = Detections(
        boxes=boxes, coeffs=coeffs, classes=np.zeros(n, np.int64), scores=np.linspace(0.9, 0.1, n, dtype=np.float32)
    )
    return det, proto


def torch_full_mask_probs(det: Detections, proto: np.ndarray, width: int, height: int, crop: bool) -> np.ndarray:
    """docs/yolact.md's mask assembly and crop written plainly with torch, no windowing: [n, height, width] float
    probabilities."""
    proto_t, boxes = torch.from_numpy(proto), torch.from_numpy(det.boxes)
    masks = torch.sigmoid(proto_t @ torch.from_numpy(det.coeffs).t())  # [Ph, Pw, n]
    if crop:
        h, w, n = masks.shape

        def sanitize(a, b, size):
            a, b = a * size, b * size
            return torch.clamp(torch.min(a, b) - 1, min=0), torch.clamp(torch.max(a, b) + 1, max=size)

        x1, x2 = sanitize(boxes[:, 0], boxes[:, 2], w)
        y1, y2 = sanitize(boxes[:, 1], boxes[:, 3], h)
        cols = torch.arange(w, dtype=x1.dtype).view(1, -1, 1)
        rows = torch.arange(h, dtype=x1.dtype).view(-1, 1, 1)
        keep = (cols >= x1) & (cols < x2) & (rows >= y1) & (rows < y2)
        masks = masks * keep.float()
    masks = masks.permute(2, 0, 1).contiguous()
    return F.interpolate(masks[None], (height, width), mode="bilinear", align_corners=False)[0].numpy()


@pytest.mark.parametrize(
    "seed, width, height, crop",
    [
        (0, 97, 61, True),
        (1, 300, 211, True),
        (2, 9, 5, True),
        (3, 14, 11, True),
        (4, 1, 1, True),
        (5, 97, 61, False),
        (6, 23, 40, False),
    ],
)
def test_instance_masks_equal_full_computation(seed, width, height, crop):
    det, proto = random_masks_case(seed)
    masks = np.stack(list(instance_masks(det, proto, width, height, crop=crop)))
    assert masks.dtype == bool and masks.shape == (len(det), height, width)
    # Exactly the full-size (non-windowed) computation built from the same numpy pieces.
    probs = mask_probabilities(det.coeffs, proto)
    if crop:
        probs = crop_masks(probs, det.boxes)
    full = resize_bilinear(probs.transpose(1, 2, 0), (height, width)).transpose(2, 0, 1) > 0.5
    np.testing.assert_array_equal(masks, full)
    # Equal to the plain torch computation wherever torch's value is not within float noise of the threshold.
    torch_probs = torch_full_mask_probs(det, proto, width, height, crop)
    decided = np.abs(torch_probs - 0.5) > 1e-5
    assert decided.mean() > 0.999
    np.testing.assert_array_equal(masks[decided], torch_probs[decided] > 0.5)
    assert masks.any() and not masks.all()
    np.testing.assert_array_equal(assemble_masks(det, proto, width, height, crop=crop), masks)


def test_postprocess_returns_reference_outputs():
    det, proto = random_masks_case(7, n=5)
    classes, scores, boxes, masks = postprocess(det, proto, 120, 80)
    np.testing.assert_array_equal(classes, det.classes)
    np.testing.assert_array_equal(scores, det.scores)
    np.testing.assert_array_equal(boxes, box_pixels(det.boxes, 120, 80))
    np.testing.assert_array_equal(masks, assemble_masks(det, proto, 120, 80))
    assert boxes.dtype == np.int64 and masks.shape == (5, 80, 120)
    with pytest.raises(ValueError, match=r"proto must be \[Ph, Pw, mask_dim\]"):
        instance_masks(det, proto[..., :4], 120, 80)
