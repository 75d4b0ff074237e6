"""The detector's export stage end to end: FactorNet Faster R-CNN -> ONNX -> simplified ONNX -> OpenVINO FP16 IR,
parity gate, manifest; and the exported model, run the way the job runs it, against torchvision's own model."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from model_export.detector_export import (
    build_model,
    detection_agreement,
    input_spec,
    load_detector_checkpoint,
    synthetic_road_images,
    valid_detections,
)
from model_export.models.checkpoint import CheckpointError
from model_export.models.factornet_detector import DetectorNetwork, FactorNetDetector, get_detector_config
from pipelines.inference.model_manifest import load_manifest, write_manifest
from pipelines.inference.openvino_runtime import CompiledIR, RuntimeSettings
from pipelines.inference.single_process import infer_files
from pipelines.ops.preprocess import preprocess_rgb
from tests.fixtures_detector import (  # noqa: F401
    DETECTOR_CONFIG,
    DETECTOR_SEED,
    detector_export,
    export_small_detector,
    road_images,  # noqa: F401
)

F32_RUNTIMES = ("onnxruntime", "openvino_fp32ir_f32")


def torch_model() -> FactorNetDetector:
    """The exported model's torch twin: same config, seed and biasing as the fixture's --random-init export."""
    args = argparse.Namespace(
        config=DETECTOR_CONFIG, weights=None, random_init=True, input_size=None, class_names=None, seed=DETECTOR_SEED
    )
    return build_model(args)[0]


def fp32_copy(export_dir: Path, target: Path) -> Path:
    """The export with an FP32-weights IR (what "OpenVINO f32 matches torch" is about; FP16 weights are not)."""
    import openvino as ov

    target.mkdir()
    ov.save_model(
        ov.convert_model(str(export_dir / "model.sim.onnx")), str(target / "model.xml"), compress_to_fp16=False
    )
    data = {k: v for k, v in load_manifest(export_dir).data.items() if k not in ("sha256", "format_version")}
    write_manifest(target, {**data, "files": {"ir_xml": "model.xml", "ir_bin": "model.bin"}})
    return target


def test_parity_meets_the_gate(detector_export):
    report = json.loads((detector_export / "parity.json").read_text())
    assert report["passed"], report["failures"]
    rows = report["runtimes"]
    assert set(rows) == {
        "torch",
        "onnxruntime",
        "openvino_fp32ir_f32",
        "openvino_fp16ir_f32",
        "openvino_fp16ir_default",
    }
    torch_dets = rows["torch"]["detections"]["detections"]
    assert torch_dets == 3 * 50, "the biased random weights must fill the 50 output rows of each parity image"
    for runtime in F32_RUNTIMES:
        det = rows[runtime]["detections"]
        assert det["detections"] == torch_dets and det["reproduced_fraction"] == 1.0, runtime
        assert rows[runtime]["labels_identical"], runtime
        assert det["box_max_rel"] <= 1e-3 and det["score_max_abs"] <= 1e-3, runtime
    fp16 = rows["openvino_fp16ir_f32"]["detections"]
    assert fp16["matched_fraction"] >= 0.9 and fp16["box_iou_median"] >= 0.95
    assert rows["openvino_fp16ir_default"]["detections"]["detections"] > 0  # reported, not gated
    transform = report["torchvision_transform"]
    assert transform["reproduced_fraction"] == 1.0 and transform["box_max_rel"] <= 1e-3


def test_onnxruntime_and_openvino_f32_match_torch_on_new_images(detector_export, tmp_path):
    """Independent of the report: fresh synthetic roads, torch vs ONNX Runtime and OpenVINO f32 (FP32 IR)."""
    import onnxruntime as ort

    model = torch_model()
    spec = input_spec(model.cfg)
    network = DetectorNetwork(model).eval()
    session = ort.InferenceSession(str(detector_export / "model.sim.onnx"), providers=["CPUExecutionProvider"])
    openvino = CompiledIR(fp32_copy(detector_export, tmp_path / "fp32") / "model.xml", RuntimeSettings("f32"))
    compared = 0
    for _, rgb in synthetic_road_images(2, 77, (240, 320)):
        x = preprocess_rgb(rgb, spec)[None]
        with torch.no_grad():
            boxes, scores, labels = (v[0].numpy() for v in network(torch.from_numpy(x)))
        assert (scores > 0).sum() > 0
        for name, (o_boxes, o_scores, o_labels) in {
            "onnxruntime": [o[0] for o in session.run(["boxes", "scores", "labels"], {"image": x})],
            "openvino": [openvino.infer_one(x[0])[k] for k in ("boxes", "scores", "labels")],
        }.items():
            np.testing.assert_array_equal(o_labels, labels, err_msg=name)
            np.testing.assert_allclose(o_boxes, boxes, rtol=1e-3, atol=1e-3, err_msg=name)
            np.testing.assert_allclose(o_scores, scores, atol=1e-4, err_msg=name)
            compared += int((scores > 0).sum())
    assert compared > 0


def test_export_directory_is_a_complete_contract(detector_export):
    manifest = load_manifest(detector_export, verify=True)
    data = manifest.data
    assert data["model"] == "detector" and data["config"] == "factornet_small"
    assert data["num_classes"] == 5 and data["class_names"] == ["pothole", "crack", "patch", "puddle"]
    assert data["input"]["shape"] == [1, 3, 320, 320] and data["input"]["channel_order"] == "RGB"
    assert data["input"]["mean"] == pytest.approx([123.675, 116.28, 103.53])
    assert data["input"]["std"] == pytest.approx([58.395, 57.12, 57.375])
    assert data["input"]["resize"]["keep_aspect_ratio"] is False
    assert data["outputs"] == {"boxes": "boxes", "scores": "scores", "labels": "labels"}
    assert data["postprocess"] == {"score_thresh": 0.05, "nms_thresh": 0.5, "detections_per_img": 50}
    assert data["weights"]["random_init"] is True and data["weights"]["trained"] is False
    assert set(data["files"]) == {"onnx", "onnx_simplified", "ir_xml", "ir_bin", "parity"}
    assert set(data["sha256"]) == set(data["files"].values())
    graph = onnx.load(str(manifest.path("onnx_simplified"))).graph
    shape = lambda value: [d.dim_value for d in value.type.tensor_type.shape.dim]  # noqa: E731
    assert shape(graph.input[0]) == [1, 3, 320, 320]
    assert {o.name: shape(o) for o in graph.output} == {"boxes": [1, 50, 4], "scores": [1, 50], "labels": [1, 50]}


def test_exported_model_in_the_job_path_equals_torchvision_on_original_images(detector_export, road_images, tmp_path):
    """Decode -> our preprocessing -> IR -> DetectorInference (boxes in original pixels) against the torch
    model's own torchvision path (GeneralizedRCNNTransform resize + normalize, boxes scaled back)."""
    from pipelines.ops.image_decode import decode_image
    from pipelines.ops.yolact_postprocess import Detections

    model = torch_model()
    paths = sorted(road_images.iterdir())
    rows = infer_files(
        fp32_copy(detector_export, tmp_path / "fp32"),
        [str(p) for p in paths],
        str(tmp_path),
        str(road_images),
        RuntimeSettings(precision="f32"),
        family="detector",
    )
    total = 0
    for path, row in zip(paths, rows):
        assert row["status"] == "ok", row
        rgb = decode_image(path.read_bytes(), str(path))
        with torch.no_grad():
            result = model([torch.from_numpy(rgb).permute(2, 0, 1).float() / 255.0])[0]
        expected = valid_detections({k: v.numpy() for k, v in result.items()}, 0.05)
        got = Detections(
            boxes=np.float32([i["box"] for i in row["instances"]]).reshape(-1, 4),
            coeffs=np.zeros((len(row["instances"]), 0)),
            classes=np.int64([i["class_id"] + 1 for i in row["instances"]]),
            scores=np.float32([i["score"] for i in row["instances"]]),
        )
        agreement = detection_agreement([expected], [got])
        assert agreement["matched_fraction"] == 1.0, (path.name, agreement)
        assert agreement["box_max_abs"] <= 1.0 + 1e-3  # int pixels: truncated toward zero
        assert agreement["score_max_abs"] <= 1e-3
        assert all(i["mask"] is None for i in row["instances"]) and row["mask_path"] is None
        total += len(row["instances"])
    assert total > 0


def test_weights_or_random_init_is_required(tmp_path, capsys):
    from model_export.cli import main as export_main

    assert export_main(["detector", "--config", "factornet_small", "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "--weights" in error and "--random-init" in error


def test_checkpoint_loads_into_its_config_and_a_mismatch_names_the_keys(tmp_path):
    cfg = get_detector_config("factornet_small")
    torch.manual_seed(1)
    trained = FactorNetDetector(cfg)
    path = tmp_path / "detector.pth"
    torch.save({"model": trained.state_dict(), "epoch": 3}, path)
    torch.manual_seed(2)
    fresh = FactorNetDetector(cfg)
    assert load_detector_checkpoint(fresh, path) == len(trained.state_dict())
    for key, value in trained.state_dict().items():
        assert torch.equal(fresh.state_dict()[key], value), key
    with pytest.raises(CheckpointError, match=r"missing 8: backbone.fpn.*--config"):
        load_detector_checkpoint(FactorNetDetector(get_detector_config("factornet_small_fpn")), path)
    with pytest.raises(CheckpointError, match="shape differs.*cls_score"):
        load_detector_checkpoint(FactorNetDetector(get_detector_config("factornet_small", class_names=("a",))), path)


def test_broken_parity_fails_the_export_without_a_manifest(tmp_path, capsys):
    code = export_small_detector(tmp_path, "--parity-count", "1", "--gate-min-reproduced", "1.5")
    assert code == 3
    assert "parity gate failed" in capsys.readouterr().err
    assert not (tmp_path / "manifest.json").exists()
    assert json.loads((tmp_path / "parity.json").read_text())["passed"] is False


def test_register_as_registers_the_export_in_the_mlflow_registry(tmp_path, capsys, monkeypatch):
    """--register-as NAME: the export directory as an MLflow run's artifacts, registered as version 1 of NAME in the
    registry MLflow reads (a sqlite store here); the version's files are the export's."""
    import mlflow

    from pipelines.io.model_registry import download_model
    from tests.test_model_registry import read_the_environment

    read_the_environment(monkeypatch)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", "exports")
    mlflow.MlflowClient().create_experiment("exports", artifact_location=(tmp_path / "artifacts").as_uri())
    out = tmp_path / "export"
    assert export_small_detector(out, "--parity-count", "1", "--register-as", "roads-detector") == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == f"registered {out} as models:/roads-detector/1"
    downloaded = download_model("models:/roads-detector/1")
    assert load_manifest(downloaded).model_sha256 == load_manifest(out).model_sha256
    assert sorted(p.name for p in downloaded.iterdir()) == sorted(p.name for p in out.iterdir())
