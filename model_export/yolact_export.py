"""`python -m model_export yolact`: YOLACT PyTorch -> ONNX -> simplified ONNX -> OpenVINO FP16 IR, priors,
parity report and manifest.json (the contract every later stage reads)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

from model_export import onnx_openvino as conv
from model_export import quantize
from model_export.models.checkpoint import load_yolact_checkpoint, training_record
from model_export.models.yolact import CONFIGS, Yolact, bias_class_logits, get_config
from model_export.parity import ParityGate, detection_agreement, format_table, raw_differences, runtime_outputs
from pipelines.inference.model_manifest import write_manifest
from pipelines.ops import yolact_postprocess as yp
from pipelines.ops.image_decode import decode_image
from pipelines.ops.preprocess import preprocess_rgb

INPUT_NAME = "image"
OUTPUT_NAMES = ["loc", "conf", "mask", "proto"]
DEFAULT_PARITY_IMAGES = Path(__file__).resolve().parents[1] / "samples" / "images"
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
PARITY_BIASED_CLASSES = 8  # random weights + these classes boosted: Detect returns its full 100 detections
# INT8 gate: detections scoring >= this are compared (the tail down to conf_thresh 0.05 is near-tied: INT8 reorders
# it). No ignored scope: keeping the prediction head convs in float barely changed the matched fraction.
INT8_GATE_SCORE = 0.3
CALIBRATION_IMAGES = 4  # random weights: output layers standardized on these sample images


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", required=True, choices=sorted(CONFIGS), help="model configuration")
    parser.add_argument("--weights", help="a .pth checkpoint (official YOLACT or trained by sparkseg)")
    parser.add_argument(
        "--random-init", action="store_true", help="random weights with biased class logits (tests and benchmarks only)"
    )
    parser.add_argument("--out", required=True, help="export directory to create")
    parser.add_argument("--opset", type=int, default=11, help="ONNX opset (>= 11)")
    parser.add_argument(
        "--input-size",
        type=int,
        help="square input side (default: the size a sparkseg checkpoint was trained at, else the config's max_size)",
    )
    parser.add_argument(
        "--num-classes",
        type=int,
        help="override (fine-tuned checkpoints), incl. background "
        "(default: a sparkseg checkpoint's classes, else the config's)",
    )
    parser.add_argument(
        "--class-names",
        help="comma-separated foreground class names (with --num-classes; default: "
        "a sparkseg checkpoint's, else the config's)",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed for --random-init")
    parser.add_argument("--parity-images", default=str(DEFAULT_PARITY_IMAGES), help="directory of images")
    parser.add_argument("--parity-count", type=int, default=4, help="how many parity images to use")
    for field, value in ParityGate().as_dict().items():
        parser.add_argument(f"--gate-{field.replace('_', '-')}", type=float, default=value, dest=f"gate_{field}")
    quantize.add_arguments(parser, iou_name="mask")


def build_model(args: argparse.Namespace) -> tuple[Yolact, dict]:
    conv.require_weights_choice(args.weights, args.random_init, "a YOLACT checkpoint")
    overrides = {}
    trained = training_record(args.weights) if args.weights else {}  # a sparkseg checkpoint's size and classes
    if args.input_size:
        overrides["max_size"] = args.input_size
        if trained.get("max_size", args.input_size) != args.input_size:
            print(
                f"note: {args.weights} was trained at {trained['max_size']} px; exporting at --input-size "
                f"{args.input_size}",
                file=sys.stderr,
            )
    elif "max_size" in trained:
        overrides["max_size"] = trained["max_size"]  # the size its weights learned; the config's may differ
    if args.num_classes:
        overrides["num_classes"] = args.num_classes
    if args.class_names:
        overrides["class_names"] = conv.class_names_flag(args.class_names)
    elif not args.num_classes and "class_names" in trained:
        overrides["class_names"] = trained["class_names"]  # get_config sets num_classes to match
    cfg = get_config(args.config, **overrides)
    torch.manual_seed(args.seed)
    model = Yolact(cfg).eval()
    if args.weights:
        report = load_yolact_checkpoint(model, args.weights)
        weights = {"source": Path(args.weights).name, "random_init": False, "trained": True, "load_report": str(report)}
    else:
        images = parity_images(args.parity_images, CALIBRATION_IMAGES)
        standardize_output_layers(model, [preprocess_rgb(rgb, input_spec(cfg, int(cfg.max_size))) for _, rgb in images])
        classes = list(range(1, min(cfg.num_classes, PARITY_BIASED_CLASSES + 1)))
        bias_class_logits(model, classes)
        weights = {
            "source": "random-init",
            "seed": args.seed,
            "random_init": True,
            "trained": False,
            "biased_classes": classes,
            "output_layers_standardized_on": [name for name, _ in images],
        }
    return model, weights


def standardize_output_layers(model: Yolact, tensors: list[np.ndarray]) -> None:
    """Random weights put the head's pre-activations in the hundreds (softmax and tanh saturated), unlike a trained
    network's; every runtime comparison then measures that blow-up, not the export. Rescale the last conv of each
    output (boxes, classes, mask coefficients, prototypes) so its pre-activation has unit standard deviation on
    real images (data-dependent init, as LSUV does)."""
    head = model.prediction_layers[0]
    layers = [head.bbox_layer, head.conf_layer, head.mask_layer, model.proto_net[-1]]
    seen: dict[int, list[torch.Tensor]] = {id(layer): [] for layer in layers}
    hooks = [
        layer.register_forward_hook(lambda module, _, out: seen[id(module)].append(out.flatten())) for layer in layers
    ]
    with torch.no_grad():
        for x in tensors:
            model(torch.from_numpy(x)[None])
        for hook in hooks:
            hook.remove()
        for layer in layers:
            std = float(torch.cat(seen[id(layer)]).std())
            layer.weight.div_(std)
            if layer.bias is not None:
                layer.bias.div_(std)


def input_spec(cfg, size: int) -> dict:
    return {
        "name": INPUT_NAME,
        "shape": [1, 3, size, size],
        "layout": "NCHW",
        "dtype": "float32",
        "channel_order": "RGB",
        "mean": [float(v) for v in cfg.mean],
        "std": [float(v) for v in cfg.std],
        "resize": {
            "size": [size, size],
            "mode": "bilinear",
            "align_corners": False,
            "antialias": False,
            "keep_aspect_ratio": False,
        },
    }


def parity_images(directory: str, count: int) -> list[tuple[str, np.ndarray]]:
    paths = sorted(p for p in Path(directory).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)[:count]
    if not paths:
        raise SystemExit(f"error: no images in --parity-images {directory}")
    return [(p.name, decode_image(p.read_bytes(), str(p))) for p in paths]


def run_parity(
    model: Yolact,
    out: Path,
    files: dict,
    spec: dict,
    priors: np.ndarray,
    post: dict,
    images: list[tuple[str, np.ndarray]],
    gate: ParityGate,
) -> dict:
    """Run torch, ONNX Runtime and OpenVINO (FP32 IR in f32; FP16 IR in f32 and in the device default) on the
    images; compare raw outputs and detections with torch."""
    tensors = [preprocess_rgb(rgb, spec) for _, rgb in images]
    sizes = [(rgb.shape[1], rgb.shape[0]) for _, rgb in images]
    outputs = runtime_outputs(
        model, tensors, out / files["onnx_simplified"], out / files["ir_xml"], INPUT_NAME, OUTPUT_NAMES
    )

    def detections(rows):
        return [yp.detect(r["loc"], r["conf"], r["mask"], priors, **post) for r in rows]

    ref_dets = detections(outputs["torch"])
    ref_protos = [r["proto"] for r in outputs["torch"]]
    rows = {}
    for name, rows_out in outputs.items():
        dets = ref_dets if name == "torch" else detections(rows_out)
        rows[name] = {
            "raw": raw_differences(outputs["torch"], rows_out),
            "detections": detection_agreement(ref_dets, dets, ref_protos, [r["proto"] for r in rows_out], sizes),
        }
    failures = gate_failures(rows, gate)
    return {
        "images": [name for name, _ in images],
        "gate": gate.as_dict(),
        "runtimes": rows,
        "passed": not failures,
        "failures": failures,
    }


def gate_failures(rows: dict, gate: ParityGate) -> list[str]:
    failures = []

    def check_raw(runtime, key, limit):
        for output, diff in rows[runtime]["raw"].items():
            if diff[key] > limit:
                failures.append(f"{runtime}: {output} {key} {diff[key]:.3g} > {limit:g}")

    check_raw("onnxruntime", "max_abs", gate.ort_atol)
    check_raw("openvino_fp32ir_f32", "max_abs", gate.ov_fp32_ir_atol)
    check_raw("openvino_fp16ir_f32", "rel_to_range", gate.ov_fp16_ir_rel)
    for runtime in ("onnxruntime", "openvino_fp32ir_f32", "openvino_fp16ir_f32"):
        det = rows[runtime]["detections"]
        if det["matched_fraction"] < gate.min_matched:
            failures.append(f"{runtime}: matched {det['matched_fraction']:.3f} < {gate.min_matched}")
        if det["mask_iou_median"] is not None and det["mask_iou_median"] < gate.min_median_mask_iou:
            failures.append(f"{runtime}: median mask IoU {det['mask_iou_median']:.4f} < {gate.min_median_mask_iou}")
    return failures


def export(args: argparse.Namespace) -> dict:
    """Run every stage; returns the parity report. Raises ParityFailed (no manifest written) when f32 parity breaks."""
    int8_images = quantize.split_images(args) if args.precision == "int8" else None
    timer, out, model, weights = conv.start_export(args, "YOLACT needs opset >= 11 (bilinear Resize)", build_model)
    cfg = model.cfg
    size = int(cfg.max_size)
    files = {
        "onnx": "model.onnx",
        "onnx_simplified": "model.sim.onnx",
        "ir_xml": "model.xml",
        "ir_bin": "model.bin",
        "priors": "priors.npy",
    }
    conv.export_all(model, torch.zeros(1, 3, size, size), out, files, INPUT_NAME, OUTPUT_NAMES, args.opset, timer)
    priors = model.priors()
    np.save(out / files["priors"], priors)
    spec = input_spec(cfg, size)
    post = {
        "conf_thresh": cfg.conf_thresh,
        "nms_thresh": cfg.nms_thresh,
        "top_k": cfg.top_k,
        "max_num_detections": cfg.max_num_detections,
        "nms": "fast",
    }
    gate = ParityGate(**{f: getattr(args, f"gate_{f}") for f in ParityGate().as_dict()})
    with timer.stage("parity"):
        report = run_parity(
            model, out, files, spec, priors, post, parity_images(args.parity_images, args.parity_count), gate
        )
    conv.save_parity_report(out, report, files, timer, format_table(report["runtimes"]))
    manifest_data = {
        "model": "yolact",
        "config": cfg.name,
        "num_classes": int(cfg.num_classes),
        "class_names": list(cfg.class_names),
        "input": spec,
        "outputs": {role: role for role in OUTPUT_NAMES},
        "files": files,
        "priors": {"count": int(priors.shape[0]), "feature_sizes": [list(s) for s in model.feature_map_sizes()]},
        "postprocess": post,
        "weights": weights,
        "opset": args.opset,
        "tools": conv.tool_versions(),
    }
    int8 = {}
    if int8_images is not None:
        gate_score = INT8_GATE_SCORE if args.int8_gate_score is None else args.int8_gate_score

        def agreement(rows_f32, rows_int8, sizes):
            def detections(rows):  # the gate compares confident detections (--int8-gate-score)
                return [
                    d.take(d.scores >= gate_score)
                    for d in (yp.detect(r["loc"], r["conf"], r["mask"], priors, **post) for r in rows)
                ]

            return detection_agreement(
                detections(rows_f32),
                detections(rows_int8),
                [r["proto"] for r in rows_f32],
                [r["proto"] for r in rows_int8],
                sizes,
            )

        with timer.stage("int8"):
            int8 = quantize.run_int8(
                out, manifest_data, int8_images, args, agreement, "mask_iou_median", gate_score, ("bbox", "segm")
            )
    write_manifest(out, {**manifest_data, "export_seconds": timer.seconds, **int8})
    print(f"wrote {out}/manifest.json ({cfg.name}, {size}x{size}, {len(cfg.class_names)} classes)")
    return report
