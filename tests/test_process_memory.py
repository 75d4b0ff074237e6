"""The sweep's memory sampler (pipelines.sweeps.process_memory): a process first seen between its fork and its exec
(a standalone Worker starting an executor JVM) is classified again once it has exec'd, not left as what it read as."""

from __future__ import annotations

import os
import subprocess
import sys

import psutil

from pipelines.sweeps.process_memory import TreeMemorySampler
from tests.process_io import wait_until

# reads a line, then becomes a process whose command line names an executor JVM's main class
BEFORE_EXEC = (
    "import os, sys; sys.stdin.readline(); "
    "os.execv(sys.executable, [sys.executable, '-c', 'import sys; sys.stdin.readline()', "
    "'CoarseGrained' + 'ExecutorBackend'])"  # the name whole only after the exec
)


def test_a_process_sampled_before_its_exec_gets_its_role_after_it():
    child = subprocess.Popen([sys.executable, "-c", BEFORE_EXEC], stdin=subprocess.PIPE, text=True)
    try:
        sampler = TreeMemorySampler(driver_pids=[os.getpid()])
        sampler.sample()
        assert sampler.peaks.peak("executor_jvm") is None and sampler.peaks.peak("other") is not None
        child.stdin.write("exec\n")
        child.stdin.flush()
        process = psutil.Process(child.pid)
        wait_until(lambda: "CoarseGrainedExecutorBackend" in process.cmdline(), "the child's exec", 60, process=child)
        sampler.sample()
        assert sampler.peaks.peak("executor_jvm") is not None and sampler.peaks.roles["executor_jvm"].processes == 1
    finally:
        child.stdin.close()
        child.wait(timeout=60)
