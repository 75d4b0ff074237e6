"""inference.pin_cores: worker processes claim different cores, one more than the cores stays unpinned, a killed
worker's core is free again, and threads started before the claim are pinned too. Real processes (spawned), real
locks and affinity masks; every wait is bounded."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading

import pytest

from pipelines.inference.core_pinning import pin_to_free_cores
from pipelines.inference.openvino_runtime import RuntimeSettings

WAIT_S = 60


def _worker(lock_dir, results, release) -> None:
    """Claim a core, report, hold it until `release` (this worker's own pipe: a killed process must not hold a
    lock the others need, as a shared Event's would be)."""
    started, done = threading.Event(), threading.Event()
    idle = threading.Thread(target=lambda: (started.set(), done.wait(WAIT_S)))
    idle.start()
    started.wait(WAIT_S)
    cores = pin_to_free_cores(1, lock_dir)
    results.put((os.getpid(), cores, os.sched_getaffinity(0), os.sched_getaffinity(idle.native_id)))
    release.poll(WAIT_S)
    done.set()
    idle.join(WAIT_S)


def test_workers_take_different_cores_and_a_dead_workers_core_is_free_again(tmp_path):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    every = os.sched_getaffinity(0)
    workers, releases = [], []

    def start() -> tuple:
        release, releases_end = ctx.Pipe(duplex=False)
        worker = ctx.Process(target=_worker, args=(tmp_path, results, release))
        worker.start()
        workers.append(worker)
        releases.append(releases_end)
        return results.get(timeout=WAIT_S)

    try:
        claims = {}
        for _ in every:
            pid, cores, affinity, earlier_thread = start()
            assert cores is not None and len(cores) == 1
            assert affinity == cores and earlier_thread == cores
            claims[pid] = cores
        assert set().union(*claims.values()) == every  # each core once
        _, cores, affinity, _ = start()  # one worker more than cores
        assert cores is None and affinity == every  # stays unpinned
        first = workers[0]
        first.kill()
        first.join(WAIT_S)
        _, cores, affinity, _ = start()
        assert cores == claims[first.pid] and affinity == cores  # the killed worker's core
    finally:
        for end in releases:
            end.close()  # the worker's poll sees the end of its pipe
        for worker in workers:
            worker.join(WAIT_S)
            if worker.is_alive():
                worker.kill()


def test_pinning_needs_the_number_of_cores():
    with pytest.raises(ValueError, match="pin_cores"):
        RuntimeSettings(precision="f32", pin_cores=True)
    assert RuntimeSettings.for_task_cpus(2, pin_cores=True).threads == 2
