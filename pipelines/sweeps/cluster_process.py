"""A standalone cluster (pipelines.sweeps.standalone_cluster.StandaloneCluster) run by a chosen Python env, as a child
process: `python -m pipelines.sweeps.standalone_cluster --workers N --cores C ...`.

Why a child process: the cluster's Spark version must match the driver's, and the BigDL engine's env has another
pyspark (3.5) than the main one (4.x); StandaloneCluster uses the pyspark of the interpreter that runs it. The
Master and Worker JVMs are descendants of this child, so memory sampling finds the executors under it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

from pipelines.job_config import REPO_ROOT
from pipelines.sweeps.standalone_cluster import ClusterStartError, log_tail


class ClusterProcess:
    """`with ClusterProcess(python, workers=2, cores=1, memory="2g", base_dir=d) as cluster: cluster.master_url`.

    stop() ends the child with SIGTERM (StandaloneCluster's CLI stops its daemons on it) and, if it does not exit
    within `stop_timeout_s`, kills the process groups of the daemons it started (each daemon leads its own).
    """

    def __init__(
        self,
        python: str,
        workers: int,
        cores: int,
        memory: str,
        base_dir: str | Path,
        start_timeout_s: float = 180.0,
        stop_timeout_s: float = 60.0,
    ) -> None:
        self.python = python
        self.workers, self.cores, self.memory = workers, cores, memory
        self.base_dir = Path(base_dir)
        self.start_timeout_s, self.stop_timeout_s = start_timeout_s, stop_timeout_s
        self.master_url: str | None = None
        self._process: subprocess.Popen | None = None
        self._log = self.base_dir / "cluster-cli.log"

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("ClusterProcess is not started")
        return self._process.pid

    def start(self) -> ClusterProcess:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")])),
        }
        command = [
            self.python,
            "-m",
            "pipelines.sweeps.standalone_cluster",
            "--workers",
            str(self.workers),
            "--cores",
            str(self.cores),
            "--memory",
            self.memory,
            "--dir",
            str(self.base_dir),
            "--timeout",
            str(self.start_timeout_s),
        ]
        with open(self._log, "ab") as log:
            self._process = subprocess.Popen(
                command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=env, cwd=REPO_ROOT
            )
        line = self._process.stdout.readline().decode("utf-8", "replace").strip()  # blocks until up or dead
        if not line.startswith("spark://"):
            self._process.wait(timeout=30)
            raise ClusterStartError(
                f"standalone cluster ({self.workers} workers x {self.cores} cores, {self.python})"
                f" did not start; log tail ({self._log}):\n{log_tail(self._log)}"
            )
        self.master_url = line
        return self

    def descendants(self) -> list[int]:
        """PIDs of everything the child started (Master, Workers, executors, Python workers)."""
        import psutil

        try:
            return [child.pid for child in psutil.Process(self.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def stop(self) -> None:
        if self._process is None or self._process.poll() is not None:
            return
        daemons = self.descendants()
        self._process.send_signal(signal.SIGTERM)
        try:
            self._process.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            for pid in daemons:  # only what this child started; daemons lead their own process groups
                try:
                    if os.getpgid(pid) == pid:
                        os.killpg(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            self._process.kill()
            self._process.wait()
        finally:
            if self._process.stdout:
                self._process.stdout.close()
        time.sleep(0.2)

    def __enter__(self) -> ClusterProcess:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()
