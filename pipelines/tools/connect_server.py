"""A local Spark Connect server from this env's pyspark (what its sbin/start-connect-server.sh --wait runs: spark-submit
of the server class; the pyspark 4.0.0 wheel, Databricks Runtime 17.3 LTS's Spark, lacks that script), for the tests
and the benches: `sc://127.0.0.1:<port>` until the context exits.

    python -m pipelines.tools.connect_server [--port 15002] [--master 'local[2]']   # until Ctrl-C
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from pipelines.spark.spark_session import DEFAULT_CONF, log4j_config_path

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


@contextlib.contextmanager
def running_connect_server(
    logs: Path,
    workers_python: str = sys.executable,
    master: str = "local[2]",
    port: int | None = None,
    start_timeout_s: float = 180,
) -> Iterator[str]:
    """A Spark Connect server (spark-submit of SERVER_CLASS, the foreground of its own process group) on
    127.0.0.1 whose Python workers run `workers_python`, its log in `logs`; stopped (the group) on exit."""
    port = port or free_port()
    spark_submit = Path(sys.executable).parent / "spark-submit"
    conf = {
        **DEFAULT_CONF,
        "spark.connect.grpc.binding.address": "127.0.0.1",
        "spark.connect.grpc.binding.port": str(port),
        "spark.driver.host": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.driver.extraJavaOptions": f"-Dlog4j2.configurationFile=file:{log4j_config_path()}",
    }
    venv_bin = str(Path(sys.executable).parent)  # the launcher finds its SPARK_HOME with the python3 on PATH
    env = {**os.environ, "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.update(SPARK_LOG_DIR=str(logs), SPARK_LOCAL_IP="127.0.0.1", SPARK_CONNECT_MODE="0")  # a classic server
    env.update(PYSPARK_PYTHON=workers_python)
    env.pop("SPARK_HOME", None)
    arguments = [str(spark_submit), "--class", SERVER_CLASS, "--name", "Spark Connect server", "--master", master]
    for key, value in conf.items():
        arguments += ["--conf", f"{key}={value}"]
    with open(logs / "server.log", "wb") as log:
        server = subprocess.Popen(arguments, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + start_timeout_s
        while not answers(port):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the Spark Connect server did not start (exit {server.poll()}): {logs}/server.log")
            time.sleep(0.2)
        yield f"sc://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=60)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--port", type=int, default=15002)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="sparkseg-connect-") as logs:
        with running_connect_server(Path(logs), master=args.master, port=args.port) as remote:
            print(f"{remote} (Ctrl-C stops it)", flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
