"""INT8 export (`--precision int8`): NNCF post-training quantization of the exported model, with an accuracy gate.

Layout of an INT8 export directory (one directory, one manifest):
    model.xml/.bin            the FP16-weights IR, exactly as a plain export writes it (manifest role ir_xml_fp16)
    model.int8.xml/.bin       the INT8 IR (roles ir_xml / ir_bin: what every job runs, with no change)
    int8.json                 the quantization report: calibration set, ignored scope, gate, agreement numbers
The manifest says `weights_precision: int8` and records the calibration set's size and sha256, NNCF's version and
the ignored scope. When the gate fails, the files are left for inspection but no manifest.json is written (exit 3),
like the f32 parity gate.

With `--eval-annotations COCO.json` (annotations of the gate images, matched by file name) the gate also measures
box AP (and YOLACT's mask AP) of both IRs through the job's own per-image code (`single_process.infer_files`, the
manifest's score threshold, the f32 hint) with pycocotools, and fails when INT8 loses more than
`--int8-max-ap-drop` points.

Calibration images are decoded and preprocessed exactly as the job does (`pipelines.ops.image_decode.decode_image`,
`pipelines.ops.preprocess.preprocess_rgb` with the manifest's input spec). The gate compares the INT8 IR with the
FP16-weights IR, both run with OpenVINO's f32 precision hint, on held-out images: `--gate-images DIR`, or else the
last images of the calibration directory (never used for calibration).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from model_export.onnx_openvino import ParityFailed
from pipelines.errors import UsageError
from pipelines.inference.model_manifest import write_manifest
from pipelines.inference.openvino_runtime import CompiledIR, RuntimeSettings, openvino_core
from pipelines.inference.single_process import infer_files
from pipelines.ops.image_decode import decode_image
from pipelines.ops.preprocess import preprocess_rgb
from pipelines.report.evaluate import ap_report, load_ground_truth, results_from_rows, subset_ground_truth

INT8_FILES = {"ir_xml": "model.int8.xml", "ir_bin": "model.int8.bin", "int8_report": "int8.json"}
DEFAULT_CALIBRATION_COUNT = 300
MAX_HELD_OUT = 50


class CalibrationError(UsageError):
    """The calibration (or gate) images cannot be used: exit 2, the message names the directory."""


class Int8GateFailed(ParityFailed):
    """The INT8 IR does not agree with f32 enough: exit 3, no manifest.json."""


@dataclass(frozen=True)
class Int8Gate:
    """INT8 vs f32 on held-out images. Detections are matched by class and box IoU >= 0.5 (model_export.parity);
    `min_matched`: matched / max(f32 detections, INT8 detections). YOLACT also: median mask IoU of matched pairs;
    the detector: median box IoU of matched pairs."""

    # Set between what a sound quantization matches (a trained model nearly all; random-init models less, their
    # biased logits giving near-tied detections whose top-100 cut INT8 reorders) and a broken one (next to nothing).
    min_matched: float = 0.75
    min_median_iou: float = 0.9
    max_ap_drop: float = 1.0  # AP points (0-100) INT8 may lose against f32, with --eval-annotations

    def as_dict(self) -> dict:
        return asdict(self)


def add_arguments(parser: argparse.ArgumentParser, iou_name: str, default_ignored: tuple[str, ...] = ()) -> None:
    """The INT8 options of an export subcommand (`iou_name`: what --int8-min-median-iou measures;
    `default_ignored`: the family's measured ignored scope, NNCF name regexes)."""
    group = parser.add_argument_group("INT8 (NNCF post-training quantization)")
    group.add_argument(
        "--precision",
        choices=("fp16", "int8"),
        default="fp16",
        help="fp16: the FP16-weights IR (default); int8: also an INT8 IR, which the manifest points "
        "jobs at (model.int8.xml), gated against f32",
    )
    group.add_argument("--calibration-images", help="directory of calibration images (with --precision int8)")
    group.add_argument(
        "--calibration-count", type=int, default=DEFAULT_CALIBRATION_COUNT, help="at most this many calibration images"
    )
    group.add_argument(
        "--gate-images",
        help="held-out images for the INT8 gate (default: the last images of "
        "--calibration-images, which are then not used for calibration)",
    )
    group.add_argument(
        "--gate-count",
        type=int,
        default=None,
        help=f"how many gate images (default: all of --gate-images, or one in five of the "
        f"calibration directory, at most {MAX_HELD_OUT})",
    )
    defaults = Int8Gate()
    group.add_argument(
        "--int8-min-matched",
        type=float,
        default=defaults.min_matched,
        help="gate: fraction of detections matched between INT8 and f32 (class + box IoU >= 0.5)",
    )
    group.add_argument(
        "--int8-min-median-iou",
        type=float,
        default=defaults.min_median_iou,
        help=f"gate: median {iou_name} IoU of the matched detections",
    )
    group.add_argument(
        "--eval-annotations",
        help="COCO annotations (JSON) of the gate images (matched by file name): the gate also "
        "compares box (and mask) AP of INT8 and f32 with pycocotools",
    )
    group.add_argument(
        "--int8-max-ap-drop",
        type=float,
        default=defaults.max_ap_drop,
        help="gate, with --eval-annotations: AP points (0-100) INT8 may lose against f32",
    )
    group.add_argument(
        "--int8-gate-score",
        type=float,
        default=None,
        help="gate: compare detections scoring at least this (default: 0.3 for YOLACT, whose "
        "low-score tail is near-tied noise; the detector's box_score_thresh)",
    )
    group.add_argument(
        "--int8-ignored-scope",
        default=",".join(default_ignored),
        help="comma-separated regexes of OpenVINO node names kept in higher precision (NNCF "
        f"IgnoredScope patterns; '' for none; default: {','.join(default_ignored) or 'none'})",
    )


def image_files(directory: str | Path) -> list[Path]:
    root = Path(directory)
    if not root.is_dir():
        raise CalibrationError(f"{root}: no such image directory")
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def decode_all(paths: list[Path]) -> tuple[list[tuple[Path, bytes, np.ndarray]], list[str]]:
    """Every decodable image as (path, bytes, RGB), and the names that were skipped with why."""
    images, skipped = [], []
    for path in paths:
        data = path.read_bytes()
        try:
            images.append((path, data, decode_image(data, str(path))))
        except Exception as err:  # any decode failure (ImageDecodeError, a truncated file): skip, say so
            skipped.append(f"{path.name}: {err}")
    return images, skipped


def split_images(args: argparse.Namespace) -> dict:
    """Decode the calibration (and gate) images before anything expensive runs; raise CalibrationError when a
    directory has no decodable image. Returns {"calibration": [...], "gate": [...], "skipped": [...]}."""
    if not args.calibration_images:
        raise CalibrationError(
            "--precision int8 needs --calibration-images DIR (images like the ones the job will see)"
        )
    if args.calibration_count < 1:
        raise CalibrationError(f"--calibration-count {args.calibration_count}: must be >= 1")
    calibration_dir = Path(args.calibration_images)
    images, skipped = decode_all(image_files(calibration_dir))
    if not images:
        raise CalibrationError(
            f"--calibration-images {calibration_dir}: no decodable image "
            f"({len(skipped)} files tried): pass a directory of JPEG/PNG/TIFF images"
        )
    if args.gate_images:
        gate_dir = Path(args.gate_images)
        gate, gate_skipped = decode_all(image_files(gate_dir))
        skipped += gate_skipped
        if not gate:
            raise CalibrationError(f"--gate-images {gate_dir}: no decodable image: pass a directory of images")
        if args.gate_count:
            gate = gate[: args.gate_count]
        calibration = images[: args.calibration_count]
    else:
        held_out = args.gate_count or max(1, min(MAX_HELD_OUT, len(images) // 5))
        if len(images) <= held_out:
            raise CalibrationError(
                f"--calibration-images {calibration_dir}: {len(images)} decodable images, but "
                f"{held_out} are held out for the gate: add images or pass --gate-images DIR"
            )
        gate = images[-held_out:]
        calibration = images[:-held_out][: args.calibration_count]
    annotations = gate_annotations(args.eval_annotations, gate) if args.eval_annotations else None
    return {"calibration": calibration, "gate": gate, "skipped": skipped, "annotations": annotations}


def gate_annotations(path: str, gate: list[tuple[Path, bytes, np.ndarray]]) -> dict:
    """The COCO annotations of the gate images (parsed, only those images): every gate image must have an entry
    (by file name), else CalibrationError."""
    try:
        ground_truth = load_ground_truth(path)
    except Exception as err:  # missing file, not JSON, not COCO: say which file
        raise CalibrationError(f"--eval-annotations {path}: cannot be read as COCO annotations ({err})") from None
    ids = {Path(image["file_name"]).name: image["id"] for image in ground_truth.dataset.get("images", [])}
    missing = [p.name for p, _, _ in gate if p.name not in ids]
    if missing:
        raise CalibrationError(
            f"--eval-annotations {path}: no entry for {len(missing)} of the {len(gate)} gate "
            f"images (e.g. {', '.join(missing[:3])}): annotate every gate image, or pass the "
            "annotated ones with --gate-images"
        )
    return subset_ground_truth(ground_truth, {ids[p.name] for p, _, _ in gate}).dataset


def ap_comparison(out: Path, manifest_data: dict, images: dict, iou_types: tuple[str, ...]) -> dict:
    """{"f32": AP report, "int8": AP report} of the FP16-weights IR and the INT8 IR on the gate images against their
    annotations: each IR run by the job's own per-image code (single_process.infer_files, the f32 hint) from a
    temporary model directory whose manifest points at it (links to `out`'s files)."""
    ground_truth = load_ground_truth(images["annotations"])
    image_ids = {Path(image["file_name"]).name: image["id"] for image in ground_truth.dataset["images"]}
    category_ids = {c["name"]: c["id"] for c in ground_truth.dataset["categories"]}
    paths = [path for path, _, _ in images["gate"]]
    reports = {}
    with tempfile.TemporaryDirectory(prefix="int8_ap_") as tmp:
        for name, ir in (("f32", {}), ("int8", {"ir_xml": INT8_FILES["ir_xml"], "ir_bin": INT8_FILES["ir_bin"]})):
            files = {**manifest_data["files"], **ir}
            model_dir = Path(tmp) / name
            for rel in files.values():
                (model_dir / rel).parent.mkdir(parents=True, exist_ok=True)
                (model_dir / rel).symlink_to((out / rel).resolve())
            write_manifest(model_dir, {**manifest_data, "files": files})
            rows = infer_files(
                model_dir,
                paths,
                str(Path(tmp) / f"{name}-out"),
                str(paths[0].parent),
                RuntimeSettings(precision="f32"),
                masks="rle",
            )
            reports[name] = ap_report(ground_truth, results_from_rows(rows, image_ids, category_ids), None, iou_types)
    return reports


def image_set_sha256(images: list[tuple[Path, bytes, np.ndarray]]) -> str:
    """sha256 over the sorted (file name, file sha256) lines: identifies the set regardless of its directory."""
    lines = sorted(f"{path.name}\t{hashlib.sha256(data).hexdigest()}\n" for path, data, _ in images)
    return hashlib.sha256("".join(lines).encode()).hexdigest()


def quantize_ir(
    source_xml: Path, xml_path: Path, tensors: list[np.ndarray], input_name: str, ignored_patterns: list[str]
) -> dict:
    """NNCF PTQ of the shipped FP16-weights IR (the gate's reference; NNCF's graph builder also handles the
    detector's IR, which it does not when given the ONNX graph), saved with FP16 for what stays float. Returns what
    the manifest records about it."""
    import nncf
    import openvino as ov

    model = openvino_core().read_model(str(source_xml))
    dataset = nncf.Dataset(tensors, lambda x: {input_name: x[None]})
    ignored = nncf.IgnoredScope(patterns=ignored_patterns, validate=True) if ignored_patterns else None
    quantized = nncf.quantize(
        model, dataset, preset=nncf.QuantizationPreset.MIXED, subset_size=len(tensors), ignored_scope=ignored
    )
    ov.save_model(quantized, str(xml_path), compress_to_fp16=True)
    fake_quantize = sum(op.get_type_name() == "FakeQuantize" for op in quantized.get_ops())
    return {
        "tool": "nncf",
        "nncf": importlib.metadata.version("nncf"),
        "method": "post-training quantization",
        "source": source_xml.name,
        "preset": "mixed",
        "fast_bias_correction": True,
        "fake_quantize_nodes": int(fake_quantize),
        "ignored_scope": {"patterns": ignored_patterns, "kept_in": "f32/bf16 (the runtime's float precision)"}
        if ignored_patterns
        else None,
    }


def run_int8(
    out: Path,
    manifest_data: dict,
    images: dict,
    args: argparse.Namespace,
    agreement: Callable[[list[dict], list[dict], list[tuple[int, int]]], dict],
    iou_key: str,
    gate_score: float,
    ap_types: tuple[str, ...],
) -> dict:
    """Quantize, gate, write int8.json. `manifest_data`: the family's manifest so far (its `files` name the FP16
    IR). `agreement(f32 rows, int8 rows, sizes)` -> a dict with matched_fraction and `iou_key` (the family's
    detection comparison, model_export.parity's matcher); `ap_types`: the family's COCO iou types ("bbox",
    "segm"), compared when the gate images are annotated. Returns the manifest fields to add (and updates
    manifest_data["files"]); raises Int8GateFailed when the gate fails."""
    files, spec = manifest_data["files"], manifest_data["input"]
    gate = Int8Gate(
        min_matched=args.int8_min_matched, min_median_iou=args.int8_min_median_iou, max_ap_drop=args.int8_max_ap_drop
    )
    patterns = [p.strip() for p in args.int8_ignored_scope.split(",") if p.strip()]
    calibration = [preprocess_rgb(rgb, spec) for _, _, rgb in images["calibration"]]
    quantization = quantize_ir(out / files["ir_xml"], out / INT8_FILES["ir_xml"], calibration, spec["name"], patterns)
    gate_tensors = [preprocess_rgb(rgb, spec) for _, _, rgb in images["gate"]]
    sizes = [(rgb.shape[1], rgb.shape[0]) for _, _, rgb in images["gate"]]
    f32 = CompiledIR(out / files["ir_xml"], RuntimeSettings(precision="f32"))
    int8 = CompiledIR(out / INT8_FILES["ir_xml"], RuntimeSettings(precision="f32"))
    rows_f32 = [f32.infer_one(x) for x in gate_tensors]
    rows_int8 = [int8.infer_one(x) for x in gate_tensors]
    result = agreement(rows_f32, rows_int8, sizes)
    failures = []
    if result["matched_fraction"] < gate.min_matched:
        failures.append(f"int8 vs f32: matched {result['matched_fraction']:.3f} < {gate.min_matched}")
    if result[iou_key] is not None and result[iou_key] < gate.min_median_iou:
        failures.append(f"int8 vs f32: {iou_key} {result[iou_key]:.4f} < {gate.min_median_iou}")
    if result["detections_ref"] == 0:
        failures.append("f32: no detections on the gate images: nothing to compare (pass other --gate-images)")
    ap = ap_comparison(out, manifest_data, images, ap_types) if images.get("annotations") else None
    for key in ("box_ap", "mask_ap") if ap else ():
        if key in ap["f32"]:
            ap[f"{key}_drop_points"] = round(100 * (ap["f32"][key] - ap["int8"][key]), 3)
            if ap[f"{key}_drop_points"] > gate.max_ap_drop:
                failures.append(
                    f"int8 vs f32: {key} {100 * ap['int8'][key]:.2f} is {ap[f'{key}_drop_points']:.2f} "
                    f"points below f32's {100 * ap['f32'][key]:.2f} (> {gate.max_ap_drop})"
                )
    calibration_record = {
        "count": len(images["calibration"]),
        "sha256": image_set_sha256(images["calibration"]),
        "directory": str(Path(args.calibration_images).name),
        "images": [path.name for path, _, _ in images["calibration"]],
        "skipped_undecodable": images["skipped"],
    }
    gate_record = {
        "thresholds": gate.as_dict(),
        "iou": iou_key,
        "min_score": gate_score,
        "reference": "FP16-weights IR, OpenVINO f32 hint",
        "int8_run_with": "OpenVINO f32 hint",
        "count": len(images["gate"]),
        "sha256": image_set_sha256(images["gate"]),
        "source": "--gate-images" if args.gate_images else "held out from --calibration-images",
        "images": [path.name for path, _, _ in images["gate"]],
        "agreement": result,
        "ap": ap,
        "passed": not failures,
        "failures": failures,
    }
    report = {"quantization": quantization, "calibration": calibration_record, "gate": gate_record}
    (out / INT8_FILES["int8_report"]).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    print("int8 vs f32 on", len(images["gate"]), "held-out images:", json.dumps(result))
    if ap:
        print(
            "AP (f32 -> int8):",
            ", ".join(
                f"{k} {100 * ap['f32'][k]:.2f} -> {100 * ap['int8'][k]:.2f}"
                for k in ("box_ap", "mask_ap")
                if k in ap["f32"]
            ),
        )
    if failures:
        raise Int8GateFailed(
            "INT8 accuracy gate failed (no manifest.json written, the directory is not usable; "
            "lower the --int8-* thresholds only if the numbers are acceptable, or keep layers in "
            "higher precision with --int8-ignored-scope):\n  " + "\n  ".join(failures)
        )
    files["ir_xml_fp16"], files["ir_bin_fp16"] = files["ir_xml"], files["ir_bin"]
    files.update(INT8_FILES)
    return {
        "weights_precision": "int8",
        "quantization": {
            **quantization,
            "calibration": {k: calibration_record[k] for k in ("count", "sha256", "directory")},
            "gate": {
                k: gate_record[k]
                for k in ("thresholds", "iou", "min_score", "count", "sha256", "source", "agreement", "ap")
            },
        },
    }
