"""inference.jpeg_draft (a reduced-size JPEG decode, which changes the pixels the model sees) is off by default and
applies only where it is declared: the executor decodes fully unless its task says otherwise, and even then only
JPEGs are decoded reduced."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image

from pipelines.inference.model_manifest import load_manifest
from pipelines.inference.openvino_runtime import RuntimeSettings
from pipelines.inference.yolact_inference import YolactInference
from pipelines.io.storage import Location
from pipelines.job_config import JobConfig, load_config
from pipelines.ops.image_decode import decode_image, decode_image_reduced
from pipelines.ops.preprocess import preprocess_rgb
from tests.conftest import SAMPLES


def _task(manifest, tmp_path, **declared) -> YolactInference:
    return YolactInference(
        model_dir=str(manifest.root),
        model_sha256=manifest.model_sha256,
        class_names=tuple(manifest.class_names),
        input_spec=manifest.input,
        postprocess=dict(manifest.postprocess),
        settings=RuntimeSettings(precision="f32", threads=1, streams=1),
        output=Location(str(tmp_path)),
        input_root=str(tmp_path),
        **declared,
    )


def _encoded(pixels: np.ndarray, fmt: str) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, fmt)
    return buffer.getvalue()


def test_jpeg_draft_is_off_by_default_and_applies_only_to_jpegs_of_tasks_that_declare_it(tmp_path):
    assert JobConfig.from_dict(load_config()).inference.jpeg_draft is False
    manifest = load_manifest(SAMPLES / "models" / "yolact_default")
    _, _, in_height, in_width = manifest.input["shape"]
    pixels = np.random.default_rng(0).integers(0, 256, (1080, 1920, 3), dtype=np.uint8)
    jpeg, png = _encoded(pixels, "JPEG"), _encoded(pixels, "PNG")
    default, declared = _task(manifest, tmp_path), _task(manifest, tmp_path, jpeg_draft=True)
    assert default.jpeg_draft is False

    full, size = default.decode_and_preprocess(jpeg, "a.jpg")
    np.testing.assert_array_equal(full, preprocess_rgb(decode_image(jpeg, "a.jpg"), manifest.input))
    reduced, reduced_size = declared.decode_and_preprocess(jpeg, "a.jpg")
    rgb, _ = decode_image_reduced(jpeg, "a.jpg", (int(in_width), int(in_height)))
    assert rgb.shape[0] < 1080  # decoded at a DCT scale, so the model's input differs from the full decode's
    np.testing.assert_array_equal(reduced, preprocess_rgb(rgb, manifest.input))
    assert not np.array_equal(reduced, full)
    assert size == reduced_size == (1920, 1080)  # masks are made at the full size either way

    for task in (default, declared):  # not a JPEG: the full decode, declared or not
        tensor, png_size = task.decode_and_preprocess(png, "a.png")
        np.testing.assert_array_equal(tensor, preprocess_rgb(pixels, manifest.input))
        assert png_size == (1920, 1080)
