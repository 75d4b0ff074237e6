"""A Spark standalone cluster (one Master, N Workers) on 127.0.0.1, for tests, demos and fault drills.

The pyspark wheel ships `bin/spark-class` but no `sbin/start-*.sh`, so the daemons are started directly:

    with StandaloneCluster(ClusterConfig(workers=2, cores=1, memory="1g"), base_dir="/tmp/sc") as cluster:
        spark = SparkSession.builder.master(cluster.master_url)...

Ports are picked free at run time; each daemon logs to `<base_dir>/logs/<name>.log` and each Worker works in
`<base_dir>/work/worker-<i>`. `stop()` ends only the processes this object started (and their children, which live
in the daemon's own process group) and runs on `with` exit and at interpreter exit.

CLI: `python -m pipelines.sweeps.standalone_cluster --workers 2 --cores 1 --memory 2g` prints the master URL and waits
for Ctrl-C.
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.errors import SparkSegError
from pipelines.spark.jvm_class_archive import QUICK_START_JIT, driver_java_options

HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"


@dataclass
class ClusterConfig:
    """Shape of the cluster. `memory` is a JVM size string ("1g", "512m") offered by each Worker to executors."""

    workers: int = 2
    cores: int = 1
    memory: str = "1g"
    start_timeout_s: float = 120.0
    stop_timeout_s: float = 20.0
    python: str = field(default_factory=lambda: sys.executable)
    daemon_memory: str = "512m"  # heap of the Master/Worker JVMs themselves (SPARK_DAEMON_MEMORY)

    def __post_init__(self):
        if self.workers < 1:
            raise ValueError(f"ClusterConfig.workers must be >= 1, got {self.workers}")
        if self.cores < 1:
            raise ValueError(f"ClusterConfig.cores must be >= 1, got {self.cores}")
        if not self.memory or not self.memory[:-1].isdigit() or self.memory[-1].lower() not in "kmgt":
            raise ValueError(f"ClusterConfig.memory must look like '512m' or '2g', got {self.memory!r}")


class ClusterStartError(SparkSegError, RuntimeError):
    """A daemon did not come up; the message carries the tail of its log."""


@dataclass
class _Daemon:
    """A started daemon. It is reaped only in stop(): until then its PID, which is also its process group id,
    cannot be reused, so signals sent to either reach only what this cluster started."""

    name: str
    process: subprocess.Popen
    log_path: Path

    def exit_code(self) -> int | None:
        """The exit code once the process ended (it stays a zombie, unreaped), else None."""
        if self.process.returncode is not None:
            return self.process.returncode
        try:
            info = os.waitid(os.P_PID, self.process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped already
            return self.process.returncode if self.process.returncode is not None else -1
        if info is None:
            return None
        return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status

    def signal(self, signum: int) -> None:
        if self.exit_code() is None:
            os.kill(self.process.pid, signum)

    def wait_exit(self, timeout_s: float | None) -> bool:
        """Wait (without reaping) until the process ended; False on timeout."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self.exit_code() is None:
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    def reap(self) -> None:
        """SIGKILL what is left in the process group (executors, Python workers), then reap the daemon."""
        self.signal(signal.SIGKILL)
        self.wait_exit(None)
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self.process.wait()


def spark_home() -> Path:
    """The pyspark package directory, which is a SPARK_HOME (bin/spark-class, jars/)."""
    import pyspark

    return Path(pyspark.__file__).resolve().parent


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def log_tail(path: Path, lines: int = 40) -> str:
    """The last `lines` lines of a log file, or a note that it is missing."""
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return f"(no log at {path})"
    return "\n".join(text.splitlines()[-lines:])


class StandaloneCluster:
    """One Master and `config.workers` Workers on 127.0.0.1. Use as a context manager or call start()/stop().

    One-shot: after stop() it cannot be started again.
    """

    def __init__(self, config: ClusterConfig | None = None, base_dir: str | os.PathLike | None = None):
        self.config = config or ClusterConfig()
        self.base_dir = Path(base_dir or tempfile.mkdtemp(prefix="sparkseg-standalone-")).resolve()
        self.master_port: int | None = None
        self.webui_port: int | None = None
        self._master: _Daemon | None = None
        self._workers: list[_Daemon] = []
        self._stopped = False

    # ---- public API -------------------------------------------------------------------------------------------

    @property
    def master_url(self) -> str:
        """`spark://127.0.0.1:<port>`; valid after start()."""
        self._require_started()
        return f"spark://{HOST}:{self.master_port}"

    @property
    def webui_url(self) -> str:
        self._require_started()
        return f"http://{HOST}:{self.webui_port}"

    @property
    def master_pid(self) -> int:
        self._require_started()
        return self._master.process.pid

    @property
    def worker_pids(self) -> list[int]:
        """PIDs of the Worker JVMs, in start order (index i is worker i)."""
        return [worker.process.pid for worker in self._workers]

    @property
    def pids(self) -> list[int]:
        """Every daemon PID this cluster started (Master first)."""
        return ([self._master.process.pid] if self._master else []) + self.worker_pids

    def worker_dir(self, index: int) -> Path:
        """Work dir of worker `index`: executors run in `<worker_dir>/<app-id>/<executor-id>`."""
        return self.base_dir / "work" / f"worker-{index}"

    @property
    def log_dir(self) -> Path:
        return self.base_dir / "logs"

    def start(self) -> StandaloneCluster:
        """Start the Master, then the Workers; return once every Worker is registered ALIVE."""
        if self._master is not None or self._stopped:
            raise RuntimeError("StandaloneCluster.start() called twice; make a new StandaloneCluster")
        atexit.register(self.stop)
        try:
            self._start_master()
            for index in range(self.config.workers):
                self._start_worker(index)
            self._wait_for_workers(self.config.workers)
        except BaseException:
            self.stop()
            raise
        return self

    def master_state(self) -> dict:
        """The Master's JSON status (`/json/`): workers, apps, cores, memory."""
        # No proxy: an http_proxy in the environment must not intercept 127.0.0.1.
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"{self.webui_url}/json/", timeout=5) as response:
            return json.loads(response.read().decode("utf-8"))

    def alive_workers(self) -> int:
        return sum(1 for worker in self.master_state().get("workers", []) if worker.get("state") == "ALIVE")

    def kill_worker(self, index: int) -> int:
        """SIGKILL worker `index`'s JVM (a crash, for fault tests). Its executors exit when they lose it.

        Returns the killed PID.
        """
        if not 0 <= index < len(self._workers):
            raise IndexError(f"worker index {index} out of range: this cluster has {len(self._workers)} workers")
        worker = self._workers[index]
        worker.signal(signal.SIGKILL)
        worker.wait_exit(self.config.stop_timeout_s)
        return worker.process.pid

    def stop(self) -> None:
        """End every process this cluster started: SIGTERM, then SIGKILL after `stop_timeout_s`. Idempotent."""
        atexit.unregister(self.stop)
        if self._stopped:
            return
        self._stopped = True
        daemons = list(reversed(self._workers)) + ([self._master] if self._master else [])
        for daemon in daemons:
            daemon.signal(signal.SIGTERM)  # Workers stop their executors on TERM
        deadline = time.monotonic() + self.config.stop_timeout_s
        for daemon in daemons:
            daemon.wait_exit(max(0.0, deadline - time.monotonic()))
        for daemon in daemons:
            daemon.reap()

    def __enter__(self) -> StandaloneCluster:
        return self.start()

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = f"master={self.master_url}" if self._master else "not started"
        return f"StandaloneCluster({state}, workers={self.config.workers}, base_dir={str(self.base_dir)!r})"

    # ---- internals --------------------------------------------------------------------------------------------

    def _require_started(self) -> None:
        if self._master is None:
            raise RuntimeError("StandaloneCluster is not started: use `with StandaloneCluster(...)` or call start()")

    def _daemon_env(self, java_opts_key: str) -> dict:
        env = dict(os.environ)
        env.update(
            SPARK_HOME=str(spark_home()),
            SPARK_LOCAL_IP=HOST,
            PYSPARK_PYTHON=self.config.python,
            SPARK_DAEMON_MEMORY=self.config.daemon_memory,
            SPARK_LOG_DIR=str(self.log_dir),
            SPARK_WORKER_DIR=str(self.base_dir / "work"),
        )
        # A fixed port that is taken must fail loudly, not silently move to port+1 (we would poll the wrong one).
        # The REST submission server would bind the fixed port 6066: off, so that clusters can run side by side.
        extra = " -Dspark.port.maxRetries=0 -Dspark.master.rest.enabled=false"
        env[java_opts_key] = (env.get(java_opts_key, "") + extra).strip()
        # Every JVM of this cluster starts like a local job's driver: this env's class archive (the same jars) and C1
        # only. JDK_JAVA_OPTIONS reaches the daemons and the executors a Worker starts (they inherit its environment):
        # an executor of a short job then spends far less CPU starting. An application's own
        # spark.executor.extraJavaOptions come later on the executor's command line, and win.
        quick_start = f"{driver_java_options()} {QUICK_START_JIT}".strip()
        env["JDK_JAVA_OPTIONS"] = f"{env.get('JDK_JAVA_OPTIONS', '')} {quick_start}".strip()
        return env

    def _spawn(self, name: str, args: list[str], env: dict) -> _Daemon:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            process = subprocess.Popen(
                [str(spark_home() / "bin" / "spark-class"), *args],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=self.base_dir,
                start_new_session=True,  # own process group: stop() can reap its executors too
            )
        return _Daemon(name, process, log_path)

    def _start_master(self) -> None:
        attempts = 3
        for attempt in range(attempts):
            self.master_port, self.webui_port = free_port(), free_port()
            args = [MASTER_CLASS, "--host", HOST, "--port", str(self.master_port), "--webui-port", str(self.webui_port)]
            master = self._spawn("master", args, self._daemon_env("SPARK_MASTER_OPTS"))
            self._master = master
            try:
                self._wait_until(lambda: self._master_answers(), what="the Master web UI to answer", daemon=master)
                return
            except ClusterStartError:
                # Most likely a port grabbed between free_port() and bind: try fresh ports.
                if master.exit_code() is None or attempt == attempts - 1:
                    raise
                master.reap()
                self._master = None

    def _start_worker(self, index: int) -> None:
        work_dir = self.worker_dir(index)
        work_dir.mkdir(parents=True, exist_ok=True)
        args = [
            WORKER_CLASS,
            "--host",
            HOST,
            "--cores",
            str(self.config.cores),
            "--memory",
            self.config.memory,
            "--webui-port",
            str(free_port()),
            "--work-dir",
            str(work_dir),
            self.master_url,
        ]
        self._workers.append(self._spawn(f"worker-{index}", args, self._daemon_env("SPARK_WORKER_OPTS")))

    def _master_answers(self) -> bool:
        try:
            return self.master_state().get("status") == "ALIVE"
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            return False

    def _wait_for_workers(self, count: int) -> None:
        def registered() -> bool:
            for worker in self._workers:
                if worker.exit_code() is not None:
                    raise ClusterStartError(
                        f"{worker.name} exited with code {worker.exit_code()} "
                        f"before registering; log tail ({worker.log_path}):\n"
                        f"{log_tail(worker.log_path)}"
                    )
            try:
                return self.alive_workers() >= count
            except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
                return False

        self._wait_until(
            registered,
            what=f"{count} workers to register with the Master",
            daemon=self._master,
            extra_logs=[worker.log_path for worker in self._workers],
        )

    def _wait_until(self, condition, what: str, daemon: _Daemon, extra_logs: list[Path] = ()) -> None:
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if condition():
                return
            if daemon.exit_code() is not None:
                raise ClusterStartError(
                    f"{daemon.name} exited with code {daemon.exit_code()} while waiting "
                    f"for {what}; log tail ({daemon.log_path}):\n{log_tail(daemon.log_path)}"
                )
            time.sleep(0.5)
        tails = "\n".join(f"--- {path}:\n{log_tail(path)}" for path in [daemon.log_path, *extra_logs])
        raise ClusterStartError(
            f"timed out after {self.config.start_timeout_s:.0f}s waiting for {what}; "
            f"raise ClusterConfig.start_timeout_s on a slow machine. Log tails:\n{tails}"
        )


def process_running(pid: int) -> bool:
    """True when `pid` names a running process, not a zombie (unlike run_lock.process_alive, pid reuse is not
    checked: the cluster's own daemons are its children)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def process_group_members(pgid: int) -> list[int]:
    """PIDs of live processes whose process group is `pgid` (Linux /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(entry))
    return members


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run a Spark standalone cluster on 127.0.0.1 until Ctrl-C.")
    parser.add_argument("--workers", type=int, default=2, help="number of Worker daemons (default 2)")
    parser.add_argument("--cores", type=int, default=1, help="cores each Worker offers (default 1)")
    parser.add_argument("--memory", default="2g", help="memory each Worker offers, e.g. 2g (default 2g)")
    parser.add_argument("--dir", default=None, help="base dir for logs and work dirs (default: a new temp dir)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for start-up (default 120)")
    args = parser.parse_args(argv)

    config = ClusterConfig(workers=args.workers, cores=args.cores, memory=args.memory, start_timeout_s=args.timeout)
    # Ctrl-C and SIGTERM (kill, CI timeouts) only set a flag, from before the cluster starts: a signal at any
    # moment (during start-up, right after the URL is printed) ends the cluster cleanly, never half-way.
    stop_requested = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop_requested.set())
    with StandaloneCluster(config, base_dir=args.dir) as cluster:
        if not stop_requested.is_set():
            print(cluster.master_url, flush=True)
            print(f"web UI {cluster.webui_url}  logs {cluster.log_dir}  (Ctrl-C to stop)", file=sys.stderr, flush=True)
        stop_requested.wait()
        print("stopping", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
