"""The bundled default YOLACT is trained: on a fresh synthetic val split (a seed training never used), run through
the Spark inference job, its mask AP@[.5:.95] on the blob-like classes (pothole, patch, puddle) is >= 0.5
(pycocotools, through pipelines.report.evaluate: the one AP implementation). Cracks are reported, not gated."""

from __future__ import annotations

import json

from pipelines.inference.model_manifest import load_manifest
from pipelines.report.evaluate import evaluate_output
from tests.conftest import SAMPLES
from tests.fixtures_evaluation import BROKEN, ROAD_GROUPS, VAL_IMAGES

MODEL_DIR = SAMPLES / "models" / "yolact_default"


def test_bundled_yolact_reaches_blob_mask_ap_on_a_fresh_synthetic_val_split(bundled_val_run, tmp_path):
    manifest = load_manifest(MODEL_DIR)
    assert manifest.trained, "samples/models/yolact_default must be a trained model (weights.trained)"
    assert "SYNTHETIC" in manifest.data["note"], "the bundled model's note says what it is for"
    assert sorted(p.name for p in MODEL_DIR.iterdir()) == sorted(
        ["manifest.json", "model.xml", "model.bin", "priors.npy", "parity.json"]
    )
    assert sum(p.stat().st_size for p in MODEL_DIR.iterdir()) <= 30 * 1024 * 1024

    summary = bundled_val_run.summary
    assert summary["counts"]["done"] == VAL_IMAGES and summary["model"]["trained"]
    assert summary["counts"]["failed"] == 1 and summary["failed_images"][0].endswith(f"/images/{BROKEN}")
    assert summary["report"] == str(bundled_val_run.output / "report.html")  # output.overlays: true
    assert len(json.loads((bundled_val_run.output / "overlays" / "index.json").read_text())["images"]) == VAL_IMAGES
    assert summary["model"]["note"] == manifest.data["note"]
    assert summary["model"]["classes"] == ["pothole", "crack", "patch", "puddle"]

    evaluation = evaluate_output(bundled_val_run.output, bundled_val_run.annotations, groups=ROAD_GROUPS)
    assert evaluation["results"], "the trained model must detect something"
    overall = evaluation["overall"]
    report = {
        "mask_ap_blobs": round(overall["mask_ap_blobs"], 4),
        "mask_ap_crack": round(overall["mask_ap_crack"], 4),
        "images": evaluation["images"],
    }
    (tmp_path / "ap.json").write_text(json.dumps(report))
    print(f"bundled YOLACT on fresh synthetic val: {report}")
    assert evaluation["images"] == VAL_IMAGES
    assert overall["mask_ap_blobs"] >= 0.5, report
