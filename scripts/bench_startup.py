"""The job's own cost (issue 14's goals), each configuration run alternately in one session -> reports/startup.md, .json

    .venv/bin/python scripts/bench_startup.py [--repeats 3] [--images 200] [--history-runs 100] [--configs A,B]

Cases, each a plain `python jobs/infer_yolact.py` (local[*], the JVM started by the job) timed from the command:
- demo: conf/demo.yaml on its 9 synthetic road images (`make demo` and `make bench-startup` make them): seconds to
  the first "n/N images" progress line, wall seconds until the command exits (as a shell times it), lines printed,
  and when its output closed (the driver JVM it started holds the pipe until its own shutdown ends, after the
  command);
- 200 images (scripts/bench/images.py, 480-800 px JPEGs, the bundled model): wall, and overhead = wall minus the
  model's stage seconds (summary.json, summed over tasks) divided by the cores that ran them in parallel, split into
  phases by when the job's own lines appear (run_phases);
- worker start: a fresh local[2] session's first Python job (mapInPandas, 2 tasks) minus the same job run again
  (the Python worker daemon's and workers' start);
- empty incremental: the same 200-image job again with nothing new, on an output holding `--history-runs` earlier
  runs (the first run's rows re-written as that many runs' Parquet files), twice: the first may rebuild the counts
  index, the second is the steady state; and on an output holding one run.
Configurations of the driver JVM the job starts: `quick start` = the job's default (this env's class archive,
pipelines.spark.jvm_class_archive, built if missing; C1 JIT only), `archive, C2` = the archive with the default tiered JIT,
`JVM defaults` = neither (the JDK's own class archive only); `Spark's Python daemon` = quick start with Spark's
own Python worker daemon instead of the job's local one (spark_session.local_daemon_settings). Medians over
`--repeats`; the machine's CPU and instruction sets in the header.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench import images as bench_images  # noqa: E402
from bench.job_runs import run_job  # noqa: E402
from bench.machine import cpu_isa, isa_text  # noqa: E402

CONFIGS = {  # the driver JVM's flags: a caller's own CDS or JIT flags replace the job's (spark_session.quick_start_options)
    "quick start": [],
    "archive, C2": ["--conf", "spark.driver.extraJavaOptions=-XX:+TieredCompilation"],
    "JVM defaults": ["--conf", "spark.driver.extraJavaOptions=-Xshare:auto -XX:+TieredCompilation"],
    # the job's default JVM with Spark's own Python worker daemon (pyspark from pyspark.zip's sources) instead of
    # sparkseg_local_daemon (spark_session.local_daemon_settings)
    "Spark's Python daemon": ["--conf", "spark.python.daemon.module=pyspark.daemon"],
}


def model_seconds(summary: dict) -> float:
    """The model's work in the run (summed stage seconds over tasks) spread over the partitions run at once."""
    parallel = max(1, min(int(summary["partitions"]), os.cpu_count() or 1))
    return sum(summary["stage_seconds"].values()) / parallel


def fake_history(output: Path, runs: int) -> None:
    """Re-write detections/ of a one-run output as `runs` runs' files (its rows dealt out in order, run ids and file
    names as the job makes them): the same images, recorded over many earlier runs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table_dir = output / "detections"
    table = pq.read_table(table_dir)
    for old in table_dir.glob("*.parquet"):
        old.unlink()
    per_run = -(-table.num_rows // runs)
    for number in range(runs):
        chunk = table.slice(number * per_run, per_run)
        if chunk.num_rows == 0:
            break
        run_id = f"20260101T{number // 60:02d}{number % 60:02d}00Z-{number:08x}"
        chunk = chunk.set_column(chunk.schema.get_field_index("run_id"), "run_id", pa.array([run_id] * chunk.num_rows))
        pq.write_table(chunk, table_dir / f"part-{run_id}-w00000-c000.snappy.parquet", coerce_timestamps="us")
    (output / "_sparkseg_counts.json").unlink(missing_ok=True)


# A session started as a job starts it (local[2], the configuration's settings): one plain Spark job, then the same
# Python job (mapInPandas over 2 partitions) twice; the first pays for starting the Python workers, the second does not.
FIRST_PYTHON_TASK = """
import json, sys, time
from pipelines.spark.spark_session import local_session
spark = local_session("bench-worker-start", "local[2]", json.loads(sys.argv[1]))
spark.range(4).count()
def same(batches):
    yield from batches
walls = []
for _ in range(2):
    started = time.monotonic()
    spark.range(0, 2, numPartitions=2).mapInPandas(same, "id long").collect()
    walls.append(time.monotonic() - started)
spark.stop()
print(json.dumps(walls))
"""


def run_phases(run: dict) -> dict:
    """Where a run's wall time goes, from the lines it printed (job_runs.PHASE_LINES): start-up (imports, JVM,
    session), listing and resume planning, the inference span (executor warm-up, the waves' planning, tasks and
    writes) beyond the model's seconds, and the end (summary, table counts, SparkContext.stop, exit)."""
    marks = run["marks"]
    if not {"listing", "planned", "finished"} <= marks.keys():
        return {}
    inference = marks["finished"] - marks["planned"]
    return {
        "phase_start_s": marks["listing"],
        "phase_listing_s": marks["planned"] - marks["listing"],
        "phase_inference_s": inference,
        "phase_inference_beyond_model_s": inference - model_seconds(run["summary"]),
        "phase_end_s": run["wall_s"] - marks["finished"],
    }


def conf_of(extra: list[str]) -> dict:
    """The Spark settings of a configuration's `--conf KEY=VALUE` arguments."""
    return dict(value.split("=", 1) for flag, value in zip(extra, extra[1:]) if flag == "--conf")


def python_worker_start_s(extra: list[str]) -> float:
    """Seconds the first Python job of a fresh local[2] session takes beyond the same job once the workers run."""
    done = subprocess.run(
        [sys.executable, "-c", FIRST_PYTHON_TASK, json.dumps(conf_of(extra))],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise SystemExit(f"error: the worker start-up probe failed:\n{done.stderr[-3000:]}")
    first, again = json.loads(done.stdout.strip().splitlines()[-1])
    return first - again


def measure(args) -> list[dict]:
    work = Path(args.work)
    demo_conf = REPO / "conf" / "demo.yaml"
    if not (REPO / "work" / "demo" / "roads" / "images").is_dir():
        raise SystemExit("error: no demo images under work/demo/roads: run `make bench-startup` (it generates them)")
    images = bench_images.make_images(work / f"images-{args.images}", args.images)
    rows = []
    for repeat in range(args.repeats):
        for name in args.configs:
            extra = CONFIGS[name]
            out = work / "out"
            shutil.rmtree(out, ignore_errors=True)
            demo = run_job(["--config", str(demo_conf), "--output", str(out / "demo"), *extra])
            first = run_job(["--input", str(images), "--output", str(out / "many"), *extra])
            once = run_job(["--input", str(images), "--output", str(out / "many"), *extra])
            fake_history(out / "many", args.history_runs)
            after_history = [run_job(["--input", str(images), "--output", str(out / "many"), *extra]) for _ in range(2)]
            worker_start = python_worker_start_s(extra)
            row = {
                "config": name,
                "repeat": repeat,
                "python_worker_start_s": worker_start,
                "demo_first_progress_s": demo["first_progress_s"],
                "demo_wall_s": demo["wall_s"],
                "demo_output_closed_s": demo["output_closed_s"],
                "demo_lines": demo["lines"],
                "demo_model_s": model_seconds(demo["summary"]),
                "images": args.images,
                "run_wall_s": first["wall_s"],
                "run_model_s": model_seconds(first["summary"]),
                "run_overhead_s": first["wall_s"] - model_seconds(first["summary"]),
                **run_phases(first),
                "empty_after_1_run_s": once["wall_s"],
                "empty_after_history_first_s": after_history[0]["wall_s"],
                "empty_after_history_s": after_history[1]["wall_s"],
                "history_runs": args.history_runs,
                "load_1min": os.getloadavg()[0],
            }
            print(json.dumps(row), flush=True)
            rows.append(row)
    return rows


def report(rows: list[dict], args) -> str:
    model, isa = cpu_isa()
    fields = [
        ("python_worker_start_s", "a session's first Python job beyond the same job again, local[2]: s"),
        ("demo_first_progress_s", "demo: first progress line s"),
        ("demo_wall_s", "demo: wall s (until the command exits)"),
        ("demo_output_closed_s", "demo: its output closed s (the driver JVM's shutdown, after the command)"),
        ("demo_lines", "demo: lines printed"),
        ("run_wall_s", f"{args.images} images: wall s"),
        ("run_model_s", f"{args.images} images: model s (stage s / parallel tasks)"),
        ("run_overhead_s", f"{args.images} images: overhead s"),
        ("phase_start_s", "  of which start-up: imports, JVM, session (to the listing line) s"),
        ("phase_listing_s", "  of which listing and resume planning (to the 'N images, M to do' line) s"),
        (
            "phase_inference_beyond_model_s",
            "  of which inference span beyond the model s (warm-up, planning, Spark and Arrow per image, writes)",
        ),
        ("phase_end_s", "  of which end: summary, table counts, SparkContext.stop, exit s"),
        ("empty_after_1_run_s", "empty incremental after 1 run: wall s"),
        ("empty_after_history_first_s", f"empty incremental after {args.history_runs} runs, first: wall s"),
        ("empty_after_history_s", f"empty incremental after {args.history_runs} runs, again: wall s"),
    ]
    lines = [
        "# The job's own cost: start-up, small runs, empty incremental runs",
        "",
        f"Machine: {os.cpu_count()} cores, {model}; instruction set: {isa_text(isa)}.",
        f"Medians of {args.repeats} repeats, configurations alternated in one session "
        f"(`python scripts/bench_startup.py --repeats {args.repeats} --images {args.images} "
        f"--history-runs {args.history_runs} --configs '{','.join(args.configs)}'`).",
        "",
        "| measure | " + " | ".join(args.configs) + " |",
        "|---|" + "---:|" * len(args.configs),
    ]
    for key, label in fields:
        cells = [
            statistics.median(values)
            if (values := [r[key] for r in rows if r["config"] == name and key in r])
            else "n/a"
            for name in args.configs
        ]  # phases: n/a where a run's lines lacked a phase's mark
        lines.append(f"| {label} | " + " | ".join(f"{c:.1f}" if isinstance(c, float) else str(c) for c in cells) + " |")
    loads = [r["load_1min"] for r in rows]
    lines += ["", f"1-minute load average after each repeat: {min(loads):.1f}-{max(loads):.1f}."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--history-runs", type=int, default=100)
    parser.add_argument(
        "--configs",
        type=lambda text: [name.strip() for name in text.split(",")],
        default=list(CONFIGS),
        help="comma-separated names of CONFIGS to run (default: all)",
    )
    parser.add_argument("--work", default=str(REPO / "work" / "bench" / "startup"))
    parser.add_argument("--reports", default=str(REPO / "reports"))
    args = parser.parse_args()
    unknown = [name for name in args.configs if name not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown {unknown}; choose from {list(CONFIGS)}")
    subprocess.run(
        [sys.executable, "-m", "pipelines.tools.jvm_class_archive_build", "--if-missing"],
        cwd=REPO,
        check=True,
        stdout=subprocess.DEVNULL,
    )
    rows = measure(args)
    reports = Path(args.reports)
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "startup.json").write_text(json.dumps(rows, indent=1) + "\n")
    text = report(rows, args)
    (reports / "startup.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
