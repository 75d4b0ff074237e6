"""`make bench-executor`: the job's own executor function against OpenVINO's ceiling -> reports/executor.md, .json.

    python scripts/bench_executor.py                      # bundled default model, P = all cores, f32
    python scripts/bench_executor.py --processes 2 --precisions f32,bf16 --r50 --detector
    python scripts/bench_executor.py --model path/to/export --images 64

Per model and precision, in one run, in --rounds interleaved rounds (medians of per-round ratios reported):
- benchmark_app on the IR with P streams x 1 thread (model only: no decode, no postprocess), the ceiling;
- the executor function (`ImageInference.__call__` as mapInArrow calls it, Arrow batches with a `content`
  column) in P processes x 1 OpenVINO thread (1 stream), masks written (RLE + PNG label maps under a scratch
  output): "before" is the previous per-image code (scripts/bench/legacy_executor.py, the tests' reference),
  "after" the current one, "boxes only" the current one with output.masks none, "jpeg_draft" the current one
  with inference.jpeg_draft (reduced-size JPEG decode; not result-identical), and "pinned" the current one with
  inference.pin_cores (each process claims a core of its own);
- the Spark job itself (`jobs/infer_yolact.py --master local[P]`, the same settings) over P x 8 images and over
  enough for --job-seconds of the executor function's work: its images/s beyond its fixed start-up and summary
  cost (YOLACT rows at the manifest's conf_thresh).
Images: JPEGs of 480-1920 px made from the samples (scripts/bench/images.py). Detections: YOLACT's COCO setting
(fast NMS, top_k 200, up to 100 kept); every detection is written (score threshold 0) so before and after write
the same instances, and conf_thresh is lowered from the manifest's until the mean is >= 90 per image. Reported:
images/s (the rate of P busy slots: each process's images over its own time from the common start, summed, after
model load and one warm-up image; each process cycles over its share for at least --executor-seconds,
benchmark_app's duration by default; images / (last end - common start) in the notes), ratio to benchmark_app,
summed seconds per stage per image, peak RSS of each process, and the CPU's instruction set; then, per model and
precision, a per-stage profile of the current code in one process (--profile-images, scripts/bench/stage_profile.py):
the functions with the most own time per image in each stage; and per YOLACT model, the box and mask AP of
inference.jpeg_draft against the full decode on synthetic road scenes (--draft-ap-images, scripts/bench/draft_ap.py).
"""

from __future__ import annotations

import argparse
import datetime as dt
import itertools
import json
import logging
import math
import multiprocessing as mp
import os
import platform
import resource
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

import numpy as np  # noqa: E402
from bench import images as bench_images  # noqa: E402
from bench.benchmark_app import run_benchmark_app, run_benchmark_app_processes  # noqa: E402
from bench.draft_ap import draft_ap  # noqa: E402
from bench.draft_ap import report_lines as draft_ap_lines  # noqa: E402
from bench.job_runs import marginal_throughput  # noqa: E402
from bench.machine import SCHEDULER_COUNTS, cpu_isa, isa_text, scheduler_counts  # noqa: E402
from bench.stage_profile import profile_stages, report_lines  # noqa: E402

log = logging.getLogger("bench_executor")
EXECUTOR_SIZES = (
    (640, 480),
    (1280, 960),
    (1920, 1080),
    (480, 640),
    (1024, 768),
    (1080, 1920),
    (800, 600),
    (1600, 1200),
)  # (width, height), cycled: 480-1920 px
STAGES = ("read", "preprocess", "infer", "postprocess", "write")
R50_DIR = REPO / "work" / "bench" / "r50"
DETECTOR_DIR = REPO / "work" / "bench" / "detector"
# Random R50 weights with FP16 IR weights fail the export's default parity gate (scripts/bench.py): speed only.
R50_EXPORT_GATES = [
    "--gate-ort-atol",
    "1e-3",
    "--gate-ov-fp16-ir-rel",
    "0.2",
    "--gate-min-matched",
    "0.5",
    "--gate-min-median-mask-iou",
    "0.9",
    "--parity-count",
    "1",
]
CONF_STEPS = (0.01, 0.001, 1e-4, 0.0)
VARIANTS = {
    "before": "previous per-image code",
    "after": "current code",
    "after_boxes": "current code, output.masks none (boxes only)",
    "after_draft": "current code, inference.jpeg_draft (reduced JPEG decode; detections change)",
    "after_pinned": "current code, inference.pin_cores (each process on a core of its own)",
    "after_thread": "current code, each image's inference in the worker's own thread (InferRequest.infer)",
    "after_overlap": "current code, each image's decode overlapping the previous image's inference",
}


# ----------------------------------------------------------------------------------------------------- machine
def cpu_facts() -> dict:
    import openvino

    model, isa = cpu_isa()

    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "isa": isa,
        "best_isa": isa[0] if isa else "none",
        "memory_gib": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1),
        "openvino": openvino.__version__,
        "python": platform.python_version(),
        "load_average": os.getloadavg(),
    }


# ------------------------------------------------------------------------------------------------------ models
def export(family: str, config: str, out: Path, extra: list[str]) -> Path:
    if (out / "manifest.json").is_file():
        return out
    command = [
        sys.executable,
        "-m",
        "model_export",
        family,
        "--config",
        config,
        "--random-init",
        "--out",
        str(out),
        *extra,
    ]
    log.info("exporting %s (random init) to %s: %s", config, out, " ".join(command))
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True)
    if done.returncode != 0 or not (out / "manifest.json").is_file():
        raise SystemExit(
            f"error: the export failed (exit {done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}"
        )
    return out


def model_rows(args) -> list[tuple[str, Path]]:
    rows = [(Path(m).name, Path(m).resolve()) for m in args.model]
    if args.r50:
        rows.append(
            ("yolact_resnet50 550 (random init)", export("yolact", "yolact_resnet50", R50_DIR, R50_EXPORT_GATES))
        )
    if args.detector:
        rows.append(("detector factornet_small (random init)", export("detector", "factornet_small", DETECTOR_DIR, [])))
    return rows


# ------------------------------------------------------------------------------------------------------ the task
def make_task(manifest, variant: str, precision: str, conf_thresh: float | None, output: Path, image_dir: Path):
    """The executor function as the job builds it (make_task), 1 stream x 1 thread, every detection written."""
    from pipelines.inference.inference_tasks import inference_task_class
    from pipelines.inference.openvino_runtime import RuntimeSettings
    from pipelines.io.storage import Location

    if variant == "before":
        from bench.legacy_executor import LegacyDetectorInference, LegacyYolactInference

        cls = LegacyYolactInference if manifest.model == "yolact" else LegacyDetectorInference
    elif variant == "after_thread":
        from bench.legacy_executor import InThreadDetectorInference, InThreadYolactInference

        cls = InThreadYolactInference if manifest.model == "yolact" else InThreadDetectorInference
    elif variant == "after_overlap":
        from bench.legacy_executor import OverlappedDetectorInference, OverlappedYolactInference

        cls = OverlappedYolactInference if manifest.model == "yolact" else OverlappedDetectorInference
    else:
        cls = inference_task_class(manifest.model)
    postprocess = dict(manifest.postprocess)
    if conf_thresh is not None:
        postprocess["conf_thresh"] = conf_thresh
    return cls(
        model_dir=str(manifest.root),
        model_sha256=manifest.model_sha256,
        class_names=tuple(manifest.class_names),
        input_spec=manifest.input,
        postprocess={**postprocess, "nms": postprocess.get("nms", "fast")},
        settings=RuntimeSettings(precision=precision, threads=1, streams=1, pin_cores=variant == "after_pinned"),
        output=Location(str(output)),
        input_root=str(image_dir),
        masks="none" if variant == "after_boxes" else "rle_and_png",
        score_threshold=0.0,
        jpeg_draft=variant == "after_draft",
    )


def records(paths: list[Path], contents: list[bytes]):
    """A mapInArrow input batch as the job's reader gives it (file: paths with their content)."""
    import pyarrow as pa

    return pa.RecordBatch.from_pydict(
        {
            "path": ["file:" + str(p) for p in paths],
            "content": contents,
            "size": [len(c) for c in contents],
            "modification_time": pa.array(
                [dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)] * len(paths), pa.timestamp("us", tz="UTC")
            ),
        }
    )


def peak_rss_mib() -> float:
    """This process's peak RSS: its VmHWM (this program's own; ru_maxrss also counts the parent's pages a spawned
    child had between fork and exec: the bench's parent holds NNCF and torch with --int8)."""
    from pipelines.sweeps.process_memory import high_water_mark_bytes

    peak = high_water_mark_bytes(os.getpid())
    return peak / 2**20 if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def share_batches(count: int, batch_size: int, started: float, min_seconds: float) -> Iterator[slice]:
    """The share's batches (slices of its `count` images): one pass, then on from the first again, until
    `min_seconds` have passed since `started` (checked before each batch after the first pass)."""
    per_pass = max(1, -(-count // batch_size))
    for k in itertools.count():
        if k >= per_pass and time.time() - started >= min_seconds:
            return
        start = (k % per_pass) * batch_size
        yield slice(start, min(start + batch_size, count))


def counts_since(started: dict[str, int]) -> dict[str, int]:
    now = scheduler_counts()
    return {name: now[name] - started[name] for name in now}


def worker(
    task, paths: list[str], batch_size: int, barrier, results, model_only: bool = False, min_seconds: float = 0.0
) -> None:
    """One executor process: load + warm up, wait for the others, run its share through task(batches), cycling
    over it until min_seconds have passed (share_batches).
    model_only: only the compiled IR's infer on the share's preprocessed tensors (the same process, settings and
    batches: the in-harness ceiling)."""
    paths = [Path(p) for p in paths]
    contents = [p.read_bytes() for p in paths]
    # compile the IR (LazyModel), first-call allocations; an image failing here fails on every image (a missing
    # module, an unreadable model): the bench stops at once instead of timing failures
    warm_up = [row for batch in task(iter([records(paths[:1], contents[:1])])) for row in batch.to_pylist()]
    failed = [row["error_message"] for row in warm_up if row["status"] != "ok"]
    if failed:
        results.put({"pid": os.getpid(), "warm_up_error": f"{paths[0]}: {failed[0]}"})
        barrier.abort()
        return
    if model_only:
        tensors = [task.decode_and_preprocess(c, str(p))[0] for p, c in zip(paths, contents)]
        ir = task.model().ir
    try:
        barrier.wait()
    except threading.BrokenBarrierError:  # another process's warm-up image failed
        results.put({"pid": os.getpid(), "warm_up_error": None})
        return
    started, cpu_started, sched_started = time.time(), time.process_time(), scheduler_counts()
    rows = []
    if model_only:
        images = 0
        for part in share_batches(len(tensors), batch_size, started, min_seconds):
            ir.infer(tensors[part])
            images += len(tensors[part])
        ended, cpu = time.time(), time.process_time() - cpu_started
        results.put(
            {
                "pid": os.getpid(),
                "images": images,
                "failed": 0,
                "instances": 0,
                "started": started,
                "ended": ended,
                "cpu": cpu,
                "stages": {s: 0.0 for s in STAGES},
                "errors": [],
                "peak_rss_mib": peak_rss_mib(),
                "scheduler": counts_since(sched_started),
            }
        )
        return
    batches = (
        records(paths[part], contents[part]) for part in share_batches(len(paths), batch_size, started, min_seconds)
    )
    for batch in task(batches):
        rows.extend(batch.to_pylist())
    ended, cpu = time.time(), time.process_time() - cpu_started
    stages = {s: sum(r["timings"][f"{s}_s"] for r in rows) for s in STAGES}
    results.put(
        {
            "pid": os.getpid(),
            "images": len(rows),
            "failed": sum(r["status"] != "ok" for r in rows),
            "instances": sum(len(r["instances"] or []) for r in rows),
            "started": started,
            "ended": ended,
            "cpu": cpu,
            "stages": stages,
            "peak_rss_mib": peak_rss_mib(),
            "scheduler": counts_since(sched_started),
            "errors": [r["error_message"] for r in rows if r["status"] != "ok"][:3],
        }
    )


def process_shares(paths: list[Path], processes: int) -> list[list[Path]]:
    """Each process's images: whole cycles of EXECUTOR_SIZES (image i has size i mod 8), dealt round-robin, so that
    P dividing the number of cycles gives every process the same pixels to decode and mask (dealing single images
    round-robin would give one of 2 processes all the 1920x1080 and 1600x1200 ones: 24% more pixels, and the wall
    time is the slowest process's)."""
    cycle = len(EXECUTOR_SIZES)
    return [[p for i, p in enumerate(paths) if (i // cycle) % processes == k] for k in range(processes)]


class ImagesFailed(RuntimeError):
    """Bench images failed in the executor function: the row is reported as failed, not timed."""


def run_executor(
    task,
    paths: list[Path],
    processes: int,
    batch_size: int,
    timeout_s: float,
    model_only: bool = False,
    min_seconds: float = 0.0,
) -> dict:
    """P spawned processes, each the same task over an equal share of the images (as P single-core tasks), each
    cycling over its share for at least min_seconds: as benchmark_app's streams, every process is busy for the
    whole measured time but the last batch (the processes that end first leave their cores idle only that long)."""
    # Spark's Python workers get OMP_NUM_THREADS = spark.task.cpus (1 here) unless set: numpy's BLAS follows it
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(processes), ctx.Queue()
    shares = [[str(p) for p in part] for part in process_shares(paths, processes)]
    procs = [
        ctx.Process(target=worker, args=(task, share, batch_size, barrier, results, model_only, min_seconds))
        for share in shares
    ]
    for proc in procs:
        proc.start()
    got = []
    deadline = time.time() + timeout_s
    while len(got) < processes and time.time() < deadline:
        try:
            got.append(results.get(timeout=5))
        except Exception:  # noqa: BLE001  (queue.Empty: check the processes are alive)
            if all(not p.is_alive() for p in procs) and results.empty():
                break
    for proc in procs:
        proc.join(timeout=30)
        if proc.is_alive():
            proc.kill()
    warm_up_errors = [r["warm_up_error"] for r in got if r.get("warm_up_error")]
    if warm_up_errors:
        raise ImagesFailed(
            f"the executor function failed on its warm-up image ({warm_up_errors[0]}); nothing "
            "was timed: install the inference dependencies (pip install -e . -c constraints.txt) and "
            "check the model directory"
        )
    if len(got) < processes:
        raise RuntimeError(f"{processes - len(got)} executor processes gave no result (crashed or timed out)")
    failed = sum(r["failed"] for r in got)
    if failed:
        first = sum((r["errors"] for r in got), [])[:1]
        raise ImagesFailed(
            f"{failed} of {sum(r['images'] for r in got)} bench images failed in the executor function "
            f"(first: {first[0] if first else '?'}): a rate over failed images measures nothing"
        )
    images = sum(r["images"] for r in got)
    wall = max(r["ended"] for r in got) - min(r["started"] for r in got)
    # the throughput of P slots kept busy (a job's slots are, while tasks remain): each process's images over its
    # own time, summed. images / wall also counts the bench's own tail, the cores of the processes that ended first
    # idle until the last ends: up to a batch (the job row measures a job's tail).
    steady = sum(r["images"] / (r["ended"] - r["started"]) for r in got)
    return {
        "images": images,
        "seconds": round(wall, 3),
        "images_per_s": round(steady, 3),
        "wall_images_per_s": round(images / wall, 3),
        "cpu_s_per_image": round(sum(r["cpu"] for r in got) / max(images, 1), 5),
        "detections_per_image": round(sum(r["instances"] for r in got) / max(images, 1), 1),
        "stage_s_per_image": {s: round(sum(r["stages"][s] for r in got) / max(images, 1), 5) for s in STAGES},
        "peak_rss_mib": [round(r["peak_rss_mib"], 1) for r in got],
        "scheduler_per_image": {
            name: round(sum(r["scheduler"][name] for r in got) / max(images, 1), 3) for name, _ in SCHEDULER_COUNTS
        },
    }


def profile_in_child(task, paths: list[Path], batch_size: int) -> dict:
    """stage_profile.profile_stages in a spawned process with one BLAS thread, as an executor's (Spark's Python
    workers get OMP_NUM_THREADS = spark.task.cpus; this process's numpy sized its pool at import)."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(name, "1")
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(profile_stages, (task, paths, batch_size))


def calibrate_conf(manifest, paths: list[Path], precision: str, target: float) -> tuple[float | None, float]:
    """The manifest's conf_thresh, or the first lower step giving >= target detections per image (8 images)."""
    from pipelines.inference.openvino_runtime import CompiledIR, RuntimeSettings
    from pipelines.ops import yolact_postprocess as yp
    from pipelines.ops.image_decode import decode_image
    from pipelines.ops.preprocess import preprocess_rgb

    if manifest.model != "yolact":
        return None, float("nan")
    ir = CompiledIR(manifest.path("ir_xml"), RuntimeSettings(precision=precision, threads=1, streams=1))
    priors = np.load(manifest.path("priors"))
    raws = []
    for path in paths[:8]:
        out = ir.infer_one(preprocess_rgb(decode_image(path.read_bytes(), str(path)), manifest.input))
        raws.append({role: out[name] for role, name in manifest.outputs.items()})
    post = {k: manifest.postprocess[k] for k in ("nms_thresh", "top_k", "max_num_detections")}
    mean = 0.0
    for conf in (float(manifest.postprocess["conf_thresh"]), *CONF_STEPS):
        mean = float(
            np.mean([len(yp.detect(r["loc"], r["conf"], r["mask"], priors, conf_thresh=conf, **post)) for r in raws])
        )
        if mean >= target:
            return conf, mean
    return conf, mean


# ------------------------------------------------------------------------------------------------------ report
def ratio(value, ceiling):
    return round(value / ceiling, 3) if value and ceiling else None


def write_report(out: Path, facts: dict, args, results: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "executor.json").write_text(
        json.dumps({"machine": facts, "args": vars(args), "rows": results}, indent=2, default=str)
    )
    lines = [
        "# Executor function vs benchmark_app",
        "",
        f"{dt.datetime.now(dt.timezone.utc):%Y-%m-%d %H:%M} UTC. `{' '.join(sys.argv)}`",
        "",
        f"- CPU: {facts['cpu']}, {facts['cores']} cores, {facts['memory_gib']} GiB; instruction set: "
        f"{isa_text(facts['isa'])}; OpenVINO "
        f"{facts['openvino']}, Python {facts['python']}; 1-min load average at start {facts['load_average'][0]:.2f}"
        f", at end {os.getloadavg()[0]:.2f} (other work on the machine skews both sides of each ratio)",
        "- executor: `ImageInference.__call__` (what mapInArrow runs) in P spawned processes x 1 OpenVINO thread "
        "(1 stream), batches of %d, masks written (RLE + PNG label maps), every detection written; "
        "images/s = the sum over the processes of each one's images / its time from the common start to its end "
        "(the rate of P busy slots), after model load and one warm-up image, each process cycling over its share "
        "of the images for at least %g s; images / (last end - common start), which also counts the idle cores "
        "of the processes that ended first, is in the notes" % (args.batch_size, args.executor_seconds),
        "- benchmark_app: P streams x P threads (1 per stream), `-hint none`, same IR and precision, model only",
        f"- {args.rounds} rounds of [benchmark_app, model only, the variants], closed by one more benchmark_app: a "
        "ratio is the median over rounds of the variant's img/s over the mean of the benchmark_app runs just before "
        "and after it in that round (the machine's speed may drift over minutes); img/s columns: the median round",
        "- before: the previous per-image code (full-size masks, RLE and label map; tests/reference_postprocess.py)"
        "; after: the current code; boxes only: `output.masks: none`; jpeg_draft: after with "
        "`inference.jpeg_draft: true` (reduced-size JPEG decode: faster, but the model sees other pixels); pinned: "
        "after with `inference.pin_cores: true` (each process on a core of its own); thread (--thread): after with "
        "each image's inference run in the worker's own thread (`InferRequest.infer`) instead of OpenVINO's stream "
        "thread behind its async queue, the worker's thread waiting (bench only); overlap (--overlap): after with "
        "each image's decode and preprocess overlapping the previous image's inference (bench only)",
        "",
        "| model | input | precision | P | images (distinct, processed) | det/img | benchmark_app img/s | before img/s | before ratio | "
        "after img/s | after ratio | after/before | boxes only img/s | boxes only ratio | jpeg_draft img/s | "
        "jpeg_draft ratio | pinned img/s | pinned ratio | thread img/s | thread ratio | overlap img/s | "
        "overlap ratio |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {r['model']} | | {r['precision']} | {r['processes']} | failed: {r['error']} |" + " |" * 17)
            continue
        ceiling = r["benchmark_app"]["images_per_s"]
        v = r["variants"]
        get = lambda name, v=v: v.get(name, {}).get("images_per_s")  # noqa: E731
        rat = lambda name, r=r: round(r["ratios"][name], 3) if name in r["ratios"] else ""  # noqa: E731
        lines.append(
            f"| {r['model']} | {r['input']} | {r['precision']} | {r['processes']} | "
            f"{r.get('bench_images')}, {v['after']['images']} | "
            f"{v['after']['detections_per_image']} | {ceiling} | {get('before') or ''} | {rat('before')} | "
            f"{get('after')} | **{rat('after')}** | "
            f"{round(get('after') / get('before'), 2) if get('before') else ''} | {get('after_boxes') or ''} | "
            f"{rat('after_boxes')} | {get('after_draft') or ''} | {rat('after_draft')} | "
            f"{get('after_pinned') or ''} | {rat('after_pinned')} | {get('after_thread') or ''} | "
            f"{rat('after_thread')} | {get('after_overlap') or ''} | {rat('after_overlap')} |"
        )
    lines += [
        "",
        "## CPU time per image (robust to other work on the machine)",
        "",
        "CPU ms per image, summed over the P processes, over the timed loop (after load and warm-up): "
        "'model only' runs just the compiled IR's infer on the same preprocessed images in the same harness "
        "(processes, OpenVINO settings, batches), the ceiling that CPU time can be compared with. ratio = model "
        "only / variant; on a machine with nothing else running it approximates the img/s ratio.",
        "",
        "| model | precision | model only ms | " + " | ".join(f"{v} ms | {v} ratio" for v in VARIANTS) + " |",
        "|---|---|---|" + "---|---|" * len(VARIANTS),
    ]
    for r in results:
        if "variants" not in r:
            continue
        base = r.get("model_only", {}).get("cpu_s_per_image")
        cells = []
        for v in VARIANTS:
            cpu = r["variants"].get(v, {}).get("cpu_s_per_image")
            cells.append(f"{cpu * 1000:.1f} | {round(r['cpu_ratios'][v], 3)}" if cpu else " | ")
        lines.append(
            f"| {r['model']} | {r['precision']} | {base * 1000 if base else 0:.1f} | " + " | ".join(cells) + " |"
        )
    lines += [
        "",
        "## Per-stage split (ms per image, summed over processes; share of the summed stage time), peak RSS "
        "per process, and the kernel's scheduling per image",
        "",
        "Migrations: a thread of an executor process moved to another core; voluntary switches: one waited "
        "(for another thread, or I/O); involuntary: the kernel preempted it. Per image, over the P processes' "
        "threads.",
        "",
        "| model | precision | variant | "
        + " | ".join(STAGES)
        + " | peak RSS MiB per process | "
        + " | ".join(name for name, _ in SCHEDULER_COUNTS)
        + " |",
        "|---|---|---|" + "---|" * len(STAGES) + "---|" + "---|" * len(SCHEDULER_COUNTS),
    ]
    for r in results:
        measured = [("model only", r["model_only"])] if "model_only" in r else []
        measured += list(r.get("variants", {}).items())
        for name, v in measured:
            per = v["stage_s_per_image"]
            total = sum(per.values()) or 1.0
            # the model-only row times inference alone: its other stages are not measured, not 0
            cells = [
                "" if name == "model only" and not per[s] else f"{per[s] * 1000:.1f} ({100 * per[s] / total:.0f}%)"
                for s in STAGES
            ]
            sched = v.get("scheduler_per_image", {})
            lines.append(
                f"| {r['model']} | {r['precision']} | {name} | "
                + " | ".join(cells)
                + f" | {', '.join(str(m) for m in v['peak_rss_mib'])} | "
                + " | ".join(str(sched.get(count, "")) for count, _ in SCHEDULER_COUNTS)
                + " |"
            )
    separate = [r for r in results if r.get("benchmark_app_processes")]
    if separate:
        lines += [
            "",
            "## benchmark_app: P streams in one process against P processes x 1 stream",
            "",
            "The executors run the model as P processes, each with its own compiled copy of it (weights, "
            "caches); benchmark_app's streams share one. P processes of benchmark_app with 1 stream each, "
            "started together right after the P-stream run: how much of the model-only gap (CPU-time table) "
            "comes from running the model in separate processes rather than from the executor's code.",
            "",
            "| model | precision | P streams, 1 process img/s | P processes x 1 stream img/s | ratio | "
            "per process img/s |",
            "|---|---|---|---|---|---|",
        ]
        for r in separate:
            b = r["benchmark_app_processes"]
            lines.append(
                f"| {r['model']} | {r['precision']} | {b['streams_images_per_s']} | {b['images_per_s']} | "
                f"**{ratio(b['images_per_s'], b['streams_images_per_s'])}** | "
                f"{', '.join(f'{x:.1f}' for x in b['per_process'])} |"
            )
    jobs = [r for r in results if r.get("job")]
    if jobs:
        archive = (
            "yes"
            if all(r["job"].get("jvm_class_archive") for r in jobs)
            else "no (`make jvm-archive`: without it the fixed cost is ~2x)"
        )
        lines += [
            "",
            "## The Spark job against the executor function",
            "",
            "`jobs/infer_yolact.py` with `--master local[P]` (P tasks x 1 OpenVINO thread) and the rows' "
            "settings, over P x 8 images and over the large set (fresh outputs): its images/s beyond the fixed "
            "cost = (large images - small images) / (large wall - small wall), both walls timed from the "
            "command; fixed = the small run's wall minus its images at that rate. Rounds of [executor "
            "function, job small, job large] closed by one more executor run; a round's ratio is the job's "
            "img/s over the mean of the executor runs around it; the table has the median round. The driver JVM "
            f"mapped this env's class archive: {archive}.",
            "",
            "| model | precision | small: images, wall s | large: images, wall s | job img/s | fixed s | "
            "executor after img/s | job / executor (rounds) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in jobs:
            j = r["job"]
            lines.append(
                f"| {r['model']} | {r['precision']} | {j['small']['images']}, {j['small']['wall_s']} | "
                f"{j['large']['images']}, {j['large']['wall_s']} | {j['images_per_s']} | {j['fixed_s']} | "
                f"{j['executor_images_per_s']} | **{j['ratio']}** ({', '.join(map(str, j['rounds_ratios']))})"
                " |"
            )
    notes = [
        f"- {r['model']} {r['precision']}: conf_thresh {r['conf_thresh']} (manifest "
        f"{r['manifest_conf_thresh']}) for ~100 detections per image"
        for r in results
        if r.get("conf_thresh") is not None
    ]
    notes += [
        f"- {r['model']} {r['precision']}: benchmark_app runs {r['benchmark_app']['runs_images_per_s']} img/s "
        f"(the table has the median); ratios per round: after "
        f"{[round(x['ratios']['after'], 3) for x in r['rounds']]}; executor after img/s per round "
        f"{r['variants']['after']['rounds_images_per_s']}: `{r['benchmark_app']['command']}`"
        for r in results
        if "rounds" in r
    ]
    notes += [
        f"- {r['model']} {r['precision']}: images / (last end - common start), the median round: "
        + ", ".join(f"{name} {v['wall_images_per_s']} img/s" for name, v in r["variants"].items())
        for r in results
        if "variants" in r
    ]
    lines += report_lines(results)
    lines += draft_ap_lines(results)
    lines += ["", "## Notes", "", *notes, ""]
    (out / "executor.md").write_text("\n".join(lines), encoding="utf-8")


def measure_rounds(
    args, row: dict, manifest, precision: str, conf, variants: list[str], image_dir: Path, paths: list[Path], work: Path
) -> None:
    """--rounds rounds of [benchmark_app, model only, each variant], closed by one more benchmark_app: a variant's
    ratio in a round is its img/s over the mean of the benchmark_app runs just before and after it (this machine's
    speed drifts by 20 % over minutes: only neighbours in time compare). The row gets the median over rounds of
    every figure and of every ratio."""
    ceilings = [run_benchmark_app(manifest.path("ir_xml"), precision, args.processes, args.seconds)]
    if not args.no_process_ceiling and args.processes > 1:
        separate = run_benchmark_app_processes(manifest.path("ir_xml"), precision, args.processes, args.seconds)
        row["benchmark_app_processes"] = {**separate, "streams_images_per_s": ceilings[0]["images_per_s"]}
        log.info(
            "%s %s: benchmark_app as %d processes x 1 stream: %s img/s (%d streams in one: %s)",
            row["model"],
            precision,
            args.processes,
            separate["images_per_s"],
            args.processes,
            ceilings[0]["images_per_s"],
        )
    rounds = []
    for number in range(args.rounds):
        log.info(
            "%s %s, round %d: benchmark_app %s img/s", row["model"], precision, number + 1, ceilings[-1]["images_per_s"]
        )
        results = {
            "model_only": run_executor(
                make_task(manifest, "after", precision, conf, work / "scratch", image_dir),
                paths,
                args.processes,
                args.batch_size,
                args.timeout,
                model_only=True,
                min_seconds=args.executor_seconds,
            )
        }
        for variant in variants:
            output = work / "executor-out" / f"{manifest.model_sha256[:12]}-{precision}-{variant}"
            task = make_task(manifest, variant, precision, conf, output, image_dir)
            results[variant] = run_executor(
                task, paths, args.processes, args.batch_size, args.timeout, min_seconds=args.executor_seconds
            )
            log.info(
                "  %s: %s img/s, %s det/img, stages %s",
                variant,
                results[variant]["images_per_s"],
                results[variant]["detections_per_image"],
                results[variant]["stage_s_per_image"],
            )
        ceilings.append(run_benchmark_app(manifest.path("ir_xml"), precision, args.processes, args.seconds))
        ceiling = (ceilings[-2]["images_per_s"] + ceilings[-1]["images_per_s"]) / 2
        results["ratios"] = {v: results[v]["images_per_s"] / ceiling for v in ["model_only", *variants]}
        results["cpu_ratios"] = {
            v: results["model_only"]["cpu_s_per_image"] / results[v]["cpu_s_per_image"] for v in variants
        }
        rounds.append(results)

    def median_of(values):
        return round(statistics.median(values), 5)

    row["rounds"] = [{"ratios": r["ratios"], "cpu_ratios": r["cpu_ratios"]} for r in rounds]
    row["benchmark_app"] = {
        **ceilings[0],
        "images_per_s": median_of([c["images_per_s"] for c in ceilings]),
        "runs_images_per_s": [c["images_per_s"] for c in ceilings],
        "cpu_s_per_image": min(c["cpu_s_per_image"] for c in ceilings if c["cpu_s_per_image"]),
    }
    row["ratios"] = {v: median_of([r["ratios"][v] for r in rounds]) for v in rounds[0]["ratios"]}
    row["cpu_ratios"] = {v: median_of([r["cpu_ratios"][v] for r in rounds]) for v in variants}
    row["model_only"] = median_result([r["model_only"] for r in rounds])
    row["variants"] = {v: median_result([r[v] for r in rounds]) for v in variants}


def median_result(results: list[dict]) -> dict:
    """The round whose img/s is the median (the other rounds' img/s listed beside it)."""
    ordered = sorted(results, key=lambda r: r["images_per_s"])
    return {**ordered[len(ordered) // 2], "rounds_images_per_s": [r["images_per_s"] for r in results]}


MIN_JOB_IMAGES = 512  # the Spark job's large run, at least (small models; large ones: 4 x --large-model-images)


def measure_job(
    args, manifest, precision: str, conf, image_dir: Path, paths: list[Path], work: Path, min_large_count: int
) -> dict:
    """The Spark job (local[P], P tasks x 1 OpenVINO thread, the executor rows' settings: every detection written,
    masks as RLE + PNG) over P x 8 and over a large set of bench images (--job-images; by default enough for
    --job-seconds at the executor function's first measured rate, at least `min_large_count`): its images/s beyond
    its fixed cost, against the executor function ('after') in --rounds interleaved rounds [executor, job small,
    job large] closed by one more executor run. A round's ratio is the job's img/s over the mean of the executor
    runs around it (the machine's speed drifts: only neighbours in time compare); the result is the median round,
    with every round's figures beside it."""
    output = work / "executor-out" / f"{manifest.model_sha256[:12]}-{precision}-after"

    def executor_images_per_s() -> float:
        task = make_task(manifest, "after", precision, conf, output, image_dir)
        return run_executor(
            task, paths, args.processes, args.batch_size, args.timeout, min_seconds=args.executor_seconds
        )["images_per_s"]

    executor_runs, rounds = [executor_images_per_s()], []
    small_count = args.processes * 8
    large_count = args.job_images or max(min_large_count, math.ceil(executor_runs[0] * args.job_seconds))
    small = bench_images.make_images(work / f"images-executor-{small_count}", small_count, sizes=EXECUTOR_SIZES)
    large = bench_images.make_images(work / f"images-executor-{large_count}", large_count, sizes=EXECUTOR_SIZES)
    for number in range(args.rounds):
        log.info(
            "  Spark job, local[%d], round %d: %d and %d images", args.processes, number + 1, small_count, large_count
        )
        job = marginal_throughput(
            small,
            large,
            work / "scratch",
            [
                "--model",
                str(manifest.root),
                "--master",
                f"local[{args.processes}]",
                "--precision",
                precision,
                "--score-threshold",
                "0",
                "--masks",
                "rle_and_png",
                "--batch-size",
                str(args.batch_size),
            ],
        )
        executor_runs.append(executor_images_per_s())
        job["executor_images_per_s"] = round((executor_runs[-2] + executor_runs[-1]) / 2, 3)
        job["ratio"] = ratio(job["images_per_s"], job["executor_images_per_s"])
        log.info(
            "    job %s img/s beyond a fixed %s s; executor %s img/s around it: %s",
            job["images_per_s"],
            job["fixed_s"],
            job["executor_images_per_s"],
            job["ratio"],
        )
        rounds.append(job)
    ordered = sorted(rounds, key=lambda job: job["ratio"] or 0)
    return {
        **ordered[len(ordered) // 2],
        "rounds_ratios": [job["ratio"] for job in rounds],
        "rounds_images_per_s": [job["images_per_s"] for job in rounds],
        "executor_runs_images_per_s": executor_runs,
    }


# -------------------------------------------------------------------------------------------------------- main
def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--model",
        action="append",
        default=None,
        help="export directory (repeatable; default: samples/models/yolact_default)",
    )
    parser.add_argument(
        "--r50",
        action="store_true",
        help=f"also YOLACT-R50 550, random init (exported once to {R50_DIR.relative_to(REPO)}; minutes)",
    )
    parser.add_argument(
        "--detector",
        action="store_true",
        help=f"also the detector, random init (exported once to {DETECTOR_DIR.relative_to(REPO)})",
    )
    parser.add_argument(
        "--processes",
        "-P",
        type=int,
        default=os.cpu_count() or 1,
        help="executor processes = benchmark_app streams (default: all cores)",
    )
    parser.add_argument("--precisions", default="f32", help="comma-separated: f32, bf16")
    parser.add_argument("--images", type=int, default=128, help="bench images per row (default 128)")
    parser.add_argument(
        "--large-model-images",
        type=int,
        default=32,
        help="images for models with an input over 400 px (R50 550; default 32)",
    )
    parser.add_argument("--batch-size", type=int, default=8, help="images per Arrow batch (the job's default)")
    parser.add_argument("--seconds", type=int, default=15, help="benchmark_app duration (-t)")
    parser.add_argument(
        "--executor-seconds",
        type=float,
        default=None,
        help="each executor process cycles over its share of the images for at least this long "
        "(default: --seconds, benchmark_app's duration; 0: one pass)",
    )
    parser.add_argument(
        "--int8",
        action="store_true",
        help="also an INT8 copy of the bundled model (NNCF, scripts/bench/int8_model.py); on a machine "
        "without NNCF make it there and pass it with --model",
    )
    parser.add_argument("--no-before", action="store_true", help="skip the previous code's row")
    parser.add_argument("--no-boxes-only", action="store_true", help="skip the output.masks none row")
    parser.add_argument("--no-draft", action="store_true", help="skip the inference.jpeg_draft row")
    parser.add_argument("--no-pinned", action="store_true", help="skip the inference.pin_cores row")
    parser.add_argument(
        "--thread",
        action="store_true",
        help="also the row with each image's inference in the worker's own thread, not OpenVINO's "
        "stream thread behind the async queue (bench only)",
    )
    parser.add_argument(
        "--overlap",
        action="store_true",
        help="also the row with each image's decode overlapping the previous image's inference (bench only)",
    )
    parser.add_argument(
        "--no-process-ceiling",
        action="store_true",
        help="skip benchmark_app as P processes x 1 stream (run once per model and precision)",
    )
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of benchmark_app and the executor runs, interleaved; medians reported",
    )
    parser.add_argument("--no-job", action="store_true", help="skip the Spark job row")
    parser.add_argument(
        "--profile-images",
        type=int,
        default=32,
        help="images of the per-stage profile (the current code, one process, cProfile; 0: no profile)",
    )
    parser.add_argument(
        "--draft-ap-images",
        type=int,
        default=24,
        help="synthetic road images per size for the box and mask AP of inference.jpeg_draft against the full "
        "decode (YOLACT models, once per model; 0: skip)",
    )
    parser.add_argument(
        "--job-images",
        type=int,
        default=None,
        help="bench images of the Spark job's large run (its small run has P x 8); default: enough "
        f"for --job-seconds at the executor function's rate, at least {MIN_JOB_IMAGES} (4 x "
        "--large-model-images for large models)",
    )
    parser.add_argument(
        "--job-seconds",
        type=float,
        default=40,
        help="the large run's images are sized for at least this long beyond the small run "
        "(default 40: the job's fixed cost moves by 1-3 s between runs, ~5%% of 40 s; over "
        "768 images, 14-22 s of work, rounds of one run read 0.77-1.34)",
    )
    parser.add_argument("--work-dir", default=str(REPO / "work" / "bench"), help="images and scratch outputs")
    parser.add_argument("--out", default=str(REPO / "reports"), help="where executor.md and executor.json go")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before an executor run is abandoned")
    args = parser.parse_args(argv)
    if args.executor_seconds is None:
        args.executor_seconds = float(args.seconds)
    args.model = args.model or [str(REPO / "samples" / "models" / "yolact_default")]
    if args.int8:
        from bench.int8_model import BUNDLED, CALIBRATION_SEED, make_int8_model, synthetic_calibration

        int8_dir, _ = make_int8_model(
            BUNDLED,
            Path(args.work_dir) / "yolact_default_int8",
            synthetic_calibration(64),
            f"synthetic roads, seed {CALIBRATION_SEED}",
        )
        args.model.append(str(int8_dir))
    args.precisions = [p for p in args.precisions.split(",") if p]
    if any(p not in ("f32", "bf16") for p in args.precisions) or args.processes < 1 or args.images < 1:
        parser.error("--precisions takes f32 and/or bf16; --processes and --images must be >= 1")
    return args


def main(argv=None) -> int:
    logging.basicConfig(level=logging.INFO, format="[bench-executor %(asctime)s] %(message)s", datefmt="%H:%M:%S")
    args = parse_args(argv)
    from pipelines.inference.model_manifest import load_manifest

    facts = cpu_facts()
    log.info("%s, %s cores, %s; P = %d", facts["cpu"], facts["cores"], facts["best_isa"], args.processes)
    work = Path(args.work_dir)
    results = []
    for name, model_dir in model_rows(args):
        manifest = load_manifest(model_dir, verify=True)
        _, _, in_h, in_w = manifest.input["shape"]
        large_model = max(in_h, in_w) > 400
        count = args.large_model_images if large_model else args.images
        # whole cycles of the sizes for every process (process_shares): fewer would leave processes without images
        whole = args.processes * len(EXECUTOR_SIZES)
        count = -(-count // whole) * whole
        image_dir = bench_images.make_images(work / f"images-executor-{count}", count, sizes=EXECUTOR_SIZES)
        paths = bench_images.image_paths(image_dir)
        for precision in args.precisions:
            row = {
                "model": name,
                "model_dir": str(model_dir),
                "input": f"{in_w}x{in_h}",
                "precision": precision,
                "processes": args.processes,
                "bench_images": len(paths),
                "manifest_conf_thresh": manifest.postprocess.get("conf_thresh"),
            }
            try:
                conf, mean = calibrate_conf(manifest, paths, precision, target=90)
                row.update(conf_thresh=conf, calibration_detections=mean)
                variants = [
                    v
                    for v in VARIANTS
                    if not (v == "before" and args.no_before)
                    and not (v == "after_boxes" and (args.no_boxes_only or manifest.model != "yolact"))
                    and not (v == "after_draft" and args.no_draft)
                    and not (v == "after_pinned" and args.no_pinned)
                    and not (v == "after_thread" and not args.thread)
                    and not (v == "after_overlap" and not args.overlap)
                ]
                measure_rounds(args, row, manifest, precision, conf, variants, image_dir, paths, work)
                if args.profile_images:
                    row["stage_profile"] = profile_in_child(
                        make_task(manifest, "after", precision, conf, work / "scratch", image_dir),
                        paths[: args.profile_images],
                        args.batch_size,
                    )
                if args.draft_ap_images and manifest.model == "yolact" and precision == args.precisions[0]:
                    row["draft_ap"] = draft_ap(model_dir, work, args.draft_ap_images)
                if not args.no_job and manifest.model == "yolact" and conf == row["manifest_conf_thresh"]:
                    row["job"] = measure_job(
                        args,
                        manifest,
                        precision,
                        conf,
                        image_dir,
                        paths,
                        work,
                        4 * count if large_model else MIN_JOB_IMAGES,
                    )
            except Exception as err:  # noqa: BLE001  (one failed row must not lose the others)
                log.exception("%s %s failed", name, precision)
                row["error"] = f"{type(err).__name__}: {err}"[:300]
            results.append(row)
            write_report(Path(args.out), facts, args, results)
    log.info("wrote %s", Path(args.out) / "executor.md")
    return 0 if all("error" not in r for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
