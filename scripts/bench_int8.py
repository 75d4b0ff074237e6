"""INT8 vs f32 (and bf16 where the CPU has it) on this machine, in one run: writes reports/int8.md.

The bundled default YOLACT (samples/models/yolact_default, trained on the synthetic road generator) is quantized
the way `python -m model_export yolact --precision int8` does (model_export.quantize: NNCF PTQ of the FP16 IR,
calibration images decoded and preprocessed as the job does) on synthetic road images of a seed neither training
nor the val split uses. Then, on a fresh synthetic val split (the one tests/fixtures_evaluation.py uses):
- benchmark_app throughput (model only): FP16-weights IR with f32 (and bf16) inference precision, INT8 IR;
- detection agreement INT8 vs f32 (the export gate's matcher, model_export.parity), at the gate's score and all;
- mask and box AP of both against the generator's masks (pipelines.report.evaluate, the one AP implementation).
The bundled detector (samples/models/detector_default) the same way, with the detector export's ignored scope:
benchmark_app f32 vs INT8, detection agreement at its score threshold, box AP on the same val split.

    .venv/bin/python scripts/bench_int8.py [--seconds 15] [--calibration-count 64] [--val-images 40]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench.benchmark_app import run_benchmark_app  # noqa: E402
from bench.int8_model import BUNDLED, CALIBRATION_SEED, make_int8_model  # noqa: E402
from bench.machine import cpu_model_and_flags  # noqa: E402

from model_export import (
    detector_export,  # noqa: E402
    quantize,  # noqa: E402
)
from model_export.parity import detection_agreement  # noqa: E402
from model_export.yolact_export import INT8_GATE_SCORE  # noqa: E402
from pipelines.inference.model_manifest import load_manifest  # noqa: E402
from pipelines.inference.openvino_runtime import CompiledIR, RuntimeSettings, cpu_count  # noqa: E402
from pipelines.ops import yolact_postprocess as yp  # noqa: E402

VAL_SEED = 20261122
DETECTOR = REPO / "samples" / "models" / "detector_default"
ISA_FLAGS = ("amx_int8", "amx_bf16", "avx512_vnni", "avx512_bf16", "avx512f", "avx_vnni", "avx2")
ROAD_GROUPS = {"blobs": ("pothole", "patch", "puddle"), "crack": ("crack",)}


def cpu_info() -> dict:
    model, flags = cpu_model_and_flags()
    return {
        "model": model,
        "cpus": cpu_count(),
        "flags": [f for f in ISA_FLAGS if f in flags],
        "bf16": bool({"amx_bf16", "avx512_bf16"} & flags),
    }


def agreement(f32_dir: Path, int8_dir: Path, images: list) -> dict:
    """The export gate's comparison on these images (both IRs with the f32 hint), at the gate's score and at all
    the detections the job writes (conf_thresh)."""
    manifest = load_manifest(f32_dir)
    priors = np.load(manifest.path("priors"))
    post = manifest.postprocess
    tensors = [quantize.preprocess_rgb(rgb, manifest.input) for _, _, rgb in images]
    sizes = [(rgb.shape[1], rgb.shape[0]) for _, _, rgb in images]
    rows = {}
    for name, model_dir in (("f32", f32_dir), ("int8", int8_dir)):
        ir = CompiledIR(load_manifest(model_dir).path("ir_xml"), RuntimeSettings(precision="f32"))
        rows[name] = [ir.infer_one(x) for x in tensors]
    result = {}
    for min_score in (INT8_GATE_SCORE, float(post["conf_thresh"])):
        dets = {
            name: [
                d.take(d.scores >= min_score)
                for d in (yp.detect(r["loc"], r["conf"], r["mask"], priors, **post) for r in rows[name])
            ]
            for name in rows
        }
        result[min_score] = detection_agreement(
            dets["f32"], dets["int8"], [r["proto"] for r in rows["f32"]], [r["proto"] for r in rows["int8"]], sizes
        )
    return result


def detector_agreement(f32_dir: Path, int8_dir: Path, images: list) -> dict:
    """The detector export's gate comparison (label + box IoU >= 0.5) on these images at the manifest's score
    threshold, both IRs with the f32 hint."""
    manifest = load_manifest(f32_dir)
    score = float(manifest.postprocess["score_thresh"])
    tensors = [quantize.preprocess_rgb(rgb, manifest.input) for _, _, rgb in images]
    dets = {}
    for name, model_dir in (("f32", f32_dir), ("int8", int8_dir)):
        ir = CompiledIR(load_manifest(model_dir).path("ir_xml"), RuntimeSettings(precision="f32"))
        dets[name] = [detector_export.valid_detections(ir.infer_one(x), score) for x in tensors]
    return {"min_score": score, **detector_export.detection_agreement(dets["f32"], dets["int8"])}


def mask_ap(model_dir: Path, val: Path, iou_types: tuple[str, ...] = ("bbox", "segm")) -> dict:
    from pipelines.inference.single_process import infer_files
    from pipelines.report.evaluate import ap_report, load_ground_truth, results_from_rows

    ground_truth = load_ground_truth(val / "annotations.json")
    image_ids = {Path(im["file_name"]).name: im["id"] for im in ground_truth.dataset["images"]}
    category_ids = {c["name"]: c["id"] for c in ground_truth.dataset["categories"]}
    paths = sorted((val / "images").iterdir())
    with tempfile.TemporaryDirectory() as out:
        rows = infer_files(model_dir, paths, out, str(val / "images"), RuntimeSettings(precision="f32"))
    return ap_report(ground_truth, results_from_rows(rows, image_ids, category_ids), ROAD_GROUPS, iou_types)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=int, default=15, help="benchmark_app -t per row")
    parser.add_argument("--calibration-count", type=int, default=64)
    parser.add_argument("--val-images", type=int, default=40)
    parser.add_argument("--out", default=str(REPO / "reports" / "int8.md"))
    args = parser.parse_args(argv)
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset

    cpu = cpu_info()
    with tempfile.TemporaryDirectory(prefix="bench_int8_") as tmp:
        work = Path(tmp)
        generate_road_dataset(
            work / "calibration", args.calibration_count, CALIBRATION_SEED, RoadSceneConfig(formats=())
        )
        generate_road_dataset(work / "val", args.val_images, VAL_SEED, RoadSceneConfig(formats=("coco",)))
        calibration, _ = quantize.decode_all(sorted((work / "calibration" / "images").iterdir()))
        val_images, _ = quantize.decode_all(sorted((work / "val" / "images").iterdir()))
        int8_dir, record = make_int8_model(
            BUNDLED,
            work / "yolact_default_int8",
            calibration[: args.calibration_count],
            f"synthetic roads, seed {CALIBRATION_SEED}",
        )
        agree = agreement(BUNDLED, int8_dir, val_images)
        ap = {"f32": mask_ap(BUNDLED, work / "val"), "int8": mask_ap(int8_dir, work / "val")}
        streams = cpu["cpus"]
        rows = [("f32", BUNDLED / "model.xml", "f32"), ("int8", int8_dir / "model.int8.xml", "f32")]
        if cpu["bf16"]:
            rows += [("bf16", BUNDLED / "model.xml", "bf16"), ("int8 (bf16 rest)", int8_dir / "model.int8.xml", "bf16")]
        bench = {}
        for n in (streams, 1):  # f32 and INT8 back to back per stream count: the same machine load
            for label, xml, precision in rows:
                bench[(label, n)] = run_benchmark_app(xml, precision, n, args.seconds)
                print(label, n, bench[(label, n)]["images_per_s"], bench[(label, n)]["cpu_ms_per_image"], flush=True)
        detector = bench_detector(work, calibration[: args.calibration_count], val_images, cpu, args)
    write_report(Path(args.out), cpu, record, agree, ap, bench, args, detector)
    print(f"wrote {args.out}")
    return 0


def bench_detector(work: Path, calibration: list, val_images: list, cpu: dict, args) -> dict:
    """The bundled detector: INT8 copy with the export's ignored scope, agreement, box AP, benchmark_app f32/INT8."""
    int8_dir, record = make_int8_model(
        DETECTOR,
        work / "detector_default_int8",
        calibration,
        f"synthetic roads, seed {CALIBRATION_SEED}",
        detector_export.INT8_IGNORED_SCOPE,
    )
    result = {
        "quantization": record,
        "agreement": detector_agreement(DETECTOR, int8_dir, val_images),
        "ap": {"f32": mask_ap(DETECTOR, work / "val", ("bbox",)), "int8": mask_ap(int8_dir, work / "val", ("bbox",))},
        "benchmark_app": {},
    }
    for label, xml in (("f32", DETECTOR / "model.xml"), ("int8", int8_dir / "model.int8.xml")):
        result["benchmark_app"][label] = run_benchmark_app(xml, "f32", cpu["cpus"], args.seconds)
        print("detector", label, result["benchmark_app"][label]["images_per_s"], flush=True)
    return result


def detector_lines(detector: dict, args) -> list[str]:
    agree, ap, bench, record = (detector[k] for k in ("agreement", "ap", "benchmark_app", "quantization"))
    lines = [
        "",
        "## The bundled detector (samples/models/detector_default)",
        "",
        f"INT8: NNCF {record['nncf']} PTQ of its FP16 IR on the same calibration images, the export's ignored "
        f"scope ({', '.join(detector_export.INT8_IGNORED_SCOPE)}: RPN and RoI heads stay float), "
        f"{record['fake_quantize_nodes']} FakeQuantize nodes.",
        "",
        "| | f32 | INT8 | INT8 / f32 |",
        "|---|---|---|---|",
    ]
    f32, int8 = bench["f32"], bench["int8"]
    lines.append(
        f"| benchmark_app img/s ({args_streams(bench)} streams) | {f32['images_per_s']:.1f} | "
        f"{int8['images_per_s']:.1f} | {int8['images_per_s'] / f32['images_per_s']:.2f}x |"
    )
    if f32["cpu_ms_per_image"] and int8["cpu_ms_per_image"]:
        lines.append(
            f"| CPU ms per image | {f32['cpu_ms_per_image']} | {int8['cpu_ms_per_image']} | "
            f"{f32['cpu_ms_per_image'] / int8['cpu_ms_per_image']:.2f}x less |"
        )
    for key in ("box_ap", "box_ap50", "box_ap_blobs"):
        if key in ap["f32"]:
            a, b = ap["f32"][key], ap["int8"][key]
            lines.append(f"| {key} | {100 * a:.2f} | {100 * b:.2f} | {100 * (b - a):+.2f} points |")
    lines += [
        "",
        f"Detection agreement at score > {agree['min_score']:g} ({args.val_images} val images): f32 "
        f"{agree['detections_ref']} dets, INT8 {agree['detections']}, matched {agree['matched_fraction']:.3f}, "
        f"median box IoU {agree['box_iou_median']:.4f}.",
        "",
        "Goal: box AP within 1.0 point of f32; detection agreement >= 0.95.",
        "",
    ]
    return lines


def args_streams(bench: dict) -> str:
    return bench["f32"]["command"].split("-nstreams ")[1].split()[0]


def write_report(path: Path, cpu: dict, record: dict, agree: dict, ap: dict, bench: dict, args, detector: dict) -> None:
    f32 = {n: bench[("f32", n)] for (label, n) in bench if label == "f32"}
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    lines = [
        "# INT8 vs f32 (the bundled YOLACT and detector)",
        "",
        f"- CPU: {cpu['model']}, {cpu['cpus']} cores available; instruction set: "
        f"{', '.join(cpu['flags']) or 'none of ' + ', '.join(ISA_FLAGS)} "
        f"(checked: {', '.join(ISA_FLAGS)}); bf16 rows: {'yes' if cpu['bf16'] else 'no (no AMX/AVX-512 BF16)'}",
        f"- Date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; command: "
        f"`.venv/bin/python scripts/bench_int8.py --seconds {args.seconds} --calibration-count "
        f"{args.calibration_count} --val-images {args.val_images}` (`make bench-int8`)",
        f"- Model: samples/models/yolact_default (yolact_r18_small, trained, {load_manifest(BUNDLED).input_size[0]} px)."
        f" INT8: NNCF {record['nncf']} PTQ ({record['preset']} preset, fast bias correction) of its FP16 IR on "
        f"{record['calibration']['count']} synthetic road images (seed {CALIBRATION_SEED}), "
        f"{record['fake_quantize_nodes']} FakeQuantize nodes, no ignored scope, {record['seconds']} s.",
        "",
        "## benchmark_app (model only, `-hint none`, streams x 1 thread each)",
        "",
        f"Load average at the end: {load:.1f} on {cpu['cpus']} cores (other jobs share this machine: img/s is "
        "noisy; CPU ms per image, i.e. CPU time / inferences, is the steadier figure).",
        "",
        "| IR | inference precision | streams | img/s | median latency ms | CPU ms/img | img/s vs f32 | "
        "CPU time f32 / this |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (label, n), row in bench.items():
        precision = "bf16" if "bf16" in label else "f32"
        cpu_ratio = (
            f"{f32[n]['cpu_ms_per_image'] / row['cpu_ms_per_image']:.2f}x"
            if row["cpu_ms_per_image"] and f32[n]["cpu_ms_per_image"]
            else "-"
        )
        lines.append(
            f"| {'INT8' if label.startswith('int8') else 'FP16 weights'} | {precision} | {n} | "
            f"{row['images_per_s']:.1f} | {row['median_ms']} | {row['cpu_ms_per_image']} | "
            f"{row['images_per_s'] / f32[n]['images_per_s']:.2f}x | {cpu_ratio} |"
        )
    lines += [
        "",
        "Goal: INT8 >= 1.3x f32 on AVX2-only CPUs, >= 2.5x with AVX-512 VNNI or AMX.",
        "",
        f"## Detection agreement INT8 vs f32 ({args.val_images} held-out synthetic val images, seed {VAL_SEED})",
        "",
        "Matched by class and box IoU >= 0.5 (model_export.parity, the export gate's matcher); both IRs with "
        "the f32 hint.",
        "",
        "| detections scoring >= | f32 dets | INT8 dets | matched | median box IoU | median mask IoU |",
        "|---|---|---|---|---|---|",
    ]
    for min_score, row in agree.items():
        lines.append(
            f"| {min_score:g}{' (gate)' if min_score == INT8_GATE_SCORE else ''} | {row['detections_ref']} | "
            f"{row['detections']} | {row['matched_fraction']:.3f} | {row['box_iou_median']:.4f} | "
            f"{row['mask_iou_median']:.4f} |"
        )
    lines += [
        "",
        "## AP against the generator's masks (pipelines.report.evaluate, all detections the job writes)",
        "",
        "| metric | f32 | INT8 | delta (points) |",
        "|---|---|---|---|",
    ]
    for key in ("mask_ap", "mask_ap50", "mask_ap_blobs", "box_ap", "box_ap50"):
        if key in ap["f32"]:
            a, b = ap["f32"][key], ap["int8"][key]
            lines.append(f"| {key} | {100 * a:.2f} | {100 * b:.2f} | {100 * (b - a):+.2f} |")
    lines += ["", "Goal: mask AP within 1.0 point of f32; detection agreement >= 0.95."]
    lines += detector_lines(detector, args)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    (path.with_suffix(".json")).write_text(
        json.dumps(
            {
                "cpu": cpu,
                "quantization": record,
                "ap": ap,
                "agreement": {str(k): v for k, v in agree.items()},
                "benchmark_app": {f"{k[0]} x{k[1]}": v for k, v in bench.items()},
                "detector": detector,
            },
            indent=2,
        )
        + "\n",
        encoding="utf-8",
    )


if __name__ == "__main__":
    sys.exit(main())
