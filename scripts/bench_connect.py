"""The job on a Spark Connect session against the classic session -> reports/connect.md, .json

    .venv/bin/python scripts/bench_connect.py [--images 200] [--repeats 2]

Side by side in one run, on local[2] with the bundled model: the classic job (`python jobs/infer_yolact.py
--master local[2]`, its own JVM) and the job from the JVM-less client env (make client-env) with `--remote` against
a local[2] Spark Connect server started once before (its JVM up: a Connect client does not pay for it). Each kind
runs a 1-image input (the fixed cost: the command's wall seconds) and a `--images` input (the throughput: images
per second: the summary's, and of the extra images, (N - 1) / (wall_N - wall_1)), alternated, each
first in turn, after a warm-up run of each over the `--images` input. Goals: Connect's throughput within 5 % of classic's, its fixed cost at
most 3 s above classic's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench.images import make_images  # noqa: E402
from bench.machine import cpu_isa, isa_text  # noqa: E402
from bench.report import write_report  # noqa: E402

from pipelines.tools.connect_server import running_connect_server  # noqa: E402

SCRIPT = str(REPO / "jobs" / "infer_yolact.py")
CLIENT_PYTHON = REPO / ".venv-client" / "bin" / "python"
ENV = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}


def timed_run(command: list[str], images: Path, output: Path) -> dict:
    """One job command to its end on a new output: wall seconds and the summary's images/s."""
    shutil.rmtree(output, ignore_errors=True)
    quiet = output.parent / "quiet.yaml"
    quiet.write_text("run:\n  progress_interval_s: 0\n")
    args = ["--config", str(quiet), "--input", str(images), "--output", str(output)]
    started = time.monotonic()
    done = subprocess.run([*command, *args], env=ENV, capture_output=True, text=True, timeout=3600)
    seconds = time.monotonic() - started
    if done.returncode:
        raise SystemExit(f"{' '.join(command)}: exit {done.returncode}\n{done.stderr[-3000:]}")
    summary = json.loads((output / "summary.json").read_text())
    return {"wall_s": round(seconds, 2), "images_per_second": summary["images_per_second"], **summary["counts"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", default=str(REPO / "work" / "bench" / "connect"))
    parser.add_argument("--reports", default=str(REPO / "reports"))
    args = parser.parse_args()
    if not CLIENT_PYTHON.exists():
        raise SystemExit(f"{CLIENT_PYTHON}: no client env; run make client-env first")
    work = Path(args.work)
    many = make_images(work / f"images-{args.images}", args.images)
    one = work / "images-1"
    one.mkdir(parents=True, exist_ok=True)
    shutil.copy(sorted(many.glob("img_*.jpg"))[0], one / "img_00000.jpg")
    runs: dict[str, dict[str, list[dict]]] = {"classic": {"1": [], "N": []}, "connect": {"1": [], "N": []}}
    with tempfile.TemporaryDirectory(prefix="sparkseg-connect-bench-") as logs:
        with running_connect_server(Path(logs)) as remote:
            commands = {
                "classic": [sys.executable, SCRIPT, "--master", "local[2]"],
                "connect": [str(CLIENT_PYTHON), SCRIPT, "--remote", remote],
            }
            # warm-up over the large input: the model staged, the page cache warm, and the server's JVM past its JIT
            # compiles of the run's hot paths, as a server that has run jobs before is (a classic run's JVM is new)
            for kind, command in commands.items():
                timed_run(command, many, work / f"out-warm-up-{kind}")
            for repeat in range(args.repeats):
                order = list(commands) if repeat % 2 == 0 else list(commands)[::-1]
                for kind in order:
                    for size, images in (("1", one), ("N", many)):
                        output = work / f"out-{kind}-{size}-{repeat}"
                        runs[kind][size].append(timed_run(commands[kind], images, output))

    def median(kind: str, size: str, key: str) -> float:
        return round(statistics.median(r[key] for r in runs[kind][size]), 3)

    figures = {}
    for kind in runs:
        fixed, wall = median(kind, "1", "wall_s"), median(kind, "N", "wall_s")
        figures[kind] = {
            "fixed_s": fixed,
            "wall_s": wall,
            "throughput": round((args.images - 1) / (wall - fixed), 2) if wall > fixed else None,
            "summary_images_per_second": median(kind, "N", "images_per_second"),
        }
    rate = "summary_images_per_second"  # the run's own rate over its images: no start-up in it
    ratio = figures["connect"][rate] / figures["classic"][rate]
    extra = figures["connect"]["fixed_s"] - figures["classic"]["fixed_s"]
    walls = figures["classic"]["wall_s"] / figures["connect"]["wall_s"]
    model, isa = cpu_isa()
    lines = [
        "# Spark Connect against the classic session",
        "",
        f"- CPU: {model}, {os.cpu_count()} cores; instruction set: {isa_text(isa)}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "",
        f"`scripts/bench_connect.py --images {args.images} --repeats {args.repeats}`: local[2], the bundled YOLACT; "
        "medians over the repeats, each kind first in turn.",
        "",
        "| session | fixed cost s (1 image) | wall s | throughput img/s ((N-1) / (wall - fixed)) | summary img/s |",
        "|---|---|---|---|---|",
    ]
    for kind, row in figures.items():
        lines.append(
            f"| {kind} | {row['fixed_s']} | {row['wall_s']} | {row['throughput']} | {row['summary_images_per_second']} |"
        )
    lines += [
        "",
        f"- Connect's throughput / classic's (summary img/s): {ratio:.3f} (goal >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})",
        f"- Connect's fixed cost - classic's: {extra:+.2f} s (goal <= 3 s: {'met' if extra <= 3 else 'NOT met'}; the "
        "classic run starts its JVM, the Connect client finds the server's running)",
        f"- The {args.images}-image run's wall, classic's / Connect's: {walls:.3f} (the whole run, start-up included; "
        "(N-1) / (wall - fixed) charges Connect for the JVM start it does not pay, so it reads lower there)",
    ]
    write_report(args.reports, "connect", {"runs": runs, "figures": figures}, lines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
