"""The inference job as a subprocess, timed from the command (bench_startup, bench_executor)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRESS = re.compile(r"\[sparkseg\] \d+/\d+ images")


def run_job(args: list[str], timeout_s: float = 900) -> dict:
    """One `python jobs/infer_yolact.py ARGS`: wall seconds, seconds to the first progress line, lines printed,
    summary.json."""
    command = [sys.executable, str(REPO / "jobs" / "infer_yolact.py"), *args]
    started = time.monotonic()
    first_progress, lines = None, []
    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:   # ends when the job exits (its output pipe closes); the wait below is bounded
            lines.append(line.rstrip("\n"))
            if first_progress is None and PROGRESS.search(line):
                first_progress = time.monotonic() - started
        code = proc.wait(timeout=timeout_s)
    wall = time.monotonic() - started
    if code != 0:
        raise SystemExit(f"error: {' '.join(command)} exited {code}:\n" + "\n".join(lines[-30:]))
    output = Path(args[args.index("--output") + 1])
    summary = json.loads((output / "summary.json").read_text())
    return {"wall_s": wall, "first_progress_s": first_progress, "lines": len(lines), "summary": summary}


def marginal_throughput(small_dir: Path, large_dir: Path, scratch: Path, job_args: list[str]) -> dict:
    """The job's images/s once its fixed cost (JVM, listing, planning, worker start, model compile, summary) is
    subtracted: the job run over `small_dir` and over `large_dir` (fresh outputs, same arguments), and
    (large images - small images) / (large wall - small wall)."""
    runs = {}
    for name, images in (("small", small_dir), ("large", large_dir)):
        output = scratch / f"job-{name}"
        shutil.rmtree(output, ignore_errors=True)
        result = run_job(["--input", str(images), "--output", str(output), *job_args])
        counts = result["summary"]["counts"]
        runs[name] = {"images": len(list(Path(images).glob("*.jpg"))), "wall_s": round(result["wall_s"], 2),
                      "done": counts["done"], "failed": counts["failed"], "instances": counts["instances"]}
        shutil.rmtree(output, ignore_errors=True)
    extra = runs["large"]["images"] - runs["small"]["images"]
    seconds = runs["large"]["wall_s"] - runs["small"]["wall_s"]
    return {**runs, "images_per_s": round(extra / seconds, 3) if seconds > 0 else None,
            "fixed_s": round(runs["small"]["wall_s"] - runs["small"]["images"] * seconds / extra, 2)
            if seconds > 0 else None, "args": job_args}
