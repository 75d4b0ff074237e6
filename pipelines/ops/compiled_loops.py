"""The ops' per-pixel loops, compiled by numba: separable bilinear resampling (an image to the network's input, a
mask window from the prototypes, with the threshold in the same pass), a mask's COCO RLE counts, and painting a
mask into a label map (all three for every mask of an image in one call: `encode_masks`); Detect's per-class
top-k over every prior's class scores (`class_top_k`) and its Fast NMS (`fast_nms_keep`); and, for the training
input workers, compressed COCO RLEs decoded straight into an augmentation window (`rle_window`).

One pass in machine code where numpy needs five or six whole-array passes and a Python call per block: the bundled
model's masks (~50 per image, upsampled 10-30x) cost 7.2 -> 1.1 ms per image for the upsample and threshold
(2-core AVX-512 Xeon). Every value is the float32 multiplies and adds of torch's generic CPU kernel in its order
(LLVM fuses a multiply and an add into an FMA only under fast-math flags, which nothing here sets), so the results
are the same on every machine. torch's own results are not: its vectorized kernels (torch 2.14 on AVX-512) differ
from that order by up to 3 float32 ulps on about a quarter of the pixels, so tests compare with torch within a
tolerance.

Compiled on first use in a process and cached on disk where numba finds a place (``__pycache__`` beside this file,
else the user's cache directory, or NUMBA_CACHE_DIR): a fresh checkout compiles once (~1 s per function and
argument types), later processes load the machine code (~0.6 s for numba's import and the first function, ms for
the others; `load` does it before the first image). Imported from the zip that `spark_session.ship_library` adds
on a cluster whose Python env lacks sparkseg (no file to cache beside), the kernels come from a file copy of this
module in the temp directory, compiled by a machine's first worker and cached beside it; with no writable place at
all each process compiles for itself. numba itself is imported at the first use of a kernel (`__getattr__`): the
driver imports this module with the task modules, never calls it, and never loads numba.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import sys
import tempfile
import threading
from pathlib import Path

import numpy as np

from pipelines.io.storage import publish_once

log = logging.getLogger(__name__)
_ONE = np.float32(1.0)
# attributes of this module once compiled
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
    "class_top_k",
    "fast_nms_keep",
)
# what the kernels call: compiled first, in place (the kernels find them by name)
_HELPERS = (
    "_width_pass",
    "_width_row",
    "_complement",
    "_score_key",
    "_search",
    "_hot_range",
    "_fill_run",
    "_fill_column",
    "_iou_above",
)
_COMPILING = threading.Lock()


def __getattr__(name: str):
    """The kernels exist from their first use in a process (PEP 562): importing this module costs nothing, and
    numba is imported only where pixels are processed (the driver imports the task modules but never calls them).
    After the first use they are plain module attributes."""
    if name in KERNELS:
        _compile()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _compile() -> None:
    """Put each kernel in the module as numba.njit of its Python source function (`_<name>`), with the disk cache
    where numba can place one; imported from a zip, the kernels of a file copy of this module (_file_copy)."""
    with _COMPILING:
        module = globals()
        if all(name in module for name in KERNELS):
            return
        if not os.path.isfile(__file__):
            try:
                copy = _file_copy()
            except OSError as err:  # no writable temp directory: compiled here, in each process
                log.debug("no file copy of %s: %s", __name__, err)
            else:
                for name in KERNELS:
                    module[name] = getattr(copy, name)
                return
        import numba

        def jit(function):  # numpy's float semantics: x / 0 is inf or NaN (Python's would raise)
            try:
                return numba.njit(cache=True, nogil=True, error_model="numpy")(function)
            except RuntimeError as err:  # numba: "cannot cache function ...: no locator available for file ..."
                log.debug("%s compiled in each process: %s", function.__name__, err)
                return numba.njit(nogil=True, error_model="numpy")(function)

        for name in _HELPERS:
            module[name] = jit(module[name])
        for name in KERNELS:
            module[name] = jit(module[f"_{name}"])


def _file_copy():
    """This module loaded from a file copy of its source, for when it was imported from a zip (the library archive
    spark_session.ship_library adds on clusters whose Python env lacks sparkseg): numba caches machine code only
    beside a real source file, so each Python worker would compile the kernels again (3.5 s here). The copy,
    <temp dir>/sparkseg-compiled-loops-<source hash>/sparkseg_compiled_loops.py, is written once per machine and
    version of the source (atomically, never rewritten: numba's cache is keyed by the file's time stamp); the first
    worker compiles, the others load its cache."""
    source = importlib.util.find_spec(__name__).loader.get_source(__name__)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / f"sparkseg-compiled-loops-{digest}" / "sparkseg_compiled_loops.py"
    if not path.is_file():
        path.parent.mkdir(exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        staging.write_text(source, encoding="utf-8")
        publish_once(staging, path)
    name = f"sparkseg_compiled_loops_{digest}"  # in sys.modules: numba's cached code names its module
    spec = importlib.util.spec_from_file_location(name, path)
    copy = sys.modules[name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(copy)
    copy._compile()
    return copy


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
    candidates: conf is read twice in all, ~1 ms each for R50's 6 MB); a second pass keeps the candidates
    scoring >= their class's floor. A class that kept >= k of them holds its best k among them (the k-th best
    scores >= the floor); the others (a bad guess, rare) sort every candidate's key. Kept entries are
    ranked by _score_key, so ties go to the lower position. A heap in one pass would replace ~k (1 + ln(n / k))
    roots per class (89,000 per image for R50's 80 classes): 5 ms more.
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


def load() -> None:
    """Compile, or load from the disk cache, each function for the argument types the executors pass (a tiny call
    each), so that a worker's first image does not wait for it. Not rle_window: the training input workers' kernel
    (batches.load_kernels loads it there)."""
    kernels = sys.modules[__name__]  # its attributes compile them (__getattr__)
    index, weight = np.zeros(1, np.int64), np.zeros(1, np.float32)
    kernels.resample(
        np.zeros((1, 1), np.uint8), index, index, weight, index, index, weight, np.empty((1, 1), np.float32)
    )
    kernels.resample_planes(
        np.zeros((1, 1), np.uint8),
        index,
        index,
        weight,
        index,
        index,
        weight,
        weight,
        weight + 1,
        np.empty((1, 1, 1), np.float32),
    )
    kernels.resample_above(
        np.zeros((1, 1), np.float32), index, index, weight, index, index, weight, 0.5, np.empty((1, 1), bool)
    )
    kernels.mask_window(np.ones((1, 1), np.float32), 0, 0, index, index, weight, index, index, weight, 0.5)
    labels, mask = np.zeros((2, 2), np.uint8), np.ones((1, 1), bool)
    kernels.paint(labels[:1, :1], mask, 1)
    kernels.rle_counts(mask, 0, 0, 2, 2)
    kernels.fill_blocks(
        np.zeros(1, np.float32),
        index,
        np.ones((1, 2), np.int64),
        np.zeros((1, 2), np.int64),
        np.zeros((1, 1, 1), np.float32),
    )
    for painted in (labels, np.zeros((0, 0), np.uint8)):
        kernels.encode_masks(
            np.ones(1, np.float32),
            index,
            np.ones((1, 2), np.int64),
            np.zeros((1, 2), np.int64),
            index,
            index,
            weight,
            index,
            index,
            weight,
            0.5,
            2,
            2,
            painted,
            1,
        )
    kernels.class_top_k(np.zeros((1, 2), np.float32), np.float32(0.5), 1)
    kernels.fast_nms_keep(
        np.zeros((1, 4), np.float32),
        np.zeros((1, 1), np.int64),
        np.ones(1, np.int64),
        np.float32(0.5),
        np.zeros((1, 1), bool),
    )
