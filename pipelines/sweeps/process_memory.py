"""Peak memory of a process tree while it runs: a driver subprocess and everything it starts (the driver JVM, in
local mode the executor inside it, the Python workers), plus the daemons of a standalone cluster (executor JVMs
and their Python workers are children of the Worker JVMs, not of the driver).

Two numbers per role, because they answer different questions:
- `peak_rss_mb`: the largest VmHWM (the kernel's resident-set high-water mark) of any one process of that role,
  read from /proc/<pid>/status on every sample, so the true peak is caught even between samples as long as the
  process is seen once before it exits. This is "how big does one driver / one Python worker get".
- `peak_total_pss_mb` (whole tree): the largest sum of PSS over all processes at one sample. PSS splits shared
  pages between the processes that share them, so forked Python workers are not counted twice. This is "how much
  memory does the whole thing need", sampled every `interval_s`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import psutil

MB = 1024 * 1024
ROLES = ("driver", "driver_jvm", "executor_jvm", "python_daemon", "python_worker", "cluster_daemon", "other")
PROVISIONAL_ROLES = ("cluster_daemon", "other")  # what a process may read as before its exec


def process_role(proc: psutil.Process, driver_pids: set[int]) -> str:
    """What a process is, from its command line: one of ROLES."""
    # imported here: reading a process's memory (high_water_mark_bytes, the executor bench's) needs no pyspark
    from pipelines.spark.spark_session import LOCAL_DAEMON_MODULE

    # Spark's Python daemon, and the one a sparkseg job's local[...] master starts (local_daemon_settings): the JVM
    # runs them as `python -m <module>`
    daemon_modules = ("pyspark.daemon", LOCAL_DAEMON_MODULE)
    if proc.pid in driver_pids:
        return "driver"
    try:
        cmdline = " ".join(proc.cmdline())
        parent = proc.parent()
        parent_cmdline = " ".join(parent.cmdline()) if parent else ""
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return "other"
    if "CoarseGrainedExecutorBackend" in cmdline:
        return "executor_jvm"
    if "org.apache.spark.deploy.SparkSubmit" in cmdline:
        return "driver_jvm"
    if "org.apache.spark.deploy.master.Master" in cmdline or "org.apache.spark.deploy.worker.Worker" in cmdline:
        return "cluster_daemon"
    if any(f"-m {module}" in cmdline for module in (*daemon_modules, "pyspark.worker")):
        # The daemon forks its workers without exec: they keep its command line; only the parent tells them apart.
        return (
            "python_worker" if any(f"-m {module}" in parent_cmdline for module in daemon_modules) else "python_daemon"
        )
    return "other"


def high_water_mark_bytes(pid: int) -> int | None:
    """VmHWM of `pid` in bytes (peak resident set since the process started), None once it is gone."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return None


@dataclass
class RolePeak:
    """peak_rss_mb: the largest VmHWM of one process of this role; processes: how many distinct PIDs were seen."""

    peak_rss_mb: float = 0.0
    processes: int = 0


@dataclass
class MemoryPeaks:
    """What a TreeMemorySampler saw: per role (see ROLES) and the peak total PSS of the whole tree, in MB."""

    roles: dict[str, RolePeak] = field(default_factory=lambda: {role: RolePeak() for role in ROLES})
    peak_total_pss_mb: float = 0.0
    samples: int = 0

    def peak(self, role: str) -> float | None:
        """Peak RSS of one process of `role` in MB, None when no such process was seen."""
        entry = self.roles[role]
        return round(entry.peak_rss_mb, 1) if entry.processes else None

    def as_row(self, prefix: str = "") -> dict:
        """Flat columns for a CSV row: <prefix>peak_rss_<role>_mb, <prefix>python_workers, <prefix>peak_total_pss_mb."""
        row = {
            f"{prefix}peak_rss_{role}_mb": self.peak(role)
            for role in ("driver", "driver_jvm", "executor_jvm", "python_worker")
        }
        row[f"{prefix}python_workers"] = self.roles["python_worker"].processes
        row[f"{prefix}peak_total_pss_mb"] = round(self.peak_total_pss_mb, 1)
        return row


class TreeMemorySampler:
    """Samples the process trees under `roots` every `interval_s` seconds in a background thread.

        with TreeMemorySampler(driver_pids=[proc.pid], other_roots=cluster_pids) as sampler:
            proc.wait()
        sampler.peaks.peak("python_worker")

    driver_pids: the processes that count as "driver" (the job's main Python process); their descendants are
    classified by command line. other_roots: more trees to include (a standalone cluster's daemons).
    """

    def __init__(self, driver_pids: list[int], other_roots: list[int] = (), interval_s: float = 0.5) -> None:
        if interval_s <= 0:
            raise ValueError(f"TreeMemorySampler: interval_s must be > 0, got {interval_s}")
        self.driver_pids = set(driver_pids)
        self.roots = list(driver_pids) + list(other_roots)
        self.interval_s = interval_s
        self.peaks = MemoryPeaks()
        self._roles: dict[int, str] = {}
        self._seen: dict[str, set[int]] = {role: set() for role in ROLES}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def tree(self) -> list[psutil.Process]:
        """The roots and all their live descendants."""
        found = {}
        for pid in self.roots:
            try:
                root = psutil.Process(pid)
                found[root.pid] = root
                for child in root.children(recursive=True):
                    found[child.pid] = child
            except (psutil.NoSuchProcess, psutil.ZombieProcess):
                continue
        return list(found.values())

    def sample(self) -> None:
        """One sample: update every role's VmHWM peak and the tree's total PSS."""
        total_pss = 0
        for proc in self.tree():
            role = self._roles.get(proc.pid)
            if role is None:
                role = process_role(proc, self.driver_pids)
                # kept only once definitive: a process seen between its fork and its exec (a Worker JVM starting an
                # executor through jspawnhelper) reads as its parent or as "other", and is looked at again next time
                if role not in PROVISIONAL_ROLES:
                    self._roles[proc.pid] = role
            hwm = high_water_mark_bytes(proc.pid)
            if hwm is None:
                continue
            entry = self.peaks.roles[role]
            entry.peak_rss_mb = max(entry.peak_rss_mb, hwm / MB)
            self._seen[role].add(proc.pid)
            entry.processes = len(self._seen[role])
            try:
                total_pss += proc.memory_full_info().pss
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess, AttributeError):
                continue
        self.peaks.peak_total_pss_mb = max(self.peaks.peak_total_pss_mb, total_pss / MB)
        self.peaks.samples += 1

    def _loop(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval_s):
                return

    def __enter__(self) -> TreeMemorySampler:
        self._thread = threading.Thread(target=self._loop, name="sparkseg-memory-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
