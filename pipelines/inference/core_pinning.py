"""`inference.pin_cores`: each executor Python worker runs on cores of its own.

Spark runs one Python worker per concurrent task, each with its own compiled model and OpenVINO threads. Unpinned,
the kernel moves them between cores (a worker's Python thread wakes on a core where another worker's inference
runs), and a large model loses what it had in the core's caches (`make bench-executor` measures both ways;
docs/performance.md). Off by default: on a host shared with other work, pinned workers cannot move away from a busy
core.

A worker claims `count` of the cores it may run on (its affinity mask, which a cgroup cpuset or taskset narrows) by
holding an exclusive, non-blocking lock on one file per core in a host-wide directory, so the workers of every
executor and job of this user on the host take different cores; a worker that exits or is killed frees its cores
with its file descriptors. Where fewer than `count` cores are free (more workers than cores), the worker stays
unpinned and says so in the executor log.
"""

from __future__ import annotations

import fcntl
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
_CLAIMED: dict[int, int] = {}  # this process's cores -> their lock file descriptors (open for its lifetime)


def default_lock_dir() -> Path:
    return Path(tempfile.gettempdir()) / f"sparkseg-cores-{os.getuid()}"


def pin_to_free_cores(count: int, lock_dir: Path | None = None) -> set[int] | None:
    """Claim `count` free cores and pin every thread of this process to them; the cores, or None where fewer are
    free (the process stays as it was). Idempotent: a process that holds cores keeps them."""
    if _CLAIMED:
        return set(_CLAIMED)
    if not hasattr(os, "sched_setaffinity"):
        log.warning(
            "inference.pin_cores: this platform cannot pin a process to cores (no sched_setaffinity): "
            "the worker stays unpinned"
        )
        return None
    lock_dir = lock_dir or default_lock_dir()
    lock_dir.mkdir(parents=True, exist_ok=True)
    claimed: dict[int, int] = {}
    for core in sorted(os.sched_getaffinity(0)):
        fd = os.open(lock_dir / f"core-{core}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        claimed[core] = fd
        if len(claimed) == count:
            break
    if len(claimed) < count:
        for fd in claimed.values():
            os.close(fd)
        log.info(
            "inference.pin_cores: fewer than %d free cores among %s (lock files in %s): this worker stays unpinned",
            count,
            sorted(os.sched_getaffinity(0)),
            lock_dir,
        )
        return None
    _CLAIMED.update(claimed)
    for thread in os.listdir("/proc/self/task"):  # threads started earlier (a previous model's) too
        try:
            os.sched_setaffinity(int(thread), claimed)
        except OSError:  # the thread ended meanwhile
            pass
    log.info("inference.pin_cores: worker %d runs on cores %s", os.getpid(), sorted(claimed))
    return set(claimed)
