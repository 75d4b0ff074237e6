"""`make bench`: one run, same images, same IR, same cores, side by side -> reports/bench.md and reports/bench.csv.

    python scripts/bench.py                  # 200 images, f32, bf16 and int8, every row
    python scripts/bench.py --quick          # 24 images, benchmark_app 10 s
    python scripts/bench.py --images 50 --rows ceiling,openvino,spark_native --precisions bf16
    python scripts/bench.py --load           # also the load figure: 10,000 small images through the job
    python scripts/bench.py --video-seconds 5  # also the video row: a 60 fps 1080p clip through the job, frames/s

Rows: benchmark_app on the IR (the ceiling), PyTorch eager, ONNX Runtime and OpenVINO in one process, the Spark
job (native engine, local[2]), Spark's predict_batch_udf recipe with OpenVINO at default settings, the Spark job
with the BigDL engine (.venv-bigdl; "not available: <reason>" when it cannot run). The model is YOLACT-ResNet50 at
550 exported with random weights (speed only), cached under the work dir with the images. Precision int8: an INT8
copy of that export (NNCF PTQ of its FP16 IR on 16 of the bench images, as `--precision int8` makes it:
scripts/bench/int8_model.py), the rest of the graph in f32; OpenVINO rows only (ceiling, openvino, spark_native).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench import images as bench_images  # noqa: E402
from bench import report, rows  # noqa: E402
from bench.machine import cpu_isa, isa_text  # noqa: E402

ALL_ROWS = list(rows.ROW_NAMES)
MODEL_NAME = "yolact_resnet50_550"
INT8_ROWS = ("ceiling", "openvino", "spark_native")  # the rows that run OpenVINO on the export's manifest IR
INT8_CALIBRATION_IMAGES = 16
# Random R50 weights with FP16-compressed IR weights fail the export's default parity gate (max |d| is a few % of
# each output's range, ~60% of detections matched): the bench measures speed only, so the gate is loosened here.
EXPORT_GATES = [
    "--gate-ort-atol",
    "1e-3",
    "--gate-ov-fp16-ir-rel",
    "0.2",
    "--gate-min-matched",
    "0.5",
    "--gate-min-median-mask-iou",
    "0.9",
]


def log(message: str) -> None:
    print(f"[bench {dt.datetime.now():%H:%M:%S}] {message}", file=sys.stderr, flush=True)


def ensure_model(work: Path) -> Path:
    """The YOLACT-R50 550 export (random init) under the work dir, exported once."""
    out = work / "models" / MODEL_NAME
    if (out / "manifest.json").is_file():
        return out
    log(f"exporting yolact_resnet50 (random init) to {out} (a few minutes, once)")
    command = [
        sys.executable,
        "-m",
        "model_export",
        "yolact",
        "--config",
        "yolact_resnet50",
        "--random-init",
        "--out",
        str(out),
        "--parity-count",
        "1",
        *EXPORT_GATES,
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "manifest.json").is_file():
        raise SystemExit(
            f"error: the export failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return out


def ensure_int8_model(work: Path, model: Path, images: Path) -> Path:
    """The INT8 copy of the bench export (made once, like the export)."""
    from bench.int8_model import make_int8_model

    from model_export import quantize

    out = work / "models" / f"{MODEL_NAME}_int8"
    if (out / "manifest.json").is_file():
        return out
    log(f"quantizing {model.name} to INT8 (NNCF, {INT8_CALIBRATION_IMAGES} bench images; once)")
    calibration, _ = quantize.decode_all(bench_images.image_paths(images)[:INT8_CALIBRATION_IMAGES])
    make_int8_model(model, out, calibration, f"{INT8_CALIBRATION_IMAGES} bench images")
    return out


def machine_facts() -> list[str]:
    cpu, isa = cpu_isa()
    return [
        f"{os.cpu_count()} cores ({cpu}; instruction set: {isa_text(isa)})",
        f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB",
    ]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=200, help="number of bench images (default 200)")
    parser.add_argument("--quick", action="store_true", help="24 images, benchmark_app 10 s, rows killed after 1500 s")
    parser.add_argument(
        "--precisions",
        default="f32,bf16,int8",
        help="comma-separated: f32, bf16, int8 (an INT8 copy of the IR, OpenVINO rows only)",
    )
    parser.add_argument(
        "--rows", default=",".join(ALL_ROWS), help=f"comma-separated subset of {','.join(ALL_ROWS)}, or 'none'"
    )
    parser.add_argument("--seconds", type=int, default=20, help="benchmark_app duration (-t)")
    parser.add_argument(
        "--video-seconds",
        type=float,
        default=0,
        help="also the video row: a clip this long (60 fps, 1080p) through the job (default 0: off)",
    )
    parser.add_argument("--load", action="store_true", help="also the load figure (not in the default run)")
    parser.add_argument("--load-images", type=int, default=10_000, help="images for --load (default 10,000)")
    parser.add_argument(
        "--load-model",
        default="samples/models/yolact_default",
        help="export directory for --load (default: the bundled tiny model; 'r50' for the bench IR)",
    )
    parser.add_argument("--work-dir", default=str(REPO / "work" / "bench"), help="cache: images, IR, run dirs")
    parser.add_argument("--out", default=str(REPO / "reports"), help="where bench.md and bench.csv go")
    parser.add_argument("--row-timeout", type=float, default=3600.0, help="seconds before a row is killed")
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="only rewrite bench.md/csv from the saved rows of an earlier run (same --images)",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="reuse the successful rows of an earlier run with the same --images (work dir results/)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.images, args.seconds = min(args.images, 24), min(args.seconds, 10)
        args.row_timeout = min(args.row_timeout, 1500.0)
    args.precisions = [p for p in args.precisions.split(",") if p]
    bad = [p for p in args.precisions if p not in ("f32", "bf16", "int8")]
    args.rows = [] if args.rows == "none" else [r for r in args.rows.split(",") if r]
    unknown = [r for r in args.rows if r not in ALL_ROWS]
    if bad or unknown or args.images < 1:
        parser.error(f"bad --precisions {bad} / --rows {unknown} / --images {args.images}")
    return args


def run_rows(args, model: Path, images: Path, work: Path) -> list:
    cores = os.cpu_count() or 2
    logs = work / "logs"
    results = []
    for precision in args.precisions:
        for row in args.rows:
            saved = work / "results" / f"n{args.images}-{row}-{precision}.json"
            result = rows.load_result(saved) if args.reuse or args.report_only else None
            if args.report_only:
                if result is not None:
                    results.append(result)
                continue
            if result is not None and result.status in ("ok", "n/a"):
                log(f"{row} {precision}: reusing {saved}")
                results.append(result)
                continue
            log(f"{row} {precision} ...")
            started, load_start = time.perf_counter(), os.getloadavg()[0]
            if precision == "int8":
                result = run_int8_row(args, row, ensure_int8_model(work, model, images), images, cores, work)
            else:
                result = run_row(args, row, precision, model, images, cores, work, logs)
            log(
                f"{row} {precision}: {result.status}"
                + (f", {result.images_per_s} images/s" if result.status == "ok" else f" ({result.note})")
                + f" [{time.perf_counter() - started:.0f} s]"
            )
            result.load_average = [load_start, os.getloadavg()[0]]
            rows.save_result(result, saved)
            results.append(result)
    return results


def run_row(
    args, row: str, precision: str, model: Path, images: Path, cores: int, work: Path, logs: Path
) -> rows.BenchResult:
    if row == "ceiling":
        from pipelines.inference.model_manifest import load_manifest

        return rows.ceiling(load_manifest(model).path("ir_xml"), precision, args.seconds, logs, args.row_timeout)
    if row in ("torch", "onnxruntime", "openvino"):
        return rows.single_process(row, precision, model, images, cores, logs, args.row_timeout)
    if row == "spark_udf":
        return rows.spark_udf(precision, model, images, work / "runs", logs, args.row_timeout)
    engine = "bigdl" if row == "bigdl" else "native"
    return rows.spark_job(
        row, engine, precision, model, images, work / "runs", args.row_timeout, REPO / ".venv-bigdl" / "bin" / "python"
    )


def run_int8_row(args, row: str, int8_model: Path, images: Path, cores: int, work: Path) -> rows.BenchResult:
    """The row on the INT8 copy (its manifest's IR is model.int8.xml; f32 for what stays float), labelled int8."""
    if row not in INT8_ROWS:
        return rows.BenchResult(row, "int8", "n/a", note="INT8 IR: the OpenVINO rows only")
    logs = work / "logs" / "int8"
    logs.mkdir(parents=True, exist_ok=True)
    result = run_row(args, row, "f32", int8_model, images, cores, work / "int8", logs)
    result.precision = "int8"
    result.note = "INT8 IR (NNCF PTQ), the rest f32" + (f"; {result.note}" if result.note else "")
    return result


def run_load(args, work: Path) -> tuple[dict, str, str]:
    """10,000 small images through the job on a 1-worker x 2-core standalone cluster (separate executor JVM)."""
    from pipelines.job_config import load_config, merge
    from pipelines.sweeps.cluster_process import ClusterProcess
    from pipelines.sweeps.config import GridPoint
    from pipelines.sweeps.point_run import PointEnv, run_point

    model = ensure_model(work) if args.load_model == "r50" else (REPO / args.load_model).resolve()
    log(f"load: making {args.load_images} small images")
    images = bench_images.make_images(
        work / f"images-load-{args.load_images}", args.load_images, sizes=bench_images.LOAD_SIZES
    )
    cores = os.cpu_count() or 2
    point = GridPoint(
        partitions=0,
        executors=1,
        executor_cores=cores,
        task_cpus=1,
        batch_size=8,
        openvino_streams=0,
        openvino_threads=0,
        precision="auto",
        engine="native",
    )
    job = merge(
        load_config(), {"input": {"uri": str(images)}, "model": {"dir": str(model)}, "run": {"progress_interval_s": 0}}
    )
    shape = f"{args.load_images} images of 160x120, standalone cluster 1 worker x {cores} cores, job defaults"
    log(f"load: {shape}")
    with ClusterProcess(sys.executable, 1, cores, "4g", work / "runs" / "load-cluster") as cluster:
        env = PointEnv(
            mode="standalone",
            master=cluster.master_url,
            python=sys.executable,
            worker_memory="4g",
            cluster_pids=[cluster.pid],
            timeout_s=args.row_timeout * 3,
        )
        row = run_point(point, job, env, work / "runs" / "load")
    log(f"load: {row['status']}, {row['images_per_s']} images/s")
    return row, str(model.relative_to(REPO) if model.is_relative_to(REPO) else model), shape


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    work, out = Path(args.work_dir).resolve(), Path(args.out).resolve()
    work.mkdir(parents=True, exist_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    started = time.perf_counter()
    results, model, images = [], None, None
    if args.rows:
        model = ensure_model(work)
        log(f"making {args.images} bench images")
        images = bench_images.make_images(work / f"images-{args.images}", args.images)
        results = run_rows(args, model, images, work)
    load = run_load(args, work) if args.load else None
    header = [
        "# sparkseg bench",
        "",
        f"{dt.datetime.now():%Y-%m-%d %H:%M}; {'; '.join(machine_facts())}; load average (1 min) "
        f"{load_before[0]:.1f} at the start, {os.getloadavg()[0]:.1f} at the end (the machine is shared: a load "
        "above the core count slows every row; bench.csv has each row's). Total {:.0f} s.".format(
            time.perf_counter() - started
        ),
    ]
    if args.report_only:
        header[-1] = (
            f"{dt.datetime.now():%Y-%m-%d %H:%M}; {'; '.join(machine_facts())}. Rewritten from rows "
            "saved by earlier runs (bench.csv has the load average during each row: the machine is "
            "shared, and a load above the core count slows a row)."
        )
    if args.rows:
        header += [
            "",
            f"Same {args.images} images (deterministic crops of samples/images, 480-800 px JPEGs), same "
            f"IR (`{model.relative_to(REPO) if model.is_relative_to(REPO) else model}`: YOLACT-ResNet50 at "
            "550, random weights, FP16 weights; the int8 columns run its INT8 copy, speed only), same cores. Rows that "
            "run the per-image code decode, "
            "preprocess, infer and postprocess (RLE masks) every image; the Spark job also writes "
            "detections and PNG masks.",
        ]
    report.write_csv(results, out / "bench.csv")
    report.write_markdown(out / "bench.md", header, results, args.precisions, rows.ROW_NAMES, load)
    if args.video_seconds:
        from bench import video

        log(f"video: a {args.video_seconds:g} s 60 fps 1080p clip through the job")
        with open(out / "bench.md", "a", encoding="utf-8") as handle:
            handle.write("\n".join(video.markdown(video.run_video(work, args.video_seconds))) + "\n")
    log(f"wrote {out / 'bench.md'} and {out / 'bench.csv'}")
    print((out / "bench.md").read_text(encoding="utf-8"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
