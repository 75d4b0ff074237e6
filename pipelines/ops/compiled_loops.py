"""The ops' per-pixel loops, compiled by numba: the pixel kernels (pipelines.ops.pixel_kernels: bilinear
resampling, mask windows, COCO RLE counts, label-map painting, `encode_masks` for all masks of an image in one call,
`rle_window` for the training input workers) and Detect's (pipelines.ops.detect_kernels: per-class top-k
`class_top_k`, Fast NMS `fast_nms_keep`). Callers use them as this module's attributes: `compiled_loops.resample`.

One pass in machine code where numpy needs five or six whole-array passes and a Python call per block
(docs/performance.md has the figures). Every value is the float32 multiplies and adds of torch's generic CPU kernel
in its order (LLVM fuses a multiply and an add into an FMA only under fast-math flags, which nothing here sets), so
the results are the same on every machine. torch's own results are not: its vectorized kernels differ from that
order by a few float32 ulps on part of the pixels, so tests compare with torch within a tolerance.

Compiled on first use in a process and cached on disk where numba finds a place (``__pycache__`` beside the source
module, else the user's cache directory, or NUMBA_CACHE_DIR): a fresh checkout compiles once per function and
argument types, later processes load the machine code (`load` does it before the first image). Imported from the zip
that `spark_session.ship_library` adds on a cluster whose Python env lacks sparkseg (no file to cache beside), the
kernels come from a file copy of their source module in the temp directory, compiled by a machine's first worker and
cached beside it; with no writable place at all each process compiles for itself. numba itself is imported at the
first use of a kernel (`__getattr__`): the driver imports this module with the task modules, never calls it, and
never loads numba.
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
from types import ModuleType

import numpy as np

from pipelines.io.storage import publish_once
from pipelines.ops import detect_kernels, pixel_kernels

log = logging.getLogger(__name__)
SOURCES = (pixel_kernels, detect_kernels)
# attributes of this module once compiled
KERNELS = tuple(name for source in SOURCES for name in source.KERNELS)
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
    """Put each kernel in this module: compiled in its source module, or, imported from a zip, in a file copy of
    that module (_file_copy)."""
    with _COMPILING:
        module = globals()
        if all(name in module for name in KERNELS):
            return
        for source in SOURCES:
            compiled = source
            if not os.path.isfile(source.__file__ or ""):
                try:
                    compiled = _file_copy(source)
                except OSError as err:  # no writable temp directory: compiled here, in each process
                    log.debug("no file copy of %s: %s", source.__name__, err)
            _jit_in(compiled)
            for name in source.KERNELS:
                module[name] = getattr(compiled, name)


def _jit_in(source: ModuleType) -> None:
    """In `source`'s namespace: each helper replaced by numba.njit of itself, each kernel `<name>` = numba.njit of
    its Python function `_<name>`, with the disk cache where numba can place one."""
    namespace = vars(source)
    if all(name in namespace for name in source.KERNELS):
        return
    import numba  # the heavy optional import, at the first use of a kernel (the module docstring says why)

    def jit(function):  # numpy's float semantics: x / 0 is inf or NaN (Python's would raise)
        try:
            return numba.njit(cache=True, nogil=True, error_model="numpy")(function)
        except RuntimeError as err:  # numba: "cannot cache function ...: no locator available for file ..."
            log.debug("%s compiled in each process: %s", function.__name__, err)
            return numba.njit(nogil=True, error_model="numpy")(function)

    for name in source.HELPERS:
        namespace[name] = jit(namespace[name])
    for name in source.KERNELS:
        namespace[name] = jit(namespace[f"_{name}"])


def _file_copy(source: ModuleType) -> ModuleType:
    """`source` loaded from a file copy of its code, for when it was imported from a zip (the library archive
    spark_session.ship_library adds on clusters whose Python env lacks sparkseg): numba caches machine code only
    beside a real source file, so each Python worker would compile the kernels again. The copy,
    <temp dir>/sparkseg-<module>-<source hash>/sparkseg_<module>.py, is written once per machine and version of the
    source (atomically, never rewritten: numba's cache is keyed by the file's time stamp); the first worker
    compiles, the others load its cache."""
    spec = importlib.util.find_spec(source.__name__)
    assert spec is not None and spec.loader is not None  # an imported module's
    code = spec.loader.get_source(source.__name__)  # type: ignore[attr-defined]  # zipimporter and file loaders have it
    digest = hashlib.sha256(code.encode()).hexdigest()[:16]
    short = source.__name__.rsplit(".", 1)[-1]
    path = Path(tempfile.gettempdir()) / f"sparkseg-{short}-{digest}" / f"sparkseg_{short}.py"
    if not path.is_file():
        path.parent.mkdir(exist_ok=True)
        staging = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        staging.write_text(code, encoding="utf-8")
        publish_once(staging, path)
    name = f"sparkseg_{short}_{digest}"  # in sys.modules: numba's cached code names its module
    copy_spec = importlib.util.spec_from_file_location(name, path)
    assert copy_spec is not None and copy_spec.loader is not None  # a .py file's
    copy = sys.modules[name] = importlib.util.module_from_spec(copy_spec)
    copy_spec.loader.exec_module(copy)
    return copy


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
