"""`python -m model_export detector`: the road-distress detector (FactorNet Faster R-CNN) PyTorch -> ONNX ->
simplified ONNX -> OpenVINO FP16 IR, parity report and manifest.json (the contract every later stage reads).

The graph (`DetectorNetwork`) takes the normalized, resized image: torchvision's GeneralizedRCNNTransform
(bilinear resize to the fixed input size, then (x - mean) / std) is not in the graph but in our preprocessing, as
the manifest's `input` spec says (mean/std on 0-255 RGB). Its outputs are a fixed number of rows (the config's
box_detections_per_img; rows past the detections are zeros), boxes in network-input pixels; the job's
postprocess (`pipelines.inference.detector_inference`) drops the padding and scales boxes to the original image.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from model_export import onnx_openvino as conv
from model_export import quantize
from model_export.models.checkpoint import CheckpointError, read_state_dict
from model_export.models.factornet_detector import (
    DETECTOR_CONFIGS,
    DetectorNetwork,
    FactorNetDetector,
    bias_box_predictor,
    get_detector_config,
)
from model_export.parity import match_detections, raw_differences, runtime_outputs
from pipelines.datasets.synthetic_roads import RoadSceneConfig, render_scene
from pipelines.inference.model_manifest import write_manifest
from pipelines.ops.image_decode import decode_image
from pipelines.ops.preprocess import preprocess_rgb
from pipelines.ops.yolact_postprocess import Detections

INPUT_NAME = "image"
OUTPUT_NAMES = ["boxes", "scores", "labels"]
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
PARITY_BIASED_LABELS = (1, 2)  # random weights: these labels get detected (pothole, crack)
SYNTHETIC_PARITY_SIZE = (300, 400)  # (height, width) of the default parity images: not the input size, on purpose
F32_RUNTIMES = ("onnxruntime", "openvino_fp32ir_f32")
# INT8: the RPN and RoI heads stay in float: quantized, they move the RoI scores enough that far fewer detections
# match f32's. They are a small part of the compute (the backbone is most).
INT8_IGNORED_SCOPE = (".*/rpn/.*", ".*/roi_heads/.*")


@dataclass(frozen=True)
class DetectorParityGate:
    """Thresholds the export must meet. Detections are matched as sets (same label, box IoU >= 0.5); a matched
    pair is "reproduced" when its boxes are equal within `box_rel` (|d| / max(|torch coordinate|, 1 px)).

    ONNX Runtime and OpenVINO f32 on the FP32-weights IR: at least `min_reproduced` of torch's detections
    reproduced (a near-tie in an NMS may flip a few). The shipped FP16-weights IR run in f32: `fp16_min_matched`
    and a median matched box IoU >= `fp16_min_median_box_iou` (FP16 weights move scores by 1e-3..1e-2, enough to
    flip near-tied NMS decisions; a broken conversion matches almost nothing). bf16 (the device default on
    AVX512-BF16 CPUs) is reported, not gated. torchvision's own transform (resize + normalize in torch) against our
    preprocessing: `transform_min_matched`.
    """

    box_rel: float = 1e-3
    min_reproduced: float = 0.95
    fp16_min_matched: float = 0.8
    fp16_min_median_box_iou: float = 0.95
    transform_min_matched: float = 0.9

    def as_dict(self) -> dict:
        return asdict(self)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, choices=sorted(DETECTOR_CONFIGS), help="model configuration")
    parser.add_argument(
        "--weights",
        help="a .pth checkpoint of this config (a state_dict, or a dict holding one under 'model' or 'state_dict')",
    )
    parser.add_argument(
        "--random-init",
        action="store_true",
        help="random weights with a biased box predictor (tests and benchmarks only)",
    )
    parser.add_argument("--out", required=True, help="export directory to create")
    parser.add_argument("--opset", type=int, default=11, help="ONNX opset (>= 11)")
    parser.add_argument(
        "--input-size", help="network input HEIGHTxWIDTH or SIDE, multiples of 32 (default: the config's)"
    )
    parser.add_argument("--class-names", help="comma-separated foreground class names (default: the config's)")
    parser.add_argument("--seed", type=int, default=0, help="seed for --random-init")
    parser.add_argument("--parity-images", help="directory of images (default: synthetic road images, generated)")
    parser.add_argument("--parity-count", type=int, default=4, help="how many parity images to use")
    for field, value in DetectorParityGate().as_dict().items():
        parser.add_argument(f"--gate-{field.replace('_', '-')}", type=float, default=value, dest=f"gate_{field}")
    quantize.add_arguments(parser, iou_name="box", default_ignored=INT8_IGNORED_SCOPE)


def parse_input_size(text: str) -> tuple[int, int]:
    """ "320" -> (320, 320); "480x640" -> (480, 640) (height x width)."""
    try:
        parts = [int(v) for v in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts *= 2
    if len(parts) != 2:
        raise SystemExit(f"error: --input-size {text!r}: give SIDE or HEIGHTxWIDTH in pixels, e.g. 320 or 480x640")
    return parts[0], parts[1]


def build_model(args: argparse.Namespace) -> tuple[FactorNetDetector, dict]:
    conv.require_weights_choice(args.weights, args.random_init, "a trained detector checkpoint")
    overrides = {}
    if args.input_size:
        overrides["input_size"] = parse_input_size(args.input_size)
    if args.class_names:
        overrides["class_names"] = conv.class_names_flag(args.class_names)
    try:
        cfg = get_detector_config(args.config, **overrides)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    torch.manual_seed(args.seed)
    model = FactorNetDetector(cfg).eval()
    if args.weights:
        loaded = load_detector_checkpoint(model, args.weights)
        weights = {
            "source": Path(args.weights).name,
            "random_init": False,
            "trained": True,
            "load_report": f"loaded {loaded} tensors",
        }
    else:
        calibration = torch.from_numpy(
            preprocess_rgb(synthetic_road_images(1, args.seed + 1, cfg.input_size)[0][1], input_spec(cfg))
        )[None]
        labels = [label for label in PARITY_BIASED_LABELS if label < cfg.num_classes]
        bias_box_predictor(model, labels, calibration)
        weights = {
            "source": "random-init",
            "seed": args.seed,
            "random_init": True,
            "trained": False,
            "biased_labels": labels,
        }
    return model, weights


def load_detector_checkpoint(model: FactorNetDetector, path: str | Path) -> int:
    """Copy a checkpoint's tensors into `model` (every key must fit); returns how many were loaded."""
    state = read_state_dict(path)
    expected = model.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    wrong = sorted(k for k in set(expected) & set(state) if tuple(expected[k].shape) != tuple(state[k].shape))
    if missing or unexpected or wrong:
        details = "; ".join(
            f"{label} {len(keys)}: {', '.join(keys[:8])}{' ...' if len(keys) > 8 else ''}"
            for label, keys in (("missing", missing), ("unexpected", unexpected), ("shape differs", wrong))
            if keys
        )
        raise CheckpointError(
            f"checkpoint {path} does not fit detector config {model.cfg.name!r} ({details}): "
            "pass the --config (and --class-names / --input-size) it was trained with"
        )
    model.load_state_dict(state)
    return len(state)


def input_spec(cfg) -> dict:
    height, width = cfg.input_size
    return {
        "name": INPUT_NAME,
        "shape": [1, 3, height, width],
        "layout": "NCHW",
        "dtype": "float32",
        "channel_order": "RGB",
        "mean": list(cfg.mean_255),
        "std": list(cfg.std_255),
        "resize": {
            "size": [height, width],
            "mode": "bilinear",
            "align_corners": False,
            "antialias": False,
            "keep_aspect_ratio": False,
        },
        "transform": "torchvision GeneralizedRCNNTransform (fixed_size resize, normalize) is done by this "
        "preprocessing, not in the graph",
    }


def synthetic_road_images(count: int, seed: int, size: tuple[int, int]) -> list[tuple[str, np.ndarray]]:
    """`count` synthetic road-distress images ([H, W, 3] uint8 RGB, size = (height, width)), generated in memory."""
    config = RoadSceneConfig(width=size[1], height=size[0], min_instances=2, max_instances=5)
    return [
        (f"synthetic_road_{seed}_{i}", render_scene(np.random.default_rng([seed, i]), config).image)
        for i in range(count)
    ]


def parity_images(directory: str | None, count: int) -> list[tuple[str, np.ndarray]]:
    if directory is None:
        return synthetic_road_images(count, 2024, SYNTHETIC_PARITY_SIZE)
    paths = sorted(p for p in Path(directory).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)[:count]
    if not paths:
        raise SystemExit(f"error: no images in --parity-images {directory}")
    return [(p.name, decode_image(p.read_bytes(), str(p))) for p in paths]


# ------------------------------------------------------------------------------------------------ parity
def valid_detections(raw: dict, score_thresh: float) -> Detections:
    """One image's padded outputs -> its detections (score > threshold, label > 0); classes are the labels."""
    keep = (raw["scores"] > score_thresh) & (raw["labels"] > 0)
    return Detections(
        boxes=np.asarray(raw["boxes"][keep], np.float32),
        coeffs=np.zeros((int(keep.sum()), 0)),
        classes=np.asarray(raw["labels"][keep], np.int64),
        scores=np.asarray(raw["scores"][keep], np.float32),
    )


def detection_agreement(reference: list[Detections], other: list[Detections], box_rel: float = 1e-3) -> dict:
    """Over all images: counts, matched fraction (same label, box IoU >= 0.5), reproduced fraction (matched with
    every coordinate within `box_rel` relative), matched boxes' IoU, largest coordinate difference (pixels, and
    relative to max(|torch coordinate|, 1)), largest score difference."""
    n_ref = n_other = 0
    ious, abs_diffs, rel_diffs, score_diffs = [], [], [], []
    for ref, out in zip(reference, other):
        n_ref, n_other = n_ref + len(ref), n_other + len(out)
        for i, j, iou in match_detections(ref, out):
            diff = np.abs(ref.boxes[i].astype(np.float64) - out.boxes[j])
            ious.append(iou)
            abs_diffs.append(float(diff.max()))
            rel_diffs.append(float(np.max(diff / np.maximum(np.abs(ref.boxes[i]), 1.0))))
            score_diffs.append(abs(float(ref.scores[i]) - float(out.scores[j])))
    denominator = max(n_ref, n_other)
    return {
        "detections_ref": n_ref,
        "detections": n_other,
        "matched_fraction": len(ious) / denominator if denominator else 1.0,
        "reproduced_fraction": sum(r <= box_rel for r in rel_diffs) / denominator if denominator else 1.0,
        "box_iou_median": float(np.median(ious)) if ious else None,
        "box_iou_min": float(np.min(ious)) if ious else None,
        "box_max_abs": max(abs_diffs) if abs_diffs else None,
        "box_max_rel": max(rel_diffs) if rel_diffs else None,
        "score_max_abs": max(score_diffs) if score_diffs else None,
    }


def torchvision_transform_detections(
    model: FactorNetDetector, images: list[tuple[str, np.ndarray]], score_thresh: float
) -> list[Detections]:
    """The model's own torchvision path (GeneralizedRCNNTransform resize + normalize, boxes scaled back to the
    image) on 0-1 RGB, boxes mapped to network-input pixels: checks that our preprocessing is that transform."""
    height, width = model.cfg.input_size
    detections = []
    with torch.no_grad():
        for _, rgb in images:
            result = model([torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0])[0]
            scale = np.float32([width / rgb.shape[1], height / rgb.shape[0]] * 2)
            found = valid_detections({k: v.numpy() for k, v in result.items()}, score_thresh)
            detections.append(dataclasses.replace(found, boxes=found.boxes * scale))
    return detections


def run_parity(
    model: FactorNetDetector,
    out: Path,
    files: dict,
    spec: dict,
    score_thresh: float,
    images: list[tuple[str, np.ndarray]],
    gate: DetectorParityGate,
) -> dict:
    """Run torch, ONNX Runtime and OpenVINO (FP32 IR in f32; FP16 IR in f32 and in the device default) on the
    images; compare raw outputs and detections with torch."""
    network = DetectorNetwork(model).eval()
    tensors = [preprocess_rgb(rgb, spec) for _, rgb in images]
    outputs = runtime_outputs(
        network, tensors, out / files["onnx_simplified"], out / files["ir_xml"], INPUT_NAME, OUTPUT_NAMES
    )

    reference = [valid_detections(r, score_thresh) for r in outputs["torch"]]
    rows = {}
    for name, rows_out in outputs.items():
        rows[name] = {
            "raw": raw_differences(outputs["torch"], rows_out),
            "labels_identical": all(
                np.array_equal(r["labels"], o["labels"]) for r, o in zip(outputs["torch"], rows_out)
            ),
            "detections": detection_agreement(
                reference, [valid_detections(o, score_thresh) for o in rows_out], gate.box_rel
            ),
        }
    transform = detection_agreement(
        reference, torchvision_transform_detections(model, images, score_thresh), gate.box_rel
    )
    failures = gate_failures(rows, transform, gate)
    return {
        "images": [name for name, _ in images],
        "gate": gate.as_dict(),
        "runtimes": rows,
        "torchvision_transform": transform,
        "passed": not failures,
        "failures": failures,
    }


def gate_failures(rows: dict, transform: dict, gate: DetectorParityGate) -> list[str]:
    failures = []
    if rows["torch"]["detections"]["detections"] == 0:
        failures.append(
            "torch: no detections on the parity images: nothing to compare (use other "
            "--parity-images, or check the weights)"
        )
    for runtime in F32_RUNTIMES:
        det = rows[runtime]["detections"]
        if det["reproduced_fraction"] < gate.min_reproduced:
            failures.append(
                f"{runtime}: {det['reproduced_fraction']:.3f} of torch's detections reproduced (same "
                f"label, boxes within {gate.box_rel:g} relative) < {gate.min_reproduced}"
            )
    det = rows["openvino_fp16ir_f32"]["detections"]
    if det["matched_fraction"] < gate.fp16_min_matched:
        failures.append(f"openvino_fp16ir_f32: matched {det['matched_fraction']:.3f} < {gate.fp16_min_matched}")
    if det["box_iou_median"] is not None and det["box_iou_median"] < gate.fp16_min_median_box_iou:
        failures.append(
            f"openvino_fp16ir_f32: median box IoU {det['box_iou_median']:.4f} < {gate.fp16_min_median_box_iou}"
        )
    if transform["matched_fraction"] < gate.transform_min_matched:
        failures.append(
            f"torchvision transform vs our preprocessing: matched {transform['matched_fraction']:.3f} "
            f"< {gate.transform_min_matched}"
        )
    return failures


def format_table(rows: dict, transform: dict) -> str:
    """A fixed-width table of the parity rows for the terminal."""

    def number(value, spec):
        return "-" if value is None else format(value, spec)

    header = [
        "runtime",
        "dets",
        "matched",
        "reproduced",
        "labels same",
        "boxIoU med/min",
        "box max|d| px/rel",
        "score max|d|",
    ]
    lines = [header]
    for name, det, same in [(n, r["detections"], r["labels_identical"]) for n, r in rows.items()] + [
        ("torchvision_transform", transform, None)
    ]:
        lines.append(
            [
                name,
                str(det["detections"]),
                f"{det['matched_fraction']:.3f}",
                f"{det['reproduced_fraction']:.3f}",
                "-" if same is None else str(same),
                f"{number(det['box_iou_median'], '.4f')}/{number(det['box_iou_min'], '.4f')}",
                f"{number(det['box_max_abs'], '.2e')}/{number(det['box_max_rel'], '.2e')}",
                number(det["score_max_abs"], ".2e"),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in lines)


# ------------------------------------------------------------------------------------------------ export
def export(args: argparse.Namespace) -> dict:
    """Run every stage; returns the parity report. Raises ParityFailed (no manifest written) when parity breaks."""
    int8_images = quantize.split_images(args) if args.precision == "int8" else None
    timer, out, model, weights = conv.start_export(args, "torchvision's detection ops need opset >= 11", build_model)
    cfg = model.cfg
    files = {"onnx": "model.onnx", "onnx_simplified": "model.sim.onnx", "ir_xml": "model.xml", "ir_bin": "model.bin"}
    conv.export_all(
        DetectorNetwork(model),
        torch.zeros(1, 3, *cfg.input_size),
        out,
        files,
        INPUT_NAME,
        OUTPUT_NAMES,
        args.opset,
        timer,
    )
    spec = input_spec(cfg)
    post = {
        "score_thresh": cfg.box_score_thresh,
        "nms_thresh": cfg.box_nms_thresh,
        "detections_per_img": cfg.box_detections_per_img,
    }
    gate = DetectorParityGate(**{f: getattr(args, f"gate_{f}") for f in DetectorParityGate().as_dict()})
    with timer.stage("parity"):
        report = run_parity(
            model, out, files, spec, cfg.box_score_thresh, parity_images(args.parity_images, args.parity_count), gate
        )
    conv.save_parity_report(
        out, report, files, timer, format_table(report["runtimes"], report["torchvision_transform"])
    )
    manifest_data = {
        "model": "detector",
        "config": cfg.name,
        "num_classes": cfg.num_classes,
        "class_names": list(cfg.class_names),
        "input": spec,
        "outputs": {role: role for role in OUTPUT_NAMES},
        "files": files,
        "graph": {
            "boxes": "[1, D, 4] x1y1x2y2 in network-input pixels (the input spec's size)",
            "scores": "[1, D] descending",
            "labels": "[1, D] int64, 1-based: label i is class_names[i - 1]",
            "padding": "rows past the image's detections have score 0 and label 0",
            "rows": cfg.box_detections_per_img,
        },
        "postprocess": post,
        "weights": weights,
        "opset": args.opset,
        "tools": conv.tool_versions(),
    }
    int8 = {}
    if int8_images is not None:
        gate_score = cfg.box_score_thresh if args.int8_gate_score is None else args.int8_gate_score

        def agreement(rows_f32, rows_int8, _sizes):
            return detection_agreement(
                [valid_detections(r, gate_score) for r in rows_f32],
                [valid_detections(r, gate_score) for r in rows_int8],
                gate.box_rel,
            )

        with timer.stage("int8"):
            int8 = quantize.run_int8(
                out, manifest_data, int8_images, args, agreement, "box_iou_median", gate_score, ("bbox",)
            )
    write_manifest(out, {**manifest_data, "export_seconds": timer.seconds, **int8})
    height, width = cfg.input_size
    print(f"wrote {out}/manifest.json ({cfg.name}, {height}x{width}, {len(cfg.class_names)} classes)")
    return report
