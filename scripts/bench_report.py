"""The report's gather at scale: render.gather (pyarrow, the CLI) against spark_rows.gather_with_spark (the job's
output.overlays) on synthetic outputs of 10^5 .. 10^6 images, no image files.

    .venv/bin/python scripts/bench_report.py [--sizes 100000,1000000] [--instances 3]

Each output has N detection rows (`--instances` instances per image, no masks) in 8 Parquet files typed as the job
writes them, under work/bench/report/<N>/. Each gather runs in a fresh process (local[2] for Spark,
spark.driver.memory 1g), drawing the top 100 at threshold 0.5; reported: wall seconds and the peak RSS (VmHWM) of the
gathering Python process and of Spark's JVM -> reports/report_gather.md and .json. The two gathers' rows and
counts are checked equal.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))
from bench.machine import cpu_isa, isa_text  # noqa: E402
from bench_planning import jvm_pid, peak_rss_mib  # noqa: E402

FILES = 8
LIMIT = 100
THRESHOLD = 0.5


def write_output(root: Path, n: int, per_image: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from pipelines.results.result_rows import RESULT_ARROW_SCHEMA

    if (root / "summary.json").is_file():
        return
    names = ["path", "width", "height", "instances", "mask_path", "size", "modification_time", "frame_index"]
    schema = pa.schema(
        [RESULT_ARROW_SCHEMA.field(name) for name in names]
        + [pa.field("model_sha256", pa.string()), pa.field("run_id", pa.string())]
    )
    rng = np.random.default_rng(0)
    when = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    (root / "detections").mkdir(parents=True, exist_ok=True)
    for part, rows in enumerate(np.array_split(np.arange(n), FILES)):
        classes, scores = rng.integers(0, 3, (len(rows), per_image)), rng.random((len(rows), per_image))
        table = pa.table(
            {
                "path": [f"file:/in/{i:08d}.jpg" for i in rows],
                "width": pa.array([640] * len(rows), pa.int32()),
                "height": pa.array([480] * len(rows), pa.int32()),
                "instances": pa.array(
                    [
                        [
                            {
                                "class_id": int(k),
                                "class_name": "abc"[k],
                                "score": float(s),
                                "box": [0, 0, 4, 4],
                                "mask": None,
                            }
                            for k, s in zip(ks, ss)
                        ]
                        for ks, ss in zip(classes, scores)
                    ],
                    schema.field("instances").type,
                ),
                "mask_path": pa.array([None] * len(rows), pa.string()),
                "size": pa.array([1000] * len(rows), pa.int64()),
                "modification_time": pa.array([when] * len(rows), schema.field("modification_time").type),
                "frame_index": pa.array([None] * len(rows), pa.int32()),
                "model_sha256": ["m"] * len(rows),
                "run_id": ["20260101T000000Z-a"] * len(rows),
            },
            schema=schema,
        )
        pq.write_table(table, root / "detections" / f"part-{part:05d}.parquet")
    (root / "summary.json").write_text(
        json.dumps(
            {
                "run_id": "20260101T000000Z-a",
                "input": "/in",
                "model": {"name": "m", "sha256": "m", "classes": list("abc")},
            }
        )
    )


def gather_once(root: str, how: str) -> dict:
    """In this (fresh) process: one gather, its seconds, peak RSS and what it found."""
    started = time.perf_counter()
    if how == "spark":
        from pipelines.io.storage import Location
        from pipelines.report.spark_rows import gather_with_spark
        from pipelines.spark.spark_session import local_session

        spark = local_session(app_name="bench-report", master="local[2]", conf={"spark.driver.memory": "1g"})
        session_s = time.perf_counter() - started
        started = time.perf_counter()
        rows = gather_with_spark(spark, Location(root), LIMIT, THRESHOLD)
        jvm = jvm_pid()
    else:
        from pipelines.report.render import gather

        session_s, jvm = 0.0, None
        rows = gather(root, LIMIT, THRESHOLD)
    seconds = time.perf_counter() - started
    return {
        "how": how,
        "seconds": round(seconds, 2),
        "session_seconds": round(session_s, 2),
        "python_peak_mib": round(peak_rss_mib(__import__("os").getpid()), 1),
        "jvm_peak_mib": round(peak_rss_mib(jvm), 1) if jvm else None,
        "found": {
            "images": rows.images_total,
            "classes": rows.classes,
            "bins": rows.score_bins,
            "top": [r["path"] for r in rows.top],
        },
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--instances", type=int, default=3)
    parser.add_argument("--gather", nargs=2, metavar=("ROOT", "HOW"), help=argparse.SUPPRESS)  # the child
    args = parser.parse_args()
    if args.gather:
        print(json.dumps(gather_once(*args.gather)))
        return 0
    results = []
    for n in map(int, args.sizes.split(",")):
        root = REPO / "work" / "bench" / "report" / f"{n}x{args.instances}"
        write_output(root, n, args.instances)
        runs = {}
        for how in ("pyarrow", "spark"):
            done = subprocess.run(
                [sys.executable, __file__, "--gather", str(root), how],
                capture_output=True,
                text=True,
                check=True,
                timeout=3600,
            )
            runs[how] = json.loads(done.stdout.strip().splitlines()[-1])
        if runs["pyarrow"].pop("found") != runs["spark"].pop("found"):
            raise SystemExit(f"{root}: the two gathers disagree")
        results.append({"images": n, "instances_per_image": args.instances, **runs})
    model, isa = cpu_isa()
    lines = [
        "# The report's gather: pyarrow (CLI) against Spark (the job)",
        "",
        f"CPU: {model}, {isa_text(isa)}",
        "",
        "| images | gather | wall s | Spark session s | Python peak RSS MiB | JVM peak RSS MiB |",
        "|---|---|---|---|---|---|",
    ]
    for result in results:
        for how in ("pyarrow", "spark"):
            run = result[how]
            lines.append(
                f"| {result['images']} | {how} | {run['seconds']} | {run['session_seconds']} | "
                f"{run['python_peak_mib']} | {run['jvm_peak_mib'] or ''} |"
            )
    reports = REPO / "reports"
    reports.mkdir(exist_ok=True)
    (reports / "report_gather.md").write_text("\n".join(lines) + "\n")
    (reports / "report_gather.json").write_text(
        json.dumps({"cpu": model, "isa": isa, "results": results}, indent=1) + "\n"
    )
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
