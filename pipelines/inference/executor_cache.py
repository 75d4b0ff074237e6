"""Per-executor (per Python worker) cache of loaded models: a callable that loads lazily, keyed by the model's
hash and settings, reused by every task the worker runs (Spark reuses Python workers across tasks).

Bounded: at most `CAPACITY` models per worker, least recently used evicted first (as pyspark's predict_batch_udf
caches one model per worker). A long-lived worker that sees several models (a notebook trying exports, a sweep over
precisions) keeps only the last few compiled: a YOLACT-R50 compiled by OpenVINO holds ~0.5 GB.

A load can also start in a thread of its own (`LazyModel.start_loading`: the executors' warm-up task returns at
once and frees its core while the worker compiles the model); whoever asks for that key meanwhile waits for it.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")
CAPACITY = 2
_ENTRIES: OrderedDict[Hashable, Future] = OrderedDict()   # key -> the load, done or under way
_LOCK = threading.Lock()


class LazyModel:
    """`LazyModel(key, factory)()` returns the cached object for `key`, calling `factory()` once per process while
    it stays among the CAPACITY most recently used keys. Small and picklable as long as `factory` is (it travels to
    executors in the task closure). A failed load is not cached: its callers get the error, the next call loads
    again."""

    def __init__(self, key: Hashable, factory: Callable[[], T]) -> None:
        self.key = key
        self.factory = factory

    def __call__(self) -> T:
        return self._load(in_background=False).result()

    def start_loading(self) -> None:
        """Start loading `key` in a daemon thread of this process unless it is loaded or loading; return at once."""
        self._load(in_background=True)

    def _load(self, in_background: bool) -> Future:
        with _LOCK:
            load = _ENTRIES.get(self.key)
            if load is not None:
                _ENTRIES.move_to_end(self.key)
                return load
            load = _ENTRIES[self.key] = Future()
            while len(_ENTRIES) > CAPACITY:
                _ENTRIES.popitem(last=False)
        if in_background:
            threading.Thread(target=self._run, args=(load,), name=f"sparkseg-load-{self.key!r:.40}",
                             daemon=True).start()
        else:
            self._run(load)
        return load

    def _run(self, load: Future) -> None:
        try:
            load.set_result(self.factory())
        except BaseException as err:  # noqa: BLE001  (handed to every caller of this load)
            with _LOCK:
                if _ENTRIES.get(self.key) is load:
                    del _ENTRIES[self.key]
            load.set_exception(err)


def loaded_keys() -> list[Hashable]:
    """Keys loaded in this process, least recently used first, once the loads under way have ended (tests use it to
    prove one load per worker)."""
    with _LOCK:
        loads = list(_ENTRIES.items())
    for _, load in loads:
        load.exception()   # waits; a failed load has left _ENTRIES
    with _LOCK:
        return [key for key, load in _ENTRIES.items() if load.done() and load.exception() is None]
