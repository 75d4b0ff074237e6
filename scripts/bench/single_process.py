"""One-process bench rows: the job's per-image code (read, decode + preprocess, infer, YOLACT postprocess with RLE
masks; pipelines.inference.yolact_inference) without Spark, with the inference done by PyTorch eager (the paper's
"YOLACT
Original": the model module run one image at a time), ONNX Runtime, or OpenVINO (pipelines/inference/single_process.py).

    python scripts/bench/single_process.py --engine torch|onnxruntime|openvino --precision f32|bf16 \
        --model EXPORT_DIR --images DIR [--threads 2] [--batch-size 8]

Prints one JSON line: images, seconds (the image loop after loading and one warm-up image), images_per_s,
load_s, stage_seconds (summed over images), settings.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from pipelines.inference.image_inference import ExecutorModel  # noqa: E402
from pipelines.inference.model_manifest import load_manifest  # noqa: E402
from pipelines.inference.openvino_runtime import RuntimeSettings  # noqa: E402
from pipelines.inference.single_process import infer_files, local_file_records  # noqa: E402
from pipelines.inference.yolact_inference import YolactInference  # noqa: E402
from pipelines.io.storage import Location  # noqa: E402

NO_OUTPUT = "/nonexistent-sparkseg-bench-output"  # masks="rle": nothing is written


class TorchRunner:
    """The PyTorch module, one image at a time; bf16 through CPU autocast. infer: [B, 3, H, W] -> {name: [B, ...]}."""

    def __init__(self, manifest, precision: str, threads: int) -> None:
        import torch

        from model_export.yolact_export import add_arguments, build_model

        torch.set_num_threads(threads)
        weights = manifest.data["weights"]
        if not weights.get("random_init"):
            raise SystemExit(
                f"{manifest.root}: the torch row rebuilds the model from its random-init seed; this "
                "export was made from a checkpoint"
            )
        # the export's own arguments (defaults from its parser), so the rebuilt module equals the exported one
        parser = argparse.ArgumentParser()
        add_arguments(parser)
        args = parser.parse_args(
            [
                "--config",
                manifest.data["config"],
                "--random-init",
                "--out",
                "unused",
                "--seed",
                str(int(weights["seed"])),
            ]
        )
        self.model, _ = build_model(args)
        self.torch, self.precision = torch, precision
        self.names = ["loc", "conf", "mask", "proto"]

    def infer(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        torch = self.torch
        results = []
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=self.precision == "bf16"):
            for image in batch:
                outputs = self.model(torch.from_numpy(np.ascontiguousarray(image[None])))
                results.append([out.float().numpy() for out in outputs])
        return {name: np.concatenate([r[i] for r in results]) for i, name in enumerate(self.names)}


class OrtRunner:
    """ONNX Runtime (CPU, f32) on the export's simplified ONNX, one image at a time."""

    def __init__(self, manifest, threads: int) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(manifest.path("onnx_simplified")), options, providers=["CPUExecutionProvider"]
        )
        self.input_name = self.session.get_inputs()[0].name
        self.names = [out.name for out in self.session.get_outputs()]

    def infer(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        results = [self.session.run(self.names, {self.input_name: image[None]}) for image in batch]
        return {name: np.concatenate([r[i] for r in results]) for i, name in enumerate(self.names)}


@dataclass(frozen=True)
class FixedModelInference(YolactInference):
    """YolactInference whose model is given (a torch or ONNX Runtime runner) instead of compiled from the IR."""

    fixed_model: object = None

    def model(self) -> ExecutorModel:
        return self.fixed_model


def build_runner(engine: str, model_dir: str, precision: str, threads: int, streams: int, input_root: str):
    """(run(paths) -> result rows, settings). The model is loaded here, outside the timed loop."""
    manifest = load_manifest(model_dir, verify=True)
    # exactly pipelines/inference/single_process.py; its compiled model stays cached in-process
    if engine == "openvino":
        settings = RuntimeSettings(precision=precision, threads=threads, streams=streams)

        def run_openvino(paths: list[Path], batch_size: int) -> list[dict]:
            return infer_files(manifest.root, paths, NO_OUTPUT, input_root, settings=settings, batch_size=batch_size)

        return run_openvino, {"threads": threads, "streams": streams, "precision": precision}
    if engine == "torch":
        runner = TorchRunner(manifest, precision, threads)
    elif engine == "onnxruntime":
        if precision != "f32":
            raise SystemExit("onnxruntime: the CPU provider runs this model in f32 only")
        runner = OrtRunner(manifest, threads)
    else:
        raise SystemExit(f"--engine {engine}: choose torch, onnxruntime or openvino")
    task = FixedModelInference(
        model_dir=str(manifest.root),
        model_sha256=manifest.model_sha256,
        class_names=tuple(manifest.class_names),
        input_spec=manifest.input,
        postprocess=manifest.postprocess,
        settings=RuntimeSettings(precision=precision),
        output=Location(NO_OUTPUT),
        input_root=input_root,
        masks="rle",
        fixed_model=ExecutorModel(manifest, runner, {"priors": np.load(manifest.path("priors"))}),
    )

    def run_fixed(paths: list[Path], batch_size: int) -> list[dict]:
        rows = []
        for first in range(0, len(paths), batch_size):
            rows.extend(task.process_batch(local_file_records(paths[first : first + batch_size])))
        return rows

    return run_fixed, {"threads": threads, "precision": precision, "images_per_call": 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", required=True, choices=["torch", "onnxruntime", "openvino"])
    parser.add_argument("--precision", default="f32", choices=["f32", "bf16"])
    parser.add_argument("--model", required=True, help="export directory (manifest.json)")
    parser.add_argument("--images", required=True, help="directory of img_*.jpg")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--streams", type=int, default=2, help="OpenVINO streams (openvino only)")
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)

    paths = sorted(Path(args.images).glob("img_*.jpg"))
    if not paths:
        raise SystemExit(f"{args.images}: no img_*.jpg bench images")
    started = time.perf_counter()
    run, settings = build_runner(
        args.engine, args.model, args.precision, args.threads, args.streams, input_root=str(Path(args.images))
    )
    run(paths[:1], 1)  # warm-up: compilation, first-call allocations, lazy initialisation
    load_s = time.perf_counter() - started
    started = time.perf_counter()
    rows = run(paths, args.batch_size)
    seconds = time.perf_counter() - started
    stages: dict[str, float] = {}
    for row in rows:
        for name, value in row["timings"].items():
            stages[name.removesuffix("_s")] = stages.get(name.removesuffix("_s"), 0.0) + value
    errors = [row["error_message"] for row in rows if row["status"] != "ok"]
    print(
        json.dumps(
            {
                "images": len(paths),
                "failed": len(errors),
                "first_error": errors[0] if errors else None,
                "seconds": round(seconds, 3),
                "images_per_s": round(len(paths) / seconds, 3),
                "load_s": round(load_s, 3),
                "stage_seconds": {k: round(v, 3) for k, v in stages.items()},
                "settings": settings,
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
