"""The per-worker model cache: one load per key while it is in use, bounded by CAPACITY (least recently used out)."""

from __future__ import annotations

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
        model(names[0])()  # m0 is now the most recently used
        model(names[CAPACITY])()  # evicts the least recently used: m1 (or nothing else)
        cached = [key[1] for key in loaded_keys() if key[0] == "test-cache"]
        assert len(cached) == CAPACITY and names[0] in cached and names[CAPACITY] in cached
        assert loads == names  # every model loaded exactly once so far
        model(names[1])()  # evicted earlier: loaded again
        assert loads == names + [names[1]]
    finally:
        with executor_cache._LOCK:
            for key in [key for key in executor_cache._ENTRIES if key[0] == "test-cache"]:
                del executor_cache._ENTRIES[key]
