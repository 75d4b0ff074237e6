"""The streaming job against the batch job -> reports/stream.md, .json

    .venv/bin/python scripts/bench_stream.py [--images 500] [--landed 6] [--interval 5] [--repeats 2]

- Throughput: a backlog of `--images` bench images (scripts/bench/images.py) processed by the batch job and by
  `--available-now` (one micro-batch: stream.max_files_per_trigger 0), each on a new output, after a warm-up run,
  `--repeats` times, each first in turn, side by side on local[2] with the bundled model: the commands' wall
  seconds and the summaries' images/s.
- Latency: a `--stream --trigger-interval T` (`--interval`, seconds) on an empty input; `--landed` images moved in
  one at a time, each once the one before is in detections/; seconds from a file's rename into the input to its
  detections row (polled every 0.2 s). The goal: at most T + 10 s.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import pyarrow.parquet as pq  # noqa: E402
from bench.images import make_images  # noqa: E402
from bench.machine import cpu_isa, isa_text  # noqa: E402
from bench.report import write_report  # noqa: E402

JOB = [sys.executable, str(REPO / "jobs" / "infer_yolact.py"), "--master", "local[2]"]
ENV = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}


def timed_run(args: list[str]) -> dict:
    """One job command to its end: wall seconds and its summary."""
    started = time.monotonic()
    done = subprocess.run([*JOB, *args], env=ENV, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    if done.returncode:
        raise SystemExit(f"{' '.join(args)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    output = Path(args[args.index("--output") + 1])
    summary = json.loads((output / "summary.json").read_text())
    return {"wall_s": round(seconds, 2), "images_per_second": summary["images_per_second"], **summary["counts"]}


def detected(output: Path) -> set[str]:
    if not any((output / "detections").glob("*.parquet")):
        return set()
    return set(pq.read_table(output / "detections", columns=["path"]).column("path").to_pylist())


def latencies(sources: list[Path], work: Path, interval: str) -> list[float]:
    """Seconds from each file's landing to its detections row, one file at a time, in a running stream."""
    images, staging, output = work / "landing", work / "staging", work / "landing-out"
    for folder in (images, staging, output):
        shutil.rmtree(folder, ignore_errors=True)
    images.mkdir(parents=True)
    staging.mkdir(parents=True)
    args = ["--input", str(images), "--output", str(output), "--stream", "--trigger-interval", interval]
    job = subprocess.Popen([*JOB, *args], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seconds = []
    try:
        deadline = time.monotonic() + 300
        while not (output / "_sparkseg.lock").exists():  # the stream is up once it holds the output's lock
            if job.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the stream did not start (exit {job.returncode})")
            time.sleep(0.2)
        for number, source in enumerate(sources):
            name = f"landed{number:03d}.jpg"
            shutil.copy(source, staging / name)
            os.replace(staging / name, images / name)
            landed = time.monotonic()
            while not any(path.endswith("/" + name) for path in detected(output)):
                if job.poll() is not None or time.monotonic() > landed + 600:
                    raise SystemExit(f"{name}: no detections row (stream exit {job.returncode})")
                time.sleep(0.2)
            seconds.append(round(time.monotonic() - landed, 2))
        job.send_signal(signal.SIGTERM)
        if job.wait(timeout=300):
            raise SystemExit(f"the stream exited {job.returncode} on SIGTERM")
    finally:
        job.kill()
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--landed", type=int, default=6)
    parser.add_argument("--interval", type=float, default=5.0, help="the stream's trigger interval, seconds")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", default=str(REPO / "work" / "bench" / "stream"))
    parser.add_argument("--reports", default=str(REPO / "reports"))
    args = parser.parse_args()
    work = Path(args.work)
    backlog = make_images(work / f"backlog-{args.images}", args.images)
    config = work / "one_batch.yaml"
    config.write_text("stream:\n  max_files_per_trigger: 0\nrun:\n  progress_interval_s: 0\n")
    warm_up = make_images(work / "warm-up", 8)  # the model staged, the page cache warm: no first-run cost in a row
    shutil.rmtree(work / "out-warm-up", ignore_errors=True)
    timed_run(["--config", str(config), "--input", str(warm_up), "--output", str(work / "out-warm-up")])
    runs: dict[str, list[dict]] = {"batch job": [], "--available-now": []}
    jobs = [("batch job", []), ("--available-now", ["--available-now"])]
    for repeat in range(args.repeats):
        for name, extra in jobs if repeat % 2 == 0 else jobs[::-1]:  # each first in turn
            output = work / f"out-{len(runs[name])}-{'stream' if extra else 'batch'}"
            shutil.rmtree(output, ignore_errors=True)
            runs[name].append(
                timed_run(["--config", str(config), "--input", str(backlog), "--output", str(output), *extra])
            )
    interval_s = args.interval
    waits = latencies(sorted(backlog.glob("img_*.jpg"))[: args.landed], work, f"{interval_s:g}s")

    model, isa = cpu_isa()
    batch_wall = statistics.median(r["wall_s"] for r in runs["batch job"])
    lines = [
        "# Streaming against the batch job",
        "",
        f"- CPU: {model}, {os.cpu_count()} cores; instruction set: {isa_text(isa)}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "",
        f"`scripts/bench_stream.py --images {args.images} --landed {args.landed} --interval {interval_s:g} "
        f"--repeats {args.repeats}`: local[2], the bundled YOLACT, f32 or bf16 as `precision: auto` picks.",
        "",
        f"## Throughput over a backlog of {args.images} images (each run on a new output, alternated)",
        "",
        "| job | wall s (median) | images/s (summary, median) | wall vs the batch job |",
        "|---|---|---|---|",
    ]
    for name, rows in runs.items():
        wall = statistics.median(r["wall_s"] for r in rows)
        rate = statistics.median(r["images_per_second"] for r in rows)
        lines.append(f"| {name} | {wall:.2f} | {rate:.1f} | {wall / batch_wall:.2f}x |")
    stream_wall = statistics.median(r["wall_s"] for r in runs["--available-now"])
    lines += [
        "",
        f"- the stream's throughput / the batch job's (wall over the same images): {batch_wall / stream_wall:.3f} "
        f"(goal: within 10 %: {'met' if batch_wall / stream_wall >= 0.9 else 'NOT met'})",
        "",
        f"## Latency: a file's landing to its detections row (`--stream --trigger-interval {interval_s:g}s`)",
        "",
        f"- seconds, file by file: {', '.join(str(s) for s in waits)}",
        f"- median {statistics.median(waits):.2f} s, max {max(waits):.2f} s; goal: at most the interval + 10 s "
        f"({interval_s + 10:.0f} s): {'met' if max(waits) <= interval_s + 10 else 'NOT met'}",
    ]
    write_report(args.reports, "stream", {"runs": runs, "latency_s": waits}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
