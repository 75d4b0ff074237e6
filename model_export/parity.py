"""Parity report: does the exported model still give the same answers as PyTorch?

Compares each runtime's raw outputs with torch (max abs difference, and relative to the output's range) and, for
YOLACT, the detections after the shared numpy postprocess: matched by class and box IoU (near-tied scores may swap
ranks, so detections are matched as sets, not by position), with box and mask IoU of the matched pairs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from pipelines.inference.openvino_runtime import CompiledIR, RuntimeSettings, openvino_core
from pipelines.ops import yolact_postprocess as yp


@dataclass(frozen=True)
class ParityGate:
    """Thresholds the export must meet in f32; bf16 (the device default on CPUs with AVX512-BF16) is reported, not
    gated."""

    ort_atol: float = 1e-4  # ONNX Runtime vs torch, every raw output
    ov_fp32_ir_atol: float = 1e-3  # OpenVINO f32, FP32-weights IR vs torch
    ov_fp16_ir_rel: float = 1e-2  # OpenVINO f32, FP16-weights IR vs torch, relative to each output's range
    min_matched: float = 0.95  # fraction of torch detections matched (same class, box IoU >= 0.5)
    min_median_mask_iou: float = 0.99

    def as_dict(self) -> dict:
        return asdict(self)


def raw_differences(reference: list[dict], other: list[dict]) -> dict[str, dict[str, float]]:
    """Per output name over all images: max abs difference and that difference relative to torch's range."""
    report = {}
    for name in reference[0]:
        ref = np.stack([r[name] for r in reference]).astype(np.float64)
        out = np.stack([o[name] for o in other]).astype(np.float64)
        max_abs = float(np.max(np.abs(ref - out)))
        value_range = float(ref.max() - ref.min()) or 1.0
        report[name] = {"max_abs": max_abs, "rel_to_range": max_abs / value_range}
    return report


def box_iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a: [n, 4], b: [m, 4] x1y1x2y2 -> [n, m] IoU in float64, 0 for two empty boxes (the postprocess's
    pairwise_iou)."""
    return np.nan_to_num(yp.pairwise_iou(np.asarray(a, np.float64), np.asarray(b, np.float64)), nan=0.0)


def match_detections(ref: yp.Detections, other: yp.Detections, min_iou: float = 0.5) -> list[tuple[int, int, float]]:
    """Greedy in torch score order: each ref detection takes the unmatched same-class detection of highest box IoU."""
    if len(ref) == 0 or len(other) == 0:
        return []
    ious = box_iou(ref.boxes, other.boxes)
    ious[ref.classes[:, None] != other.classes[None, :]] = -1.0
    pairs, taken = [], np.zeros(len(other), bool)
    for i in range(len(ref)):
        row = np.where(taken, -1.0, ious[i])
        j = int(np.argmax(row))
        if row[j] >= min_iou:
            taken[j] = True
            pairs.append((i, j, float(row[j])))
    return pairs


def mask_iou(a: np.ndarray, b: np.ndarray) -> float:
    union = np.logical_or(a, b).sum()
    return 1.0 if union == 0 else float(np.logical_and(a, b).sum() / union)


def detection_agreement(
    ref_dets: list[yp.Detections],
    other_dets: list[yp.Detections],
    protos_ref: list,
    protos_other: list,
    sizes: list[tuple[int, int]],
) -> dict:
    """Counts, class agreement, matched fraction, box and mask IoU of matched detections over all images."""
    n_ref = n_other = matched = class_same = class_total = 0
    box_ious, mask_ious = [], []
    for ref, other, p_ref, p_other, (width, height) in zip(ref_dets, other_dets, protos_ref, protos_other, sizes):
        n_ref += len(ref)
        n_other += len(other)
        if len(ref) and len(other):
            best = np.argmax(box_iou(ref.boxes, other.boxes), axis=1)
            class_same += int(np.sum(ref.classes == other.classes[best]))
            class_total += len(ref)
        pairs = match_detections(ref, other)
        matched += len(pairs)
        if pairs:
            masks_ref = yp.assemble_masks(ref, p_ref, width, height)
            masks_other = yp.assemble_masks(other, p_other, width, height)
            for i, j, iou in pairs:
                box_ious.append(iou)
                mask_ious.append(mask_iou(masks_ref[i], masks_other[j]))
    return {
        "detections_ref": n_ref,
        "detections": n_other,
        "class_agreement": class_same / class_total if class_total else (1.0 if n_ref == n_other else 0.0),
        "matched_fraction": matched / max(n_ref, n_other) if max(n_ref, n_other) else 1.0,
        "box_iou_median": float(np.median(box_ious)) if box_ious else None,
        "box_iou_min": float(np.min(box_ious)) if box_ious else None,
        "mask_iou_median": float(np.median(mask_ious)) if mask_ious else None,
        "mask_iou_min": float(np.min(mask_ious)) if mask_ious else None,
    }


def format_table(rows: dict[str, dict]) -> str:
    """A fixed-width table of the parity rows for the terminal."""
    outputs = list(next(iter(rows.values()))["raw"].keys())
    header = (
        ["runtime"]
        + [f"max|d| {o}" for o in outputs]
        + ["dets", "class", "matched", "boxIoU med/min", "maskIoU med/min"]
    )
    lines = [header]
    for name, row in rows.items():
        det = row.get("detections", {})

        def pair(key, det=det):
            med, low = det.get(f"{key}_median"), det.get(f"{key}_min")
            return "-" if med is None else f"{med:.4f}/{low:.4f}"

        lines.append(
            [name]
            + [f"{row['raw'][o]['max_abs']:.2e}" for o in outputs]
            + [
                str(det.get("detections", "-")),
                f"{det.get('class_agreement', 1.0):.3f}",
                f"{det.get('matched_fraction', 1.0):.3f}",
                pair("box_iou"),
                pair("mask_iou"),
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths)) for line in lines)


RUNTIMES = ("torch", "onnxruntime", "openvino_fp32ir_f32", "openvino_fp16ir_f32", "openvino_fp16ir_default")


def runtime_outputs(
    network, tensors: list[np.ndarray], onnx_path, ir_xml, input_name: str, output_names: list[str]
) -> dict[str, list[dict]]:
    """Every runtime's raw outputs on the same preprocessed tensors ([3, H, W] each): torch (eval), ONNX Runtime on
    the simplified ONNX, OpenVINO f32 on an FP32-weights IR (made here, in memory only), and the shipped FP16 IR in
    f32 and in the device default (bf16 on CPUs with AVX512-BF16). Returns {runtime: [{output name: array without
    batch}]}."""
    import onnxruntime as ort
    import openvino as ov
    import torch

    outputs: dict[str, list[dict]] = {"torch": []}
    with torch.no_grad():
        for x in tensors:
            values = network(torch.from_numpy(x)[None])
            outputs["torch"].append({n: v[0].numpy() for n, v in zip(output_names, values)})
    session = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"])
    outputs["onnxruntime"] = [
        dict(zip(output_names, (o[0] for o in session.run(output_names, {input_name: x[None]})))) for x in tensors
    ]
    fp32_model = openvino_core().compile_model(
        ov.convert_model(str(onnx_path)), "CPU", RuntimeSettings(precision="f32").ov_config()
    )
    outputs["openvino_fp32ir_f32"] = [
        {o.get_any_name(): fp32_model(x[None])[o][0] for o in fp32_model.outputs} for x in tensors
    ]
    for name, precision in (("openvino_fp16ir_f32", "f32"), ("openvino_fp16ir_default", "auto")):
        runner = CompiledIR(ir_xml, RuntimeSettings(precision=precision))
        outputs[name] = [runner.infer_one(x) for x in tensors]
    return outputs
