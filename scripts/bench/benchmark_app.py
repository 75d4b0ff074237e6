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
    command = [str(benchmark_app_path()), "-m", str(xml), "-d", "CPU", "-hint", "none", "-nstreams", str(streams),
               "-nthreads", str(streams), "-infer_precision", precision, "-t", str(seconds)]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 300)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    found = re.search(r"Throughput:\s+([\d.]+)\s*FPS", done.stdout)
    median = re.search(r"Median:\s+([\d.]+)\s*ms", done.stdout)
    count = re.search(r"Count:\s+(\d+)\s*iterations", done.stdout)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"benchmark_app failed (exit {done.returncode}): {done.stdout[-800:]}{done.stderr[-800:]}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    cpu_per_image = cpu / int(count.group(1)) if count else None
    return {"images_per_s": float(found.group(1)), "median_ms": float(median.group(1)) if median else None,
            "cpu_s_per_image": round(cpu_per_image, 5) if cpu_per_image else None,
            "cpu_ms_per_image": round(1000 * cpu_per_image, 2) if cpu_per_image else None,
            "command": " ".join(["benchmark_app", *command[1:]]).replace(str(REPO) + "/", "")}
