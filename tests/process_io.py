"""Reading a child process's output in tests without ever blocking forever."""
from __future__ import annotations

import subprocess
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
