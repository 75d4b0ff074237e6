"""Detector fixtures: one random-init `factornet_small` export (with biased box predictor, so it detects) and a
handful of small synthetic road images. Export takes ~30-60 s on 2 cores: share it (conftest line in the report).

    def test_x(detector_export, road_images): ...
"""

from __future__ import annotations

from pathlib import Path

import pytest

DETECTOR_CONFIG = "factornet_small"
DETECTOR_SEED = 0
ROAD_IMAGE_COUNT = 6


def export_small_detector(out: Path, *extra: str) -> int:
    """`python -m model_export detector --config factornet_small --random-init ...` into `out`; the exit code."""
    from model_export.cli import main as export_main

    return export_main(
        [
            "detector",
            "--config",
            DETECTOR_CONFIG,
            "--random-init",
            "--seed",
            str(DETECTOR_SEED),
            "--out",
            str(out),
            "--parity-count",
            "3",
            *extra,
        ]
    )


@pytest.fixture(scope="session")
def detector_export(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("detector_factornet_small")
    assert export_small_detector(out) == 0
    return out


@pytest.fixture(scope="session")
def road_images(tmp_path_factory) -> Path:
    """A directory of ROAD_IMAGE_COUNT synthetic road images: JPEG 200x150 and PNG 160x120 (lossless)."""
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset

    root = tmp_path_factory.mktemp("roads")
    half = ROAD_IMAGE_COUNT // 2
    generate_road_dataset(root / "jpg", half, 11, RoadSceneConfig(width=200, height=150, formats=()))
    generate_road_dataset(
        root / "png",
        ROAD_IMAGE_COUNT - half,
        12,
        RoadSceneConfig(width=160, height=120, image_format="png", formats=()),
    )
    images = root / "images"
    images.mkdir()
    for path in sorted((root / "jpg" / "images").iterdir()) + sorted((root / "png" / "images").iterdir()):
        path.rename(images / f"{path.parent.parent.name}_{path.name}")
    return images
