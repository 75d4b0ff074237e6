"""An INT8 copy of an export, made the way `python -m model_export ... --precision int8` makes it (NNCF PTQ of the
FP16 IR, calibration images decoded and preprocessed as the job does; no gate: benches report the numbers).

    .venv/bin/python scripts/bench/int8_model.py --out work/bench/yolact_default_int8   # the bundled model

The copy runs anywhere the job runs (the bench on a machine without NNCF takes it with --model DIR).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

BUNDLED = REPO / "samples" / "models" / "yolact_default"
CALIBRATION_SEED = 777  # synthetic roads: neither training (seed 1) nor the val split (20261122) uses it


def make_int8_model(
    source: Path, out: Path, calibration: list, calibration_note: str, ignored_patterns: tuple[str, ...] = ()
) -> tuple[Path, dict]:
    """Copy `source` to `out`, add model.int8.xml/.bin quantized on `calibration` ((name, size, rgb) as
    quantize.decode_all gives; `ignored_patterns`: the family's ignored scope, e.g. the detector's) and the manifest
    `--precision int8` writes."""
    from model_export import quantize
    from pipelines.inference.model_manifest import load_manifest, write_manifest

    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(source, out)
    manifest = load_manifest(source)
    tensors = [quantize.preprocess_rgb(rgb, manifest.input) for _, _, rgb in calibration]
    start = time.perf_counter()
    record = quantize.quantize_ir(
        out / "model.xml", out / quantize.INT8_FILES["ir_xml"], tensors, manifest.input["name"], list(ignored_patterns)
    )
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["calibration"] = {
        "count": len(tensors),
        "sha256": quantize.image_set_sha256(calibration),
        "directory": calibration_note,
    }
    data = {k: v for k, v in manifest.data.items() if k not in ("format_version", "sha256")}
    files = {role: rel for role, rel in data["files"].items() if (out / rel).is_file()}  # no ONNX bundled
    files["ir_xml_fp16"], files["ir_bin_fp16"] = files["ir_xml"], files["ir_bin"]
    files["ir_xml"], files["ir_bin"] = quantize.INT8_FILES["ir_xml"], quantize.INT8_FILES["ir_bin"]
    data.update(files=files, weights_precision="int8", quantization=record)
    write_manifest(out, data)
    return out, record


def synthetic_calibration(count: int, seed: int = CALIBRATION_SEED) -> list:
    """`count` synthetic road images, decoded (the bundled model's domain)."""
    from model_export import quantize
    from pipelines.datasets.synthetic_roads import RoadSceneConfig, generate_road_dataset

    with tempfile.TemporaryDirectory(prefix="int8_calibration_") as tmp:
        generate_road_dataset(Path(tmp), count, seed, RoadSceneConfig(formats=()))
        images, _ = quantize.decode_all(sorted((Path(tmp) / "images").iterdir()))
    return images


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", default=str(BUNDLED), help="export directory (default: the bundled model)")
    parser.add_argument("--out", required=True, help="where the INT8 copy goes (replaced)")
    parser.add_argument("--calibration-count", type=int, default=64)
    args = parser.parse_args(argv)
    from model_export.detector_export import INT8_IGNORED_SCOPE
    from pipelines.inference.model_manifest import load_manifest

    ignored = INT8_IGNORED_SCOPE if load_manifest(args.source).model == "detector" else ()  # as the export does
    calibration = synthetic_calibration(args.calibration_count)
    out, record = make_int8_model(
        Path(args.source), Path(args.out), calibration, f"synthetic roads, seed {CALIBRATION_SEED}", ignored
    )
    print(f"{out}: {record['fake_quantize_nodes']} FakeQuantize nodes, {record['seconds']} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
