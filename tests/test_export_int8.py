"""INT8 export (`--precision int8`): NNCF post-training quantization, the accuracy gate (exit 3, no manifest), bad
calibration directories (exit 2), and the job running the INT8 IR unchanged with results matched to f32.

Comparisons use the gate's own defaults (model_export.quantize.Int8Gate and the family's gate score), not exact
equality: INT8 moves scores by a few 1e-2, which may flip near-tied detections at the score cut-off, and the gate's
thresholds are what the export promises."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from model_export.cli import main as export_main
from model_export.parity import mask_iou, match_detections
from model_export.quantize import Int8Gate
from model_export.yolact_export import INT8_GATE_SCORE
from pipelines.inference.model_manifest import load_manifest, write_manifest
from pipelines.ops.mask_outputs import decode_rle
from pipelines.ops.yolact_postprocess import Detections
from tests.fixtures_detector import export_small_detector, road_images  # noqa: F401
from tests.job_helpers import JOB_RUNTIME, job_config, read_rows

CALIBRATION_COUNT = 12  # + 3 held out for the gate (one in five of 16)
YOLACT_ARGS = ["yolact", "--config", "yolact_r18_small", "--random-init", "--input-size", "256", "--parity-count", "1"]


@pytest.fixture(scope="module")
def calibration_images(tmp_path_factory) -> Path:
    """16 small synthetic road images (JPEG 160x120) and one file that is not an image (skipped, recorded)."""
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset

    root = tmp_path_factory.mktemp("calibration")
    generate_road_dataset(root, 16, 5, RoadSceneConfig(width=160, height=120, formats=()))
    (root / "images" / "notes.txt").write_text("not an image")
    return root / "images"


@pytest.fixture(scope="module")
def yolact_int8(tmp_path_factory, calibration_images) -> Path:
    out = tmp_path_factory.mktemp("yolact_int8")
    assert (
        export_main(
            [
                *YOLACT_ARGS,
                "--out",
                str(out),
                "--precision",
                "int8",
                "--calibration-images",
                str(calibration_images),
                "--calibration-count",
                str(CALIBRATION_COUNT),
            ]
        )
        == 0
    )
    return out


@pytest.fixture(scope="module")
def detector_int8(tmp_path_factory, calibration_images) -> Path:
    out = tmp_path_factory.mktemp("detector_int8")
    assert (
        export_small_detector(
            out,
            "--precision",
            "int8",
            "--calibration-images",
            str(calibration_images),
            "--calibration-count",
            str(CALIBRATION_COUNT),
        )
        == 0
    )
    return out


def fp16_view(int8_dir: Path, out: Path) -> Path:
    """The same export with its manifest pointing at the FP16-weights IR: the f32 reference for the job."""
    shutil.copytree(int8_dir, out)
    data = json.loads((out / "manifest.json").read_text())
    files = data["files"]
    files["ir_xml"], files["ir_bin"] = files.pop("ir_xml_fp16"), files.pop("ir_bin_fp16")
    for key in ("format_version", "sha256", "weights_precision", "quantization"):
        data.pop(key)
    (out / "manifest.json").unlink()
    write_manifest(out, data)
    return out


def check_manifest(export_dir: Path, family: str) -> dict:
    manifest = load_manifest(export_dir, verify=True)
    data = manifest.data
    assert data["model"] == family and data["weights_precision"] == "int8"
    assert data["files"]["ir_xml"] == "model.int8.xml" and data["files"]["ir_xml_fp16"] == "model.xml"
    quantization = data["quantization"]
    assert quantization["tool"] == "nncf" and quantization["nncf"] == data["tools"]["nncf"]
    assert quantization["calibration"]["count"] == CALIBRATION_COUNT
    assert len(quantization["calibration"]["sha256"]) == 64
    assert quantization["fake_quantize_nodes"] > 0
    gate = quantization["gate"]
    assert gate["count"] == 3 and gate["source"] == "held out from --calibration-images"
    report = json.loads((export_dir / "int8.json").read_text())
    assert report["gate"]["passed"] and report["calibration"]["skipped_undecodable"][0].startswith("notes.txt")
    assert not set(report["calibration"]["images"]) & set(report["gate"]["images"]), "gate images are held out"
    return quantization


def row_detections(rows: list[dict], min_score: float) -> dict[str, tuple[Detections, list]]:
    """Result rows (dicts) -> {path: (detections scoring >= min_score, their masks or None)}."""
    result = {}
    for row in rows:
        kept = [i for i in (row["instances"] or []) if i["score"] >= min_score]
        detections = Detections(
            boxes=np.float32([i["box"] for i in kept]).reshape(-1, 4),
            coeffs=np.zeros((len(kept), 0)),
            classes=np.int64([i["class_id"] for i in kept]),
            scores=np.float32([i["score"] for i in kept]),
        )
        masks = [decode_rle(i["mask"]) if i.get("mask") else None for i in kept]
        result[row["path"]] = (detections, masks)
    return result


def job_agreement(
    spark, images: Path, int8_dir: Path, f32_dir: Path, tmp_path: Path, family: str, min_score: float
) -> tuple[float, float | None, int]:
    """Run the job on the INT8 export (f32 hint, precision as every job test) and the single-process reference on
    its FP16 view (same settings); matched fraction and median mask IoU of matched pairs (the gate's matcher,
    model_export.parity), and the f32 detection count."""
    from pipelines.inference.inference_job import run
    from pipelines.inference.single_process import infer_files

    summary = run(spark, job_config(images, tmp_path / "int8", int8_dir), family=family)
    assert summary["counts"]["failed"] == 0 and summary["counts"]["done"] == summary["counts"]["inputs"]
    rows = [row.asDict(recursive=True) for row in read_rows(spark, tmp_path / "int8", "detections")]
    outputs = {"int8": row_detections(rows, min_score)}
    reference = infer_files(
        f32_dir, sorted(images.iterdir()), str(tmp_path / "f32"), str(images), JOB_RUNTIME, family=family
    )
    outputs["f32"] = row_detections(reference, min_score)
    assert set(outputs["int8"]) == set(outputs["f32"])
    matched = total = 0
    ious = []
    for path, (ref, ref_masks) in outputs["f32"].items():
        other, other_masks = outputs["int8"][path]
        pairs = match_detections(ref, other)
        matched += len(pairs)
        total += max(len(ref), len(other))
        ious += [mask_iou(ref_masks[i], other_masks[j]) for i, j, _ in pairs if ref_masks[i] is not None]
    f32_count = sum(len(d) for d, _ in outputs["f32"].values())
    return matched / max(total, 1), (float(np.median(ious)) if ious else None), f32_count


def test_yolact_int8_passes_the_gate_and_the_job_runs_it(spark, yolact_int8, road_images, tmp_path):
    quantization = check_manifest(yolact_int8, "yolact")
    agreement = quantization["gate"]["agreement"]
    gate = Int8Gate()
    assert agreement["matched_fraction"] >= gate.min_matched and agreement["mask_iou_median"] >= gate.min_median_iou
    matched, median_mask_iou, count = job_agreement(
        spark, road_images, yolact_int8, fp16_view(yolact_int8, tmp_path / "fp16"), tmp_path, "yolact", INT8_GATE_SCORE
    )
    assert count > 0
    assert matched >= gate.min_matched, matched
    assert median_mask_iou is not None and median_mask_iou >= gate.min_median_iou, median_mask_iou


def test_detector_int8_passes_the_gate_and_the_job_runs_it(spark, detector_int8, road_images, tmp_path):
    quantization = check_manifest(detector_int8, "detector")
    assert quantization["ignored_scope"]["patterns"] == [".*/rpn/.*", ".*/roi_heads/.*"]
    gate = Int8Gate()
    assert quantization["gate"]["agreement"]["matched_fraction"] >= gate.min_matched
    matched, _, count = job_agreement(
        spark,
        road_images,
        detector_int8,
        fp16_view(detector_int8, tmp_path / "fp16"),
        tmp_path,
        "detector",
        quantization["gate"]["min_score"],
    )
    assert count > 0
    assert matched >= gate.min_matched, matched


def test_a_gate_int8_cannot_reach_fails_the_export_with_exit_3_and_no_manifest(tmp_path, calibration_images, capsys):
    code = export_main(
        [
            *YOLACT_ARGS,
            "--input-size",
            "160",
            "--out",
            str(tmp_path),
            "--precision",
            "int8",
            "--calibration-images",
            str(calibration_images),
            "--calibration-count",
            "4",
            "--int8-min-median-iou",
            "1.01",
        ]
    )
    assert code == 3
    assert "INT8 accuracy gate failed" in capsys.readouterr().err
    assert not (tmp_path / "manifest.json").exists()
    assert json.loads((tmp_path / "int8.json").read_text())["gate"]["passed"] is False


def test_a_calibration_directory_without_a_decodable_image_exits_2_naming_it(tmp_path, capsys):
    empty = tmp_path / "not images"
    empty.mkdir()
    (empty / "broken.jpg").write_bytes(b"not a JPEG")
    code = export_main(
        [*YOLACT_ARGS, "--out", str(tmp_path / "out"), "--precision", "int8", "--calibration-images", str(empty)]
    )
    assert code == 2
    assert str(empty) in capsys.readouterr().err
    assert not (tmp_path / "out" / "manifest.json").exists()


@pytest.fixture(scope="module")
def annotated_gate(tmp_path_factory) -> Path:
    """4 synthetic road images (160x120) with their COCO annotations: images/ and annotations.json."""
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset

    root = tmp_path_factory.mktemp("annotated_gate")
    generate_road_dataset(root, 4, 7, RoadSceneConfig(width=160, height=120, formats=("coco",)))
    return root


def test_eval_annotations_gate_on_ap(tmp_path, calibration_images, annotated_gate, capsys):
    # only the AP comparison decides here: random-init detections are near-tied noise (see the module docstring)
    args = [
        *YOLACT_ARGS,
        "--input-size",
        "160",
        "--precision",
        "int8",
        "--calibration-images",
        str(calibration_images),
        "--calibration-count",
        "4",
        "--gate-images",
        str(annotated_gate / "images"),
        "--eval-annotations",
        str(annotated_gate / "annotations.json"),
        "--int8-gate-score",
        "0",
        "--int8-min-matched",
        "0",
        "--int8-min-median-iou",
        "0",
    ]
    assert export_main([*args, "--out", str(tmp_path / "pass")]) == 0
    ap = load_manifest(tmp_path / "pass").data["quantization"]["gate"]["ap"]
    for name in ("f32", "int8"):
        assert {"box_ap", "box_ap50", "mask_ap", "mask_ap50"} <= set(ap[name])
    assert ap["box_ap_drop_points"] <= Int8Gate().max_ap_drop and ap["mask_ap_drop_points"] <= Int8Gate().max_ap_drop
    assert "AP (f32 -> int8): box_ap" in capsys.readouterr().out

    # INT8 asked to gain a point of AP on f32: the gate fails, exit 3, no manifest
    assert export_main([*args, "--out", str(tmp_path / "fail"), "--int8-max-ap-drop", "-1"]) == 3
    assert not (tmp_path / "fail" / "manifest.json").exists()
    gate = json.loads((tmp_path / "fail" / "int8.json").read_text())["gate"]
    assert gate["passed"] is False and any("box_ap" in failure for failure in gate["failures"])


def test_eval_annotations_without_the_gate_images_exit_2_naming_them(
    tmp_path, calibration_images, annotated_gate, capsys
):
    # the gate images held out of the calibration directory have no entry in these annotations
    code = export_main(
        [
            *YOLACT_ARGS,
            "--out",
            str(tmp_path / "out"),
            "--precision",
            "int8",
            "--calibration-images",
            str(calibration_images),
            "--eval-annotations",
            str(annotated_gate / "annotations.json"),
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--eval-annotations" in err and "no entry for 3 of the 3 gate images" in err
    assert not (tmp_path / "out").exists() or not (tmp_path / "out" / "manifest.json").exists()
