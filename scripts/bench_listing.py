"""Listing a local input: the job's own listing (image_sources.find_images: the executors walk it beyond
DRIVER_LISTING_MAX_FILES names) against Spark's file index (spark_file_index, which lists on the driver), each
counted as the job counts it (whole_listing) -> reports/listing.md, .json

    .venv/bin/python scripts/bench_listing.py [--files 100000] [--directories 100] [--repeats 2]

Files of 2 bytes in `--directories` directories (made once under work/bench/listing), local[2], driver memory 1 g.
Per listing: seconds, and the driver JVM's heap in use after a full collection (Spark's index keeps every file's
status there, also in its file status cache afterwards; the executors' listing keeps none).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench.machine import cpu_isa, isa_text  # noqa: E402
from pyspark import StorageLevel  # noqa: E402

from pipelines.inference import image_sources as src  # noqa: E402
from pipelines.spark.spark_session import local_session  # noqa: E402


def make_tree(root: Path, files: int, directories: int) -> None:
    marker = root / f".made-{files}-{directories}"
    if marker.exists():
        return
    for index in range(files):
        directory = root / f"d{index % directories:04d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"img {index:08d}.jpg").write_bytes(b"xx")
    marker.write_text("")


def heap_mb(spark) -> float:
    runtime = spark._jvm.java.lang.Runtime.getRuntime()
    spark._jvm.java.lang.System.gc()
    return (runtime.totalMemory() - runtime.freeMemory()) / 2**20


def measure(spark, name: str, find, files: int) -> dict:
    start = time.perf_counter()
    listing, counts = src.whole_listing(find(), lambda frame: (frame.count(),), StorageLevel.DISK_ONLY)
    seconds = time.perf_counter() - start
    if counts[0] != files:
        raise SystemExit(f"{name}: listed {counts[0]} files, expected {files}")
    row = {"listing": name, "files": files, "seconds": round(seconds, 2), "driver_heap_mb": round(heap_mb(spark))}
    listing.unpersist()
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--directories", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", default=str(REPO / "work" / "bench" / "listing"))
    parser.add_argument("--reports", default=str(REPO / "reports"))
    args = parser.parse_args()
    root = Path(args.work) / f"tree-{args.files}"
    make_tree(root, args.files, args.directories)
    spark = local_session(app_name="bench-listing", master="local[2]", conf={"spark.driver.memory": "1g"})
    cases = {
        "executors (the job's)": lambda: src.find_images(spark, str(root), [".jpg"]),
        "Spark's file index": lambda: src.spark_file_index(spark, str(root), [".jpg"]),
    }
    rows = [{"listing": "before any", "files": 0, "seconds": 0.0, "driver_heap_mb": round(heap_mb(spark))}]
    for name, find in cases.items():  # the executors' first: Spark keeps the statuses it lists in a cache
        rows += [measure(spark, name, find, args.files) for _ in range(args.repeats)]
    spark.stop()
    model, isa = cpu_isa()
    lines = [
        "# Listing a local input",
        "",
        f"- CPU: {model}, {os.cpu_count()} cores; instruction set: {isa_text(isa)}; load average "
        f"at the end {', '.join(f'{x:.1f}' for x in os.getloadavg())}",
        "",
        f"`scripts/bench_listing.py --files {args.files} --directories {args.directories} --repeats "
        f"{args.repeats}`: local[2], driver memory 1 g, one session, the executors' listing first (Spark's index "
        "leaves the statuses it listed in its file status cache).",
        "",
        "| listing | files | seconds | driver JVM heap in use, MB |",
        "|---|---|---|---|",
    ]
    lines += [f"| {row['listing']} | {row['files']:,} | {row['seconds']} | {row['driver_heap_mb']} |" for row in rows]
    reports = Path(args.reports)
    reports.mkdir(parents=True, exist_ok=True)
    (reports / "listing.json").write_text(json.dumps(rows, indent=1) + "\n")
    (reports / "listing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
