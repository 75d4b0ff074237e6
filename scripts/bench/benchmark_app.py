"""OpenVINO's benchmark_app on one IR: the model-only ceiling every bench compares the project's code with."""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def benchmark_app_path() -> Path:
    """benchmark_app beside the interpreter (a venv), else on PATH (openvino installed with pip --target)."""
    beside = Path(sys.executable).with_name("benchmark_app")
    return beside if beside.exists() else Path(shutil.which("benchmark_app") or beside)


def run_benchmark_app(xml: Path, precision: str, streams: int, seconds: int) -> dict:
    """`streams` streams x 1 thread each, `-hint none`, inference precision `precision`, for `seconds`.

    images_per_s: benchmark_app's throughput; cpu_s_per_image: CPU seconds per inference of the child process,
    compile and warm-up included (a few % high), robust to other work on the machine, unlike img/s."""
    command = _command(xml, precision, streams, seconds)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    throughput = _throughput(done.returncode, done.stdout, done.stderr)
    median = re.search(r"Median:\s+([\d.]+)\s*ms", done.stdout)
    count = re.search(r"Count:\s+(\d+)\s*iterations", done.stdout)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    cpu_per_image = cpu / int(count.group(1)) if count else None
    return {
        "images_per_s": throughput,
        "median_ms": float(median.group(1)) if median else None,
        "cpu_s_per_image": round(cpu_per_image, 5) if cpu_per_image else None,
        "cpu_ms_per_image": round(1000 * cpu_per_image, 2) if cpu_per_image else None,
        "command": _shown(command),
    }


def run_benchmark_app_processes(xml: Path, precision: str, processes: int, seconds: int) -> dict:
    """benchmark_app as `processes` processes x 1 stream x 1 thread, all started at once (as the executors run the
    model: a process per task slot, each with its own compiled copy of the model), for `seconds` each. Threads not
    pinned (`-pin NO`, as the executors by default): each process would pin its thread to the same first core.

    images_per_s: the sum of the processes' throughputs (their runs overlap but for the compile's skew, a second or
    two against `seconds`); per_process: each one's."""
    command = _command(xml, precision, 1, seconds, ("-pin", "NO"))
    runs = [
        subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(processes)
    ]
    rates = []
    for run in runs:
        out, err = run.communicate(timeout=seconds + 300)
        rates.append(_throughput(run.returncode, out, err))
    return {"images_per_s": round(sum(rates), 2), "per_process": rates, "command": f"{processes} x {_shown(command)}"}


def _command(xml: Path, precision: str, streams: int, seconds: int, extra: tuple[str, ...] = ()) -> list[str]:
    """benchmark_app on the CPU: `streams` streams x 1 thread each, `-hint none`, `precision`, for `seconds`."""
    return [
        str(benchmark_app_path()),
        "-m",
        str(xml),
        "-d",
        "CPU",
        "-hint",
        "none",
        "-nstreams",
        str(streams),
        "-nthreads",
        str(streams),
        *extra,
        "-infer_precision",
        precision,
        "-t",
        str(seconds),
    ]


def _throughput(returncode: int, out: str, err: str) -> float:
    """benchmark_app's images/s from its output; a failed run raises with the output's end."""
    found = re.search(r"Throughput:\s+([\d.]+)\s*FPS", out)
    if returncode != 0 or not found:
        raise RuntimeError(f"benchmark_app failed (exit {returncode}): {out[-800:]}{err[-800:]}")
    return float(found.group(1))


def _shown(command: list[str]) -> str:
    """The command as the reports show it (paths under the repository relative)."""
    return " ".join(["benchmark_app", *command[1:]]).replace(str(REPO) + "/", "")
