"""Per-executor (per Python worker) cache of loaded models: a callable that loads lazily, keyed by the model's
hash and settings, reused by every task the worker runs (Spark reuses Python workers across tasks)."""
from __future__ import annotations

import threading
from typing import Callable, Hashable, TypeVar

T = TypeVar("T")
_ENTRIES: dict[Hashable, object] = {}
_LOCK = threading.Lock()


class LazyModel:
    """`LazyModel(key, factory)()` returns the cached object for `key`, calling `factory()` once per process.
    Small and picklable as long as `factory` is (it travels to executors in the task closure)."""

    def __init__(self, key: Hashable, factory: Callable[[], T]) -> None:
        self.key = key
        self.factory = factory

    def __call__(self) -> T:
        with _LOCK:
            if self.key not in _ENTRIES:
                _ENTRIES[self.key] = self.factory()
            return _ENTRIES[self.key]


def loaded_keys() -> list[Hashable]:
    """Keys loaded in this process (tests use it to prove one load per worker)."""
    with _LOCK:
        return list(_ENTRIES)
