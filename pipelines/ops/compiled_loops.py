"""The ops' per-pixel loops, compiled by numba: separable bilinear resampling (an image to the network's input, a
mask window from the prototypes, with the threshold in the same pass), a mask's COCO RLE counts, and painting a
mask into a label map.

One pass in machine code where numpy needs five or six whole-array passes and a Python call per block: the bundled
model's masks (~50 per image, upsampled 10-30x) cost 7.2 -> 1.1 ms per image for the upsample and threshold
(2-core AVX-512 Xeon). Results are bit for bit those of torch's generic CPU kernel, which the numpy versions
matched: every value is the same float32 multiplies and adds in the same order (LLVM fuses a multiply and an add
into an FMA only under fast-math flags, which nothing here sets); tests compare with torch and with the reference.

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

log = logging.getLogger(__name__)
_ONE = np.float32(1.0)
KERNELS = ("resample", "resample_above", "rle_counts", "paint")   # attributes of this module once compiled
_HELPERS = ("_width_pass",)   # what the kernels call: compiled first, in place (the kernels find them by name)
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
            except OSError as err:   # no writable temp directory: compiled here, in each process
                log.debug("no file copy of %s: %s", __name__, err)
            else:
                for name in KERNELS:
                    module[name] = getattr(copy, name)
                return
        import numba

        def jit(function):
            try:
                return numba.njit(cache=True, nogil=True)(function)
            except RuntimeError as err:   # numba: "cannot cache function ...: no locator available for file ..."
                log.debug("%s compiled in each process: %s", function.__name__, err)
                return numba.njit(nogil=True)(function)

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
        os.replace(staging, path)
    name = f"sparkseg_compiled_loops_{digest}"   # in sys.modules: numba's cached code names its module
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
    wx0 = np.empty(x0.shape[0], np.float32)
    for c in range(x0.shape[0]):
        wx0[c] = _ONE - wx1[c]
    by_width = np.empty((needed, x0.shape[0]), np.float32)
    for s in range(slot.shape[0]):
        if slot[s] >= 0:
            line, target = src[first + s], by_width[slot[s]]
            for c in range(x0.shape[0]):
                target[c] = np.float32(line[x0[c]]) * wx0[c] + np.float32(line[x1[c]]) * wx1[c]
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


def _rle_counts(mask, top, left, height, width):
    """COCO's uncompressed RLE counts (uint32) of bool mask [h, w] (h, w >= 1) placed at (top, left) in an
    otherwise all-False [height, width] image: the lengths of the column-major runs, starting with a (possibly empty)
    run of zeros, without an empty last run (pycocotools' rleEncode).

    Runs start and end where a pixel differs from the one above it (False above and below the mask); the changes
    are found row by row, eight columns per test, and ordered by column (rows are visited in order); a run that
    ends on the image's bottom row and one that starts on the next column's top row are one run.
    """
    h, w = mask.shape
    per_row = (w + 7) // 8
    changed = np.zeros(per_row * 8, np.uint8)
    words = changed.view(np.uint64)
    found_at = np.empty((h + 1) * per_row, np.int64)   # the 8-column groups with a change: row * per_row + group
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
    at = np.zeros(per_row * 8 + 1, np.int64)   # a counting sort by column: where each column's changes go
    for g in range(groups):
        first = found_at[g] % per_row * 8
        for j in range(8):
            at[first + j + 1] += found[g, j]   # (flags past the last column are 0)
    for c in range(w):
        at[c + 1] += at[c]
    n = at[w]
    edges = np.empty(n, np.int64)   # image indices col * height + row, ascending; starts and ends alternate
    for g in range(groups):         # groups come row by row, so each column's rows come in order
        r, first = found_at[g] // per_row, found_at[g] % per_row * 8
        for j in range(8):
            if found[g, j]:
                edges[at[first + j]] = (left + first + j) * height + top + r
                at[first + j] += 1
    counts = np.empty(n + 1, np.uint32)
    k, previous, i = 0, 0, 0
    while i < n:
        if i % 2 == 1 and i + 1 < n and edges[i + 1] == edges[i]:   # an end meets the next start: one run
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


def _paint(labels, mask, label):
    """labels[mask & (labels == 0)] = label, in place. labels: uint8 or uint16 [h, w] (a label map, or a view of
    a window of one); mask: bool [h, w]."""
    for r in range(mask.shape[0]):
        target, source = labels[r], mask[r]
        for c in range(mask.shape[1]):
            if source[c] and target[c] == 0:
                target[c] = label


def load() -> None:
    """Compile, or load from the disk cache, each function for the argument types the executors pass (a tiny call
    each), so that a worker's first image does not wait for it."""
    kernels = sys.modules[__name__]   # its attributes compile them (__getattr__)
    index, weight = np.zeros(1, np.int64), np.zeros(1, np.float32)
    kernels.resample(np.zeros((1, 1), np.uint8), index, index, weight, index, index, weight,
                     np.empty((1, 1), np.float32))
    kernels.resample_above(np.zeros((1, 1), np.float32), index, index, weight, index, index, weight, 0.5,
                           np.empty((1, 1), bool))
    labels, mask = np.zeros((2, 2), np.uint8), np.ones((1, 1), bool)
    kernels.paint(labels[:1, :1], mask, 1)
    kernels.rle_counts(mask, 0, 0, 2, 2)
