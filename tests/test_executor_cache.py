"""The per-worker model cache: one load per key while it is in use (also when started in a thread of its own),
bounded by CAPACITY (least recently used out)."""
from __future__ import annotations

import threading

import pytest

from pipelines.inference import executor_cache
from pipelines.inference.executor_cache import CAPACITY, LazyModel, loaded_keys


def test_each_key_loads_once_and_the_least_recently_used_is_evicted():
    loads = []

    def model(name):
        return LazyModel(("test-cache", name), lambda: loads.append(name) or f"model {name}")

    names = [f"m{i}" for i in range(CAPACITY + 1)]
    try:
        assert model(names[0])() == "model m0" and model(names[0])() == "model m0"
        for name in names[1:CAPACITY]:
            model(name)()
        model(names[0])()                     # m0 is now the most recently used
        model(names[CAPACITY])()              # evicts the least recently used: m1 (or nothing else)
        cached = [key[1] for key in loaded_keys() if key[0] == "test-cache"]
        assert len(cached) == CAPACITY and names[0] in cached and names[CAPACITY] in cached
        assert loads == names                 # every model loaded exactly once so far
        model(names[1])()                     # evicted earlier: loaded again
        assert loads == names + [names[1]]
    finally:
        with executor_cache._LOCK:
            for key in [key for key in executor_cache._ENTRIES if key[0] == "test-cache"]:
                del executor_cache._ENTRIES[key]


def forget(key) -> None:
    with executor_cache._LOCK:
        executor_cache._ENTRIES.pop(key, None)


def test_a_load_started_in_the_background_returns_at_once_and_later_calls_share_it():
    key, started, release, loads = ("test-cache", "background"), threading.Event(), threading.Event(), []

    def load():
        started.set()
        assert release.wait(30), "the test never released the load"
        loads.append(key)
        return "model"

    lazy = LazyModel(key, load)
    try:
        lazy.start_loading()                  # returns while the load waits for `release`
        assert started.wait(30) and loads == []
        lazy.start_loading()                  # already under way: no second load
        release.set()
        assert lazy() == "model" and lazy() == "model"
        assert loads == [key] and key in loaded_keys()
    finally:
        release.set()
        forget(key)


def test_a_failed_load_reaches_its_caller_and_is_not_cached():
    key, attempts = ("test-cache", "failing"), []

    def broken():
        attempts.append(1)
        raise ValueError("corrupt model file")

    try:
        LazyModel(key, broken).start_loading()
        with pytest.raises(ValueError, match="corrupt model file"):
            LazyModel(key, broken)()          # waits for the background load's error, or fails loading again
        assert key not in loaded_keys() and attempts
        assert LazyModel(key, lambda: "fixed")() == "fixed"
    finally:
        forget(key)
