"""The Python source of compiled_loops' Detect kernels: the per-class top-k over every prior's class scores
(`class_top_k`) and Fast NMS (`fast_nms_keep`; docs/yolact.md, "Fast NMS").

Not called as Python: pipelines.ops.compiled_loops compiles each `_<name>` into `<name>` with numba, in this module's
namespace, where the kernels find the helpers by name. The module imports numpy only, so that compiled_loops can
load a file copy of it by itself (its docstring says when).
"""

import numpy as np

# compiled as `<name>` from their Python functions `_<name>`
KERNELS = ("class_top_k", "fast_nms_keep")
# what the kernels call: compiled first, in place (the kernels find them by name)
HELPERS = ("_score_key", "_iou_above")

_LOW_32 = np.uint64(0xFFFFFFFF)
_SIGN_32 = np.uint64(0x80000000)
_SAMPLE_STRIDE = 16  # class_top_k estimates each class's k-th best score from every 16th candidate


def _score_key(bits, position):
    """uint64 key ordering (score, lower position) in one compare: a float32's bits made monotone above (-0.0 given
    as 0.0's bits), the position's complement below."""
    b = np.uint64(bits)
    return (((b ^ _LOW_32) if b >= _SIGN_32 else (b | _SIGN_32)) << np.uint64(32)) | (_LOW_32 - np.uint64(position))


def _class_top_k(conf, threshold, k):
    """Detect's candidates and each class's best k of them: (candidates int64 [n]: the priors whose best
    foreground score is > threshold, as numpy's max, where a NaN makes none; order int64 [C, K]: per class the
    positions in candidates of its K = min(k, n) best, by descending score, of equal scores the lower position
    first, as a stable sort; ranked float32 [C, K]: their scores). conf: [N, C + 1], column 0 the background.

    Every candidate enters every class (its scores <= threshold too). Per class, a floor is guessed from a sample
    (the score of rank ~1.5 k / stride among every _SAMPLE_STRIDE-th candidate, taken in the pass that finds the
    candidates: conf is read twice in all); a second pass keeps the candidates
    scoring >= their class's floor. A class that kept >= k of them holds its best k among them (the k-th best
    scores >= the floor); the others (a bad guess, rare) sort every candidate's key. Kept entries are
    ranked by _score_key, so ties go to the lower position. A heap in one pass would replace ~k (1 + ln(n / k))
    roots per class, which costs more than the second pass.
    """
    n_priors, width = conf.shape
    n_classes = width - 1
    # the sample's best `rank` scores per class, descending; rank ~1.5 k / stride for the most candidates there can
    # be (n_priors), and the floor is its last (-inf where the sample holds fewer: then every candidate is kept)
    rank = (3 * max(k, 1)) // (2 * _SAMPLE_STRIDE) + 2
    best_sampled = np.full((n_classes, rank), -np.inf, np.float32)
    candidates = np.empty(n_priors, np.int64)
    n = 0
    for p in range(n_priors):
        row = conf[p]
        above, nans = 0, 0  # counts, not max and any: reductions of compares, which vectorize
        for c in range(1, width):
            above += row[c] > threshold
            nans += row[c] != row[c]
        if nans > 0 or above == 0:
            continue
        if n % _SAMPLE_STRIDE == 0:  # in the sample: candidates 0, stride, 2 stride, ... (the row is in cache now)
            for c in range(n_classes):  # (2-d indexing: a row view per value costs a reference count)
                value = row[c + 1]
                if value > best_sampled[c, rank - 1]:
                    at = rank - 1
                    while at > 0 and best_sampled[c, at - 1] < value:
                        best_sampled[c, at] = best_sampled[c, at - 1]
                        at -= 1
                    best_sampled[c, at] = value
        candidates[n] = p
        n += 1
    size = min(k, n)
    capacity = min(n, 4 * size + 64)
    floor = np.full(n_classes, -np.inf, np.float32)
    if capacity < n:
        for c in range(n_classes):
            floor[c] = best_sampled[c, rank - 1]
    bits = conf.view(np.uint32)
    kept = np.empty((n_classes, capacity), np.uint64)
    count = np.zeros(n_classes, np.int64)
    for j in range(n):
        p = candidates[j]
        row = conf[p]
        hits = 0  # the row's classes at or above their floor, in a pass that vectorizes (R50: 58 % of rows have none)
        for c in range(n_classes):
            hits += row[c + 1] >= floor[c]
        if hits == 0:
            continue
        for c in range(n_classes):
            if row[c + 1] >= floor[c]:
                if count[c] < capacity:
                    kept[c, count[c]] = _score_key(bits[p, c + 1] if row[c + 1] != 0 else 0, j)
                count[c] += 1
    order = np.empty((n_classes, size), np.int64)
    ranked = np.empty((n_classes, size), np.float32)
    for c in range(n_classes):
        if count[c] < size or count[c] > capacity:  # a bad guess: every candidate's key
            keys = np.empty(n, np.uint64)
            for j in range(n):
                p = candidates[j]
                keys[j] = _score_key(bits[p, c + 1] if conf[p, c + 1] != 0 else 0, j)
            keys = np.sort(keys)[n - size :]
        else:
            keys = np.sort(kept[c, : count[c]])[count[c] - size :]
        for j in range(size):
            position = np.int64(_LOW_32 - (keys[size - 1 - j] & _LOW_32))
            order[c, j] = position
            ranked[c, j] = conf[candidates[position], c + 1]
    return candidates[:n].copy(), order, ranked


def _iou_above(boxes, i, j, threshold):
    """Whether the IoU of x1y1x2y2 boxes i and j is above threshold, or NaN: yolact_postprocess.pairwise_iou's
    float32 operations in its order (box i its `a`), where any NaN coordinate makes a NaN (as numpy's minimum and
    maximum propagate it)."""
    a, b = boxes[i], boxes[j]
    for k in range(4):
        if a[k] != a[k] or b[k] != b[k]:
            return True
    zero = np.float32(0)
    inter_w = max(min(a[2], b[2]) - max(a[0], b[0]), zero)
    inter_h = max(min(a[3], b[3]) - max(a[1], b[1]), zero)
    inter = inter_w * inter_h
    area_a = (a[2] - a[0]) * (a[3] - a[1])
    area_b = (b[2] - b[0]) * (b[3] - b[1])
    iou = inter / (area_a + area_b - inter)
    return not iou <= threshold


def _fast_nms_keep(boxes, order, depth, threshold, keep):
    """Fast NMS decisions of the first depth[c] entries of each class row of order [C, K] (columns of boxes
    [n, 4] float32 x1y1x2y2, by descending score): keep[c, j] = True iff no entry i < j of the row has an IoU with
    it above threshold (float32) or NaN; keep: bool [C, K], written where j < depth[c]. Each decision stops at
    the first such entry."""
    for c in range(order.shape[0]):
        row = order[c]
        for j in range(depth[c]):
            kept = True
            for i in range(j):
                if _iou_above(boxes, row[i], row[j], threshold):
                    kept = False
                    break
            keep[c, j] = kept
