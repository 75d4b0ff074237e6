"""The Python source of compiled_loops' pixel kernels: separable bilinear resampling (an image to the network's
input, a mask window from the prototypes, with the threshold in the same pass), a mask's COCO RLE counts, painting a
mask into a label map (all three for every mask of an image in one call: `encode_masks`), and compressed COCO RLEs
decoded straight into an augmentation window (`rle_window`, the training input workers').

Not called as Python: pipelines.ops.compiled_loops compiles each `_<name>` into `<name>` with numba, in this module's
namespace, where the kernels call each other and the helpers by those names. The module imports numpy only, so that
compiled_loops can load a file copy of it by itself (its docstring says when).
"""

import numpy as np

_ONE = np.float32(1.0)
# compiled as `<name>` from their Python functions `_<name>`
KERNELS = (
    "resample",
    "resample_planes",
    "resample_above",
    "mask_window",
    "rle_counts",
    "rle_window",
    "paint",
    "fill_blocks",
    "encode_masks",
)
# what the kernels call: compiled first, in place (the kernels find them by name)
HELPERS = ("_width_pass", "_width_row", "_complement", "_search", "_hot_range", "_fill_run", "_fill_column")


def _width_pass(src, y0, y1, x0, x1, wx1):
    """The width pass of the source rows the output rows read (all of them when upsampling, at most 2 per output
    row when downsampling): (float32 [needed rows, len(x0)], int64 [rows y0[0]..y1[-1]] -> its row there, or -1).
    src: [h_src, w_src] uint8 or float32."""
    first = y0[0]
    slot = np.full(y1[y0.shape[0] - 1] - first + 1, -1, np.int64)
    needed = 0
    for r in range(y0.shape[0]):
        for source in (y0[r] - first, y1[r] - first):
            if slot[source] < 0:
                slot[source] = needed
                needed += 1
    wx0 = _complement(wx1)
    by_width = np.empty((needed, x0.shape[0]), np.float32)
    for s in range(slot.shape[0]):
        if slot[s] >= 0:
            _width_row(src[first + s], x0, x1, wx0, wx1, by_width[slot[s]])
    return by_width, slot


def _resample(src, y0, y1, wy1, x0, x1, wx1, out):
    """out = bilinear(src), separable: ``(src[y0,x0]*wx0 + src[y0,x1]*wx1)*wy0 + (src[y1,x0]*wx0 + src[y1,x1]*wx1)*wy1``
    in float32, in that order (torch's: the width pass, then the height pass), with w0 = 1 - w1 in float32.

    src: [h_src, w_src] uint8 or float32 (read as float32, exactly); y0, y1, wy1 / x0, x1, wx1: one axis each of
    `image_ops.bilinear_axis` tables, or a contiguous part of them (a window of the output), source indices into
    src (i0 <= i1, both non-decreasing); out: float32 [len(y0), len(x0)], written.
    """
    if y0.shape[0] == 0 or x0.shape[0] == 0:
        return
    by_width, slot = _width_pass(src, y0, y1, x0, x1, wx1)
    first = y0[0]
    for r in range(y0.shape[0]):
        upper, lower, target = by_width[slot[y0[r] - first]], by_width[slot[y1[r] - first]], out[r]
        weight1 = wy1[r]
        weight0 = _ONE - weight1
        for c in range(x0.shape[0]):
            target[c] = upper[c] * weight0 + lower[c] * weight1


def _resample_planes(src, y0, y1, wy1, x0, x1, wx1, mean, std, out):
    """A network input in one pass: out[k] = (resample(src)[:, k * width:(k + 1) * width] - mean[k]) / std[k], in
    float32, in that order (the same values as resample, then the subtraction, then the division: no fused
    operations). The column tables are plane-major (`image_ops.plane_columns`: plane k's columns, then plane
    k + 1's), so each plane's height pass reads and writes contiguous memory; the width pass holds only the two
    source rows the current output row reads (output rows read non-decreasing source rows), which stay in cache.
    src: [h_src, w_src * C] uint8 or float32 (interleaved channels); mean, std: float32 [K]; out: float32
    [K, len(y0), width], written."""
    if y0.shape[0] == 0 or x0.shape[0] == 0:
        return
    planes, width = out.shape[0], out.shape[2]
    wx0 = _complement(wx1)
    rows = np.empty((2, x0.shape[0]), np.float32)  # width passes of two source rows
    held = np.full(2, -1, np.int64)  # which source row each holds
    u, v = 0, 1  # the rows of the upper and the lower source
    for r in range(y0.shape[0]):
        if held[u] != y0[r]:
            if held[v] == y0[r]:  # the last output row's lower source is this one's upper
                u, v = v, u
            else:
                _width_row(src[y0[r]], x0, x1, wx0, wx1, rows[u])
                held[u] = y0[r]
        if y1[r] != y0[r] and held[v] != y1[r]:
            _width_row(src[y1[r]], x0, x1, wx0, wx1, rows[v])
            held[v] = y1[r]
        upper, lower = rows[u], rows[u] if y1[r] == y0[r] else rows[v]
        weight1 = wy1[r]
        weight0 = _ONE - weight1
        for k in range(planes):
            target, shift, scale, at = out[k, r], mean[k], std[k], k * width
            for c in range(width):
                target[c] = (upper[at + c] * weight0 + lower[at + c] * weight1 - shift) / scale


def _complement(weights):
    """1 - weights in float32: the other weight of each bilinear pair."""
    out = np.empty(weights.shape[0], np.float32)
    for c in range(weights.shape[0]):
        out[c] = _ONE - weights[c]
    return out


def _width_row(line, x0, x1, wx0, wx1, target):
    """One source row's width pass: target[c] = line[x0[c]] * wx0[c] + line[x1[c]] * wx1[c] in float32."""
    for c in range(x0.shape[0]):
        target[c] = np.float32(line[x0[c]]) * wx0[c] + np.float32(line[x1[c]]) * wx1[c]


def _resample_above(src, y0, y1, wy1, x0, x1, wx1, threshold, out):
    """out = resample(src) > threshold, without the float32 output: bool [len(y0), len(x0)], written (a mask
    window: src is a mask's probabilities, the tables the window's part of the image's)."""
    if y0.shape[0] == 0 or x0.shape[0] == 0:
        return
    by_width, slot = _width_pass(src, y0, y1, x0, x1, wx1)
    first = y0[0]
    limit = np.float32(threshold)
    for r in range(y0.shape[0]):
        upper, lower, target = by_width[slot[y0[r] - first]], by_width[slot[y1[r] - first]], out[r]
        weight1 = wy1[r]
        weight0 = _ONE - weight1
        for c in range(x0.shape[0]):
            target[c] = upper[c] * weight0 + lower[c] * weight1 > limit


def _search(table, value, right):
    """numpy's searchsorted(table, value, side="right" if right else "left") on a non-decreasing int64 table."""
    low, high = 0, table.shape[0]
    while low < high:
        middle = (low + high) // 2
        if table[middle] < value or (right and table[middle] == value):
            low = middle + 1
        else:
            high = middle
    return low


def _hot_range(first, last, i0, i1):
    """The output range [start, stop) whose bilinear sources i0 or i1 fall between source pixels first and last:
    the rows (or cols) of a mask's window along one axis."""
    start = _search(i1, first, False)
    return start, max(_search(i0, last, True), start)


def _mask_window(probs, origin_row, origin_col, y0, y1, wy1, x0, x1, wx1, threshold):
    """One mask's window: (top, left, bool [h, w]) with window[r, c] = bilinear(probs) > threshold at image pixel
    (top + r, left + c), over the output rows and cols whose bilinear sources include a pixel of probs above the
    threshold (everywhere else the value is provably <= threshold: `yolact_postprocess._box_mask`); (0, 0, [0, 0])
    when there is none. probs: float32 [h_src, w_src], the block of the source whose [0, 0] is source pixel
    (origin_row, origin_col); y0 .. wx1: the whole image's `image_ops.bilinear_axis` tables."""
    limit = np.float32(threshold)
    first_row, last_row, first_col, last_col = -1, -1, probs.shape[1], -1
    for r in range(probs.shape[0]):
        line = probs[r]
        for c in range(probs.shape[1]):
            if line[c] > limit:
                if first_row < 0:
                    first_row = r
                last_row = r
                first_col = min(first_col, c)
                last_col = max(last_col, c)
    if first_row < 0:
        return 0, 0, np.zeros((0, 0), np.bool_)
    row_start, row_stop = _hot_range(origin_row + first_row, origin_row + last_row, y0, y1)
    col_start, col_stop = _hot_range(origin_col + first_col, origin_col + last_col, x0, x1)
    window = np.empty((row_stop - row_start, col_stop - col_start), np.bool_)
    resample_above(
        probs,
        y0[row_start:row_stop] - origin_row,
        y1[row_start:row_stop] - origin_row,
        wy1[row_start:row_stop],
        x0[col_start:col_stop] - origin_col,
        x1[col_start:col_stop] - origin_col,
        wx1[col_start:col_stop],
        threshold,
        window,
    )
    return row_start, col_start, window


def _rle_counts(mask, top, left, height, width):
    """COCO's uncompressed RLE counts (uint32) of bool mask [h, w] placed at (top, left) in an otherwise all-False
    [height, width] image: the lengths of the column-major runs, starting with a (possibly empty) run of zeros,
    without an empty last run (pycocotools' rleEncode); [height * width] for an empty mask (h or w 0).

    Runs start and end where a pixel differs from the one above it (False above and below the mask); the changes
    are found row by row, eight columns per test, and ordered by column (rows are visited in order); a run that
    ends on the image's bottom row and one that starts on the next column's top row are one run.
    """
    h, w = mask.shape
    if h == 0 or w == 0:
        return np.full(1, height * width, np.uint32)
    per_row = (w + 7) // 8
    changed = np.zeros(per_row * 8, np.uint8)
    words = changed.view(np.uint64)
    found_at = np.empty((h + 1) * per_row, np.int64)  # the 8-column groups with a change: row * per_row + group
    found = np.empty(((h + 1) * per_row, 8), np.uint8)  # and their flags
    groups = 0
    for r in range(h + 1):
        if r == 0:
            for c in range(w):
                changed[c] = mask[0, c]
        elif r == h:
            for c in range(w):
                changed[c] = mask[h - 1, c]
        else:
            above, here = mask[r - 1], mask[r]
            for c in range(w):
                changed[c] = above[c] != here[c]
        for k in range(per_row):
            if words[k] != 0:
                found_at[groups] = r * per_row + k
                for j in range(8):
                    found[groups, j] = changed[8 * k + j]
                groups += 1
    at = np.zeros(per_row * 8 + 1, np.int64)  # a counting sort by column: where each column's changes go
    for g in range(groups):
        first = found_at[g] % per_row * 8
        for j in range(8):
            at[first + j + 1] += found[g, j]  # (flags past the last column are 0)
    for c in range(w):
        at[c + 1] += at[c]
    n = at[w]
    edges = np.empty(n, np.int64)  # image indices col * height + row, ascending; starts and ends alternate
    for g in range(groups):  # groups come row by row, so each column's rows come in order
        r, first = found_at[g] // per_row, found_at[g] % per_row * 8
        for j in range(8):
            if found[g, j]:
                edges[at[first + j]] = (left + first + j) * height + top + r
                at[first + j] += 1
    counts = np.empty(n + 1, np.uint32)
    k, previous, i = 0, 0, 0
    while i < n:
        if i % 2 == 1 and i + 1 < n and edges[i + 1] == edges[i]:  # an end meets the next start: one run
            i += 2
            continue
        counts[k] = edges[i] - previous
        previous = edges[i]
        k += 1
        i += 1
    if k == 0 or previous < height * width:
        counts[k] = height * width - previous
        k += 1
    return counts[:k]


def _rle_window(chars, starts, height, width, top, left, rows, cols, mirror):
    """COCO compressed RLE counts of a height x width image (pycocotools' rleToString strings, ASCII: chars uint8,
    object i's are chars[starts[i]:starts[i + 1]], starts int64 [n + 1]) -> uint8 [n, rows, cols] 0/1: the window
    of source rows top..top + rows and columns left..left + cols, mirrored left-right if mirror, 0 where it leaves
    the image (top, left negative, or the window past the image). Each string is read once, up to the window's last
    column; only the window's pixels are written (pycocotools' decode writes the whole image).

    The format: each count in 5-bit groups, low first, as chars 48 + group (+ 32: more groups follow), the last
    group's 16 bit the sign; from the fourth count on, each is the difference to the count two before. Counts are
    the lengths of the column-major runs, alternately of zeros and ones, zeros first.
    """
    n = starts.shape[0] - 1
    out = np.zeros((n, rows, cols), np.uint8)
    y0, y1 = min(max(top, 0), height), min(max(top + rows, 0), height)
    x0, x1 = min(max(left, 0), width), min(max(left + cols, 0), width)
    if y1 <= y0 or x1 <= x0:
        return out
    first, last = x0 * height, x1 * height  # the window's columns, as image indices col * height + row
    for i in range(n):
        window = out[i]
        p, end = starts[i], starts[i + 1]
        at, m, before, previous = 0, 0, 0, 0  # where run m starts; counts m - 2 and m - 1
        while p < end and at < last:
            count, k, more = 0, 0, True
            while more and p < end:
                c = np.int64(chars[p]) - 48
                count |= (c & 0x1F) << (5 * k)
                more = (c & 0x20) != 0
                p += 1
                k += 1
                if not more and (c & 0x10) != 0:
                    count |= np.int64(-1) << (5 * k)
            if m > 2:
                count += before
            before, previous = previous, count
            if m % 2 == 1 and at + count > first:
                _fill_run(window, at, at + count, height, top, left, y0, y1, x0, x1, mirror)
            at += count
            m += 1
    return out


def _fill_run(window, start, stop, height, top, left, y0, y1, x0, x1, mirror):
    """window [rows, cols] uint8 (source pixel (top, left) at its [0, 0], mirrored: at [0, cols - 1]) = 1 where the
    run of image indices start..stop (col * height + row) meets source rows y0..y1 and columns x0..x1: the columns it
    covers whole row by row (contiguous in the window), its partial first and last column pixel by pixel."""
    cols = window.shape[1]
    c0, c1 = start // height, (stop - 1) // height  # first and last column it touches
    whole0 = c0 if start % height == 0 else c0 + 1
    whole1 = c1 + 1 if stop % height == 0 else c1  # columns whole0..whole1 are covered whole
    a, b = max(whole0, x0), min(whole1, x1)
    if a < b:
        o0, o1 = (cols - (b - left), cols - (a - left)) if mirror else (a - left, b - left)
        for r in range(y0, y1):
            window[r - top, o0:o1] = 1
    if c0 < whole0 or c0 >= whole1:  # the run starts or ends inside column c0
        _fill_column(window, c0, start, stop, height, top, left, y0, y1, x0, x1, mirror)
    if c1 >= whole1 and c1 != c0:
        _fill_column(window, c1, start, stop, height, top, left, y0, y1, x0, x1, mirror)


def _fill_column(window, c, start, stop, height, top, left, y0, y1, x0, x1, mirror):
    """window's pixels of source column c (if in x0..x1) where the run start..stop meets rows y0..y1 = 1
    (_fill_run)."""
    if c < x0 or c >= x1:
        return
    o = window.shape[1] - 1 - (c - left) if mirror else c - left
    for r in range(max(start - c * height, y0), min(stop - c * height, y1)):
        window[r - top, o] = 1


def _paint(labels, mask, label):
    """labels[mask & (labels == 0)] = label, in place. labels: uint8 or uint16 [h, w] (a label map, or a view of
    a window of one); mask: bool [h, w]."""
    for r in range(mask.shape[0]):
        target, source = labels[r], mask[r]
        for c in range(mask.shape[1]):
            if source[c] and target[c] == 0:
                target[c] = label


def _fill_blocks(buffer, starts, shapes, origins, logits):
    """buffer[starts[i]:][:rows * cols] as [rows, cols] = shapes[i], all but its one-pixel margin, = logits[origin
    row + 1 .., origin col + 1 .., i] (origins[i]: the block's [0, 0] in the proto); blocks of shape (0, 0) and
    the margins are not written. logits: float32 [Ph, Pw, n]."""
    for i in range(starts.shape[0]):
        rows, cols = shapes[i, 0], shapes[i, 1]
        top, left = origins[i, 0] + 1, origins[i, 1] + 1
        for r in range(1, rows - 1):
            at = starts[i] + r * cols
            for c in range(1, cols - 1):
                buffer[at + c] = logits[top + r - 1, left + c - 1, i]


def _encode_masks(
    blocks, starts, shapes, origins, y0, y1, wy1, x0, x1, wx1, threshold, height, width, labels, first_label
):
    """Every mask of an image in one call (no Python per mask): mask i's window from its block of probabilities
    (mask_window), its COCO counts in the [height, width] image (rle_counts), and, when labels is not [0, 0], the
    window painted into labels with label first_label + i (paint, in order: the earlier mask keeps a pixel).
    Returns (counts uint32: all masks' counts one after another; ends int64 [n]: mask i's are
    counts[ends[i - 1]:ends[i]]).
    blocks: float32, mask i's block of probabilities is blocks[starts[i]:][:rows * cols] as [rows, cols] =
    shapes[i] ((0, 0): no pixel), its [0, 0] at source pixel origins[i]; y0 .. wx1: the image's bilinear tables."""
    n = starts.shape[0]
    ends = np.zeros(n, np.int64)
    counts = np.empty(8 * n + 1, np.uint32)  # grown as needed
    total = 0
    for i in range(n):
        rows, cols = shapes[i, 0], shapes[i, 1]
        block = blocks[starts[i] : starts[i] + rows * cols].reshape(rows, cols)
        top, left, window = mask_window(block, origins[i, 0], origins[i, 1], y0, y1, wy1, x0, x1, wx1, threshold)
        piece = rle_counts(window, top, left, height, width)
        if labels.shape[0] > 0:
            paint(labels[top : top + window.shape[0], left : left + window.shape[1]], window, first_label + i)
        if total + piece.shape[0] > counts.shape[0]:
            grown = np.empty(max(2 * counts.shape[0], total + piece.shape[0]), np.uint32)
            grown[:total] = counts[:total]
            counts = grown
        counts[total : total + piece.shape[0]] = piece
        total += piece.shape[0]
        ends[i] = total
    return counts[:total], ends
