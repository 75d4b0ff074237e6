"""The export stage end to end: PyTorch -> ONNX -> simplified ONNX -> OpenVINO FP16 IR, parity gate, manifest."""

from __future__ import annotations

import json
import shutil

import onnx
import pytest

from model_export.cli import main as export_main
from pipelines.inference.model_manifest import load_manifest


@pytest.fixture(scope="module")
def r50_export(tmp_path_factory):
    out = tmp_path_factory.mktemp("yolact_resnet50")
    code = export_main(
        ["yolact", "--config", "yolact_resnet50", "--random-init", "--out", str(out), "--parity-count", "2"]
    )
    assert code == 0
    yield out
    shutil.rmtree(out, ignore_errors=True)  # ~300 MB of checkpoint, ONNX and IRs


def test_resnet50_parity_meets_the_gate(r50_export):
    report = json.loads((r50_export / "parity.json").read_text())
    assert report["passed"], report["failures"]
    rows = report["runtimes"]
    assert set(rows) == {
        "torch",
        "onnxruntime",
        "openvino_fp32ir_f32",
        "openvino_fp16ir_f32",
        "openvino_fp16ir_default",
    }
    assert set(rows["torch"]["raw"]) == {"loc", "conf", "mask", "proto"}
    for output, diff in rows["onnxruntime"]["raw"].items():
        assert diff["max_abs"] <= 1e-4, output
    for output, diff in rows["openvino_fp32ir_f32"]["raw"].items():
        assert diff["max_abs"] <= 1e-3, output
    for output, diff in rows["openvino_fp16ir_f32"]["raw"].items():
        assert diff["rel_to_range"] <= 1e-2, output
    torch_dets = rows["torch"]["detections"]["detections"]
    assert torch_dets == 2 * 100, "biased random weights must fill Detect's 100 detections per image"
    f32 = rows["openvino_fp16ir_f32"]["detections"]
    assert f32["matched_fraction"] >= 0.95 and f32["mask_iou_median"] >= 0.99
    bf16 = rows["openvino_fp16ir_default"]["detections"]
    assert bf16["detections"] > 0 and "matched_fraction" in bf16  # reported, not gated


def test_export_directory_is_a_complete_contract(r50_export):
    manifest = load_manifest(r50_export, verify=True)
    data = manifest.data
    assert data["model"] == "yolact" and data["config"] == "yolact_resnet50"
    assert data["num_classes"] == 81 and len(data["class_names"]) == 80 and data["class_names"][0] == "person"
    assert data["input"]["shape"] == [1, 3, 550, 550] and data["input"]["channel_order"] == "RGB"
    assert data["input"]["mean"] == pytest.approx([123.68, 116.78, 103.94])
    assert data["input"]["std"] == pytest.approx([58.40, 57.12, 57.38])
    assert data["outputs"] == {"loc": "loc", "conf": "conf", "mask": "mask", "proto": "proto"}
    assert data["postprocess"] == {
        "conf_thresh": 0.05,
        "nms_thresh": 0.5,
        "top_k": 200,
        "max_num_detections": 100,
        "nms": "fast",
    }
    assert data["priors"]["count"] == 19248
    assert set(data["files"]) >= {"onnx", "onnx_simplified", "ir_xml", "ir_bin", "priors"}
    assert set(data["sha256"]) == set(data["files"].values())
    assert {"torch", "onnx", "openvino"} <= set(data["tools"])
    graph = onnx.load(str(manifest.path("onnx_simplified"))).graph
    dims = [d.dim_value for d in graph.input[0].type.tensor_type.shape.dim]
    assert dims == [1, 3, 550, 550]
    assert [o.name for o in graph.output] == ["loc", "conf", "mask", "proto"]
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in graph.output}
    assert shapes["proto"] == [1, 138, 138, 32] and shapes["conf"] == [1, 19248, 81]
    assert not any(node.op_type == "Shape" for node in graph.node)


def test_executor_postprocess_equals_previous_on_r50_random_init_outputs(r50_export, tmp_path):
    """Box-local masks, RLE and label maps (issue 13) equal the previous implementation on real R50 550 outputs."""
    from tests.test_box_local_masks import assert_executor_postprocess_equals_previous, sample_paths

    paths = [p for p in sample_paths() if p.name in ("astronaut.jpg", "coffee.jpg")]
    assert assert_executor_postprocess_equals_previous(r50_export, paths, tmp_path) == 2 * 100


def test_weights_or_random_init_is_required(tmp_path, capsys):
    assert export_main(["yolact", "--config", "yolact_r18_small", "--out", str(tmp_path)]) == 2
    error = capsys.readouterr().err
    assert "--weights" in error and "--random-init" in error


def test_broken_parity_fails_the_export_without_a_manifest(tmp_path, capsys):
    code = export_main(
        [
            "yolact",
            "--config",
            "yolact_r18_small",
            "--random-init",
            "--out",
            str(tmp_path),
            "--parity-count",
            "1",
            "--gate-ort-atol",
            "0",
        ]
    )
    assert code == 3
    assert "parity gate failed" in capsys.readouterr().err
    assert not (tmp_path / "manifest.json").exists()
    assert json.loads((tmp_path / "parity.json").read_text())["passed"] is False


def test_an_export_replaces_an_earlier_one_only_once_it_passes_and_never_a_directory_of_other_files(tmp_path, capsys):
    small = ["yolact", "--config", "yolact_r18_small", "--random-init", "--parity-count", "1"]
    photos = tmp_path / "photos"
    photos.mkdir()
    (photos / "holiday.jpg").write_bytes(b"a photo")
    assert export_main([*small, "--out", str(photos)]) == 2
    assert "not empty and not an earlier export" in capsys.readouterr().err
    assert [p.name for p in photos.iterdir()] == ["holiday.jpg"]

    out = tmp_path / "model"
    assert export_main([*small, "--out", str(out), "--seed", "1"]) == 0
    passed = (out / "manifest.json").read_bytes()
    assert export_main([*small, "--out", str(out), "--seed", "2", "--gate-ort-atol", "0"]) == 3
    assert f"{out}: the earlier export is kept; this export's files are in {out}.failed" in capsys.readouterr().err
    assert (out / "manifest.json").read_bytes() == passed and load_manifest(out).name == "yolact_r18_small"
    assert json.loads((tmp_path / "model.failed" / "parity.json").read_text())["passed"] is False
    assert not (tmp_path / "model.failed" / "manifest.json").exists()
    assert export_main([*small, "--out", str(out), "--seed", "2"]) == 0
    assert (out / "manifest.json").read_bytes() != passed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model", "model.failed", "photos"], "nothing set aside left"


def test_a_checkpoint_that_does_not_fit_exits_2_naming_the_file(tmp_path, capsys):
    import torch

    checkpoint = tmp_path / "other_model.pth"
    torch.save({"backbone.layers.0.0.conv1.weight": torch.zeros(3, 3, 1, 1)}, checkpoint)
    code = export_main(
        ["yolact", "--config", "yolact_r18_small", "--weights", str(checkpoint), "--out", str(tmp_path / "out")]
    )
    err = capsys.readouterr().err
    assert code == 2 and "other_model.pth" in err
    assert not (tmp_path / "out" / "manifest.json").exists()


def test_a_sparkseg_checkpoint_is_exported_at_the_size_and_with_the_classes_it_was_trained_with(tmp_path, capsys):
    """A training checkpoint records the input side its weights learned (`max_size`) and its classes: the export's
    defaults, so that the IR sees images as the network did in training (an official checkpoint keeps the
    config's)."""
    import argparse

    import torch

    from model_export.models.yolact import Yolact, get_config
    from model_export.yolact_export import add_arguments, build_model

    state = Yolact(get_config("yolact_r18_small", max_size=128)).state_dict()
    trained, official = tmp_path / "best.pt", tmp_path / "official.pth"
    torch.save({"model": state, "max_size": 128, "yolact_config": "yolact_r18_small"}, trained)
    torch.save(state, official)
    fine_tuned = tmp_path / "fine_tuned.pt"  # trained on two classes of its own (model.class_names)
    two_classes = Yolact(get_config("yolact_r18_small", class_names=("hole", "rut"))).state_dict()
    torch.save({"model": two_classes, "max_size": 352, "class_names": ["hole", "rut"]}, fine_tuned)
    parser = argparse.ArgumentParser()
    add_arguments(parser)

    def exported(*flags: str):
        model, _ = build_model(parser.parse_args(["--config", "yolact_r18_small", "--out", str(tmp_path), *flags]))
        return model.cfg

    def exported_side(*flags: str) -> int:
        return exported(*flags).max_size

    assert exported_side("--weights", str(trained)) == 128
    assert exported_side("--weights", str(official)) == get_config("yolact_r18_small").max_size
    assert exported_side("--weights", str(trained), "--input-size", "256") == 256
    assert "best.pt was trained at 128 px; exporting at --input-size 256" in capsys.readouterr().err
    assert (exported("--weights", str(fine_tuned)).class_names, exported("--weights", str(fine_tuned)).num_classes) == (
        ("hole", "rut"),
        3,
    )
