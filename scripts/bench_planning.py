"""The job's planning at scale, without image files: synthetic listings and done tables of 10^5 .. 10^7 rows.

    .venv/bin/python scripts/bench_planning.py [--sizes 100000,1000000,10000000] [--driver-memory 1g]

For each size N, in a fresh local[2] driver (spark.driver.memory 1g), what run_plan does before inference:
listing count (count_inputs: files and rows per partition), shuffle sizing, todo_listing (the done-keys anti-join,
broadcast only below run.broadcast_max_rows) and assign_partitions (dense index, balanced partitions) over the to-do
(a first run indexes the listing with its own counts), for
- a first run: N listed, nothing done;
- an incremental run: N + 1,000 listed, N done (the 1,000 new are to do).
Listings are generated in the JVM (spark.range), done tables written once to work/bench/planning/<N>/ as Parquet.
Reports wall seconds and the peak RSS (VmHWM) of the driver's Python process and of its JVM (in local mode the JVM
also runs the executors' tasks) -> reports/planning.md and reports/planning.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench.machine import cpu_isa, isa_text  # noqa: E402

NEW_IMAGES = 1000
SHA = "0" * 64


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def jvm_pid() -> int | None:
    """The java process under this one (pyspark launches it through spark-submit)."""
    pending, seen = [os.getpid()], set()
    while pending:
        pid = pending.pop()
        for child in Path(f"/proc/{pid}/task").glob("*/children"):
            for cpid in map(int, child.read_text().split()):
                if cpid not in seen:
                    seen.add(cpid)
                    if Path(f"/proc/{cpid}/comm").read_text().strip() == "java":
                        return cpid
                    pending.append(cpid)
    return None


def listing(spark, first: int, count: int):
    from pyspark.sql import functions as F

    from pipelines.inference import image_sources as src

    # a real listing of N files comes in many partitions (binaryFile packs ~32 files per split): one per 200,000 rows
    return (
        spark.range(first, first + count, 1, max(2, count // 200_000))
        .select(
            F.format_string("file:/data/lake/%02d/%09d.jpg", F.col("id") % 100, F.col("id")).alias("path"),
            (F.col("id") + 1000).alias("size"),
            F.lit("2026-01-01 00:00:00").cast("timestamp").alias("modification_time"),
        )
        .select(*[F.col(f.name).cast(f.dataType) for f in src.LISTING_SCHEMA.fields])
    )


def child(size: int, scenario: str, driver_memory: str, work: Path) -> dict:
    """One measurement in this (fresh) process."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    from pipelines.inference.resume import count_inputs, todo_listing
    from pipelines.inference.video_sources import image_units
    from pipelines.inference.waves import index_todo
    from pipelines.job_config import JobConfig, load_config
    from pipelines.spark.session_settings import planning_settings, session_settings_for, set_session_settings
    from pipelines.spark.spark_session import local_session

    spark = local_session("bench-planning", "local[2]", {"spark.driver.memory": driver_memory})
    output = work / str(size) / "out"
    if scenario == "generate":
        (
            listing(spark, 0, size)
            .withColumn("model_sha256", F.lit(SHA))
            .withColumn("run_id", F.lit("20260101T000000Z-bench"))
            .write.mode("overwrite")
            .parquet(str(output / "detections"))
        )
        spark.stop()
        return {}
    manifest = SimpleNamespace(model_sha256=SHA)  # todo_listing reads only the model's hash
    config = JobConfig.from_dict(load_config())  # the job's defaults: shuffles sized, broadcast bound
    start = time.perf_counter()
    set_session_settings(spark, planning_settings(config))
    listed = image_units(listing(spark, 0, size + (NEW_IMAGES if scenario == "incremental" else 0)))
    listed = listed.persist(StorageLevel.DISK_ONLY)
    counts = count_inputs(listed, config.input.video)
    n_inputs = counts.files
    set_session_settings(spark, session_settings_for(n_inputs, config))
    target = str(output) if scenario == "incremental" else str(work / "nothing-here")
    todo = todo_listing(
        spark, listed, target, manifest, False, config.run.broadcast_max_rows, retries=config.run.retries
    )
    n_todo = n_inputs if todo is listed else todo.count()  # nothing done: the listing itself, as in run_plan
    todo, indexed = index_todo(todo, 2, counts.rows_per_partition if todo is listed else None)
    n_indexed = indexed.count()
    seconds = time.perf_counter() - start
    result = {
        "size": size,
        "scenario": scenario,
        "inputs": n_inputs,
        "todo": n_todo,
        "indexed": n_indexed,
        "seconds": round(seconds, 1),
        "python_peak_rss_mib": round(peak_rss_mib(os.getpid()), 0),
    }
    pid = jvm_pid()
    result["jvm_peak_rss_mib"] = round(peak_rss_mib(pid), 0) if pid else None
    spark.stop()
    return result


def run_child(size: int, scenario: str, args) -> dict:
    command = [
        sys.executable,
        __file__,
        "--child",
        scenario,
        "--sizes",
        str(size),
        "--driver-memory",
        args.driver_memory,
        "--work",
        str(args.work),
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return {"size": size, "scenario": scenario, "error": " | ".join(tail)[:300]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def report(results: list[dict], args) -> str:
    model, isa = cpu_isa()
    lines = [
        "# Planning at scale (synthetic listings and done tables, no image files)",
        "",
        f"- CPU: {model}, {os.cpu_count()} cores; instruction set: {isa_text(isa)}; load average at the end "
        f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}",
        f"- local[2], spark.driver.memory {args.driver_memory}; `python scripts/bench_planning.py --sizes "
        f"{','.join(map(str, args.sizes))}`",
        "- planning = listing count + shuffle sizing + todo_listing (anti-join with the done keys) + "
        "assign_partitions over the to-do, as run_plan does before inference",
        "- first: N listed, nothing done. incremental: N + 1,000 listed, N done.",
        "",
        "| rows N | run | to do | seconds | driver Python peak RSS (MiB) | driver JVM peak RSS (MiB) |",
        "|---:|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['size']:,} | {r['scenario']} | - | failed: {r['error']} | | |")
        else:
            lines.append(
                f"| {r['size']:,} | {r['scenario']} | {r['todo']:,} | {r['seconds']} | "
                f"{r['python_peak_rss_mib']:.0f} | {r['jvm_peak_rss_mib'] or 0:.0f} |"
            )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000,10000000")
    parser.add_argument("--driver-memory", default="1g")
    parser.add_argument("--work", type=Path, default=REPO / "work" / "bench" / "planning")
    parser.add_argument("--timeout", type=float, default=3600)
    parser.add_argument("--child", choices=["generate", "first", "incremental"])
    args = parser.parse_args()
    args.sizes = [int(s) for s in str(args.sizes).split(",") if s]
    if args.child:
        print(json.dumps(child(args.sizes[0], args.child, args.driver_memory, args.work)))
        return 0
    results = []
    for size in args.sizes:
        if not (args.work / str(size) / "out" / "detections" / "_SUCCESS").is_file():
            run_child(size, "generate", args)
        for scenario in ("first", "incremental"):
            results.append(run_child(size, scenario, args))
            print(json.dumps(results[-1]), flush=True)
    out = REPO / "reports"
    out.mkdir(exist_ok=True)
    (out / "planning.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "planning.md").write_text(report(results, args))
    print(f"wrote {out / 'planning.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
