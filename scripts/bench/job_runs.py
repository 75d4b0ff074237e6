"""The inference job as a subprocess, timed from the command (bench_startup, bench_executor)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PROGRESS = re.compile(r"\[sparkseg\] \d+/\d+ images")
# The lines (stderr, unbuffered) that end the job's first phases (pipelines.inference.inference_job.run_plan):
# `listing` when the session is up and the listing starts, `planned` when the to-do is counted
PHASE_LINES = {
    "listing": re.compile(r"\[sparkseg\] run \S+: listing "),
    "planned": re.compile(r"\[sparkseg\] \d+ (images, |files \()"),
}


def run_job(args: list[str], timeout_s: float = 900) -> dict:
    """One `python jobs/infer_yolact.py ARGS`: wall seconds (until the command exits, as a shell times it),
    seconds to the first progress line, lines printed, summary.json; `output_closed_s`, when its output pipe
    closed: the Spark driver JVM it started holds the pipe until its own shutdown, which ends after the command; and
    `marks`, seconds from the command to the first line of each PHASE_LINES and to the last progress line
    (`finished`: every image done and written)."""
    command = [sys.executable, str(REPO / "jobs" / "infer_yolact.py"), *args]
    started = time.monotonic()
    marks: dict[str, float] = {}
    phases: dict[str, float] = {}
    lines: list[str] = []

    def read(stream) -> None:
        for line in stream:
            lines.append(line.rstrip("\n"))
            now = time.monotonic() - started
            if PROGRESS.search(line):
                marks.setdefault("first_progress_s", now)
                phases["finished"] = now
            for name, pattern in PHASE_LINES.items():
                if name not in phases and pattern.search(line):
                    phases[name] = now
        marks["output_closed_s"] = time.monotonic() - started

    with subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        reader = threading.Thread(target=read, args=(proc.stdout,), daemon=True)
        reader.start()
        code = proc.wait(timeout=timeout_s)
        wall = time.monotonic() - started
        reader.join(timeout=60)  # the JVM's shutdown is short; a stuck one must not hang the bench
    if code != 0:
        raise SystemExit(f"error: {' '.join(command)} exited {code}:\n" + "\n".join(lines[-30:]))
    output = Path(args[args.index("--output") + 1])
    summary = json.loads((output / "summary.json").read_text())
    if summary["counts"]["failed"]:
        raise SystemExit(
            f"error: {summary['counts']['failed']} bench images failed in {' '.join(command)} (their "
            f"errors: {output / 'errors'}): a rate over failed images measures nothing"
        )
    return {
        "wall_s": wall,
        "first_progress_s": marks.get("first_progress_s"),
        "output_closed_s": marks.get("output_closed_s"),
        "lines": len(lines),
        "summary": summary,
        "marks": phases,
    }


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
        runs[name] = {
            "images": len(list(Path(images).glob("*.jpg"))),
            "wall_s": round(result["wall_s"], 2),
            "done": counts["done"],
            "instances": counts["instances"],
        }
        shutil.rmtree(output, ignore_errors=True)
    extra = runs["large"]["images"] - runs["small"]["images"]
    seconds = runs["large"]["wall_s"] - runs["small"]["wall_s"]
    return {
        **runs,
        "jvm_class_archive": jvm_class_archive_built(),
        "images_per_s": round(extra / seconds, 3) if seconds > 0 else None,
        "fixed_s": round(runs["small"]["wall_s"] - runs["small"]["images"] * seconds / extra, 2)
        if seconds > 0
        else None,
        "args": job_args,
    }


def jvm_class_archive_built() -> bool:
    """Whether the jobs' driver JVMs map this env's class archive (`make jvm-archive`; every bench target builds it):
    without it a job's fixed cost is higher (`make bench-startup`: reports/startup.md, `JVM defaults`)."""
    from pipelines.spark.jvm_class_archive import built_archive

    return built_archive() is not None
