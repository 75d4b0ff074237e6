"""Waiting in tests without ever blocking forever: for a child process's next line, or for a condition."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout


def read_line(process: subprocess.Popen, timeout_s: float = 120.0) -> str:
    """The next line of `process.stdout` (text mode), stripped; fails the test after `timeout_s` (the process is
    killed so the reading thread ends) or with the process's stderr when it exited without printing one."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(process.stdout.readline)
        try:
            line = pending.result(timeout=timeout_s)
        except FutureTimeout:
            process.kill()
            raise AssertionError(f"no line from {process.args!r} within {timeout_s} s") from None
    if not line and process.poll() is not None:
        stderr = process.stderr.read() if process.stderr else ""
        raise AssertionError(f"{process.args!r} exited {process.returncode} without output: {stderr[-3000:]}")
    return line.strip()


def wait_until(
    condition: Callable[[], object],
    what: str,
    timeout_s: float = 300.0,
    interval_s: float = 0.1,
    process: subprocess.Popen | None = None,
) -> None:
    """Poll `condition` until it is true; fails the test naming `what` after `timeout_s`, or at once when `process`
    (the run the condition waits on) has ended before it."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process is not None and process.poll() is not None:
            raise AssertionError(f"the process ended (exit {process.returncode}) before {what}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
