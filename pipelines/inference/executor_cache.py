"""Per-executor (per Python worker) cache of loaded models: a callable that loads lazily, keyed by the model's
hash and settings, reused by every task the worker runs (Spark reuses Python workers across tasks).

Bounded: at most `CAPACITY` models per worker, least recently used evicted first (as pyspark's predict_batch_udf
caches one model per worker). A long-lived worker that sees several models (a notebook trying exports, a sweep over
precisions) keeps only the last few compiled: a large model compiled by OpenVINO holds a lot of memory.
"""

from __future__ import annotations

import gc
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import TypeVar

T = TypeVar("T")
CAPACITY = 2
_ENTRIES: OrderedDict[Hashable, object] = OrderedDict()
_LOCK = threading.Lock()


class LazyModel:
    """`LazyModel(key, factory)()` returns the cached object for `key`, calling `factory()` once per process while
    it stays among the CAPACITY most recently used keys. Small and picklable as long as `factory` is (it travels to
    executors in the task closure)."""

    def __init__(self, key: Hashable, factory: Callable[[], T]) -> None:
        self.key = key
        self.factory = factory

    def __call__(self) -> T:
        with _LOCK:
            if self.key in _ENTRIES:
                _ENTRIES.move_to_end(self.key)
            else:
                _ENTRIES[self.key] = self.factory()
                while len(_ENTRIES) > CAPACITY:
                    _ENTRIES.popitem(last=False)
                # The model and the modules its load imported (OpenVINO, numba's compiled loops, pandas) live as long
                # as the worker: out of the cyclic collector's sight, the full collection pyspark runs after every
                # task (and each automatic one) no longer walks their many objects each time.
                # Reference counting still frees them when evicted.
                gc.freeze()
            return _ENTRIES[self.key]


def loaded_keys() -> list[Hashable]:
    """Keys loaded in this process, least recently used first (tests use it to prove one load per worker)."""
    with _LOCK:
        return list(_ENTRIES)
