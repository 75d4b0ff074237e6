"""The "before" executor function of `make bench-executor`: the job's ImageInference with the previous per-image
code (full image-size masks, full-size RLE and label map, PNG at zlib's default level, whole-image float32 copy
before the resize), from tests/reference_postprocess.py, the reference the tests compare the new code against.
Bench only: the job never uses it."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from pipelines.inference.detector_inference import DetectorInference
from pipelines.inference.image_inference import ExecutorModel, new_row, timed
from pipelines.inference.yolact_inference import YolactInference
from pipelines.ops import yolact_postprocess as yp
from pipelines.ops.image_decode import decode_image
from tests import reference_postprocess as ref


class _LegacyPreprocess:
    def decode_and_preprocess(self, data: bytes, path: str):
        rgb = decode_image(data, path, self.max_image_pixels)
        return ref.preprocess_rgb(rgb, self.input_spec), (int(rgb.shape[1]), int(rgb.shape[0]))


@dataclass(frozen=True)
class LegacyYolactInference(_LegacyPreprocess, YolactInference):
    """YolactInference.postprocess_one as it was: every detect() result written, full-size masks."""

    def postprocess_one(self, row: dict, raw: dict, model: ExecutorModel) -> None:
        with timed(row, "postprocess"):
            post = {k: self.postprocess[k] for k in ("conf_thresh", "nms_thresh", "top_k", "max_num_detections")}
            det = yp.detect(
                raw["loc"],
                raw["conf"],
                raw["mask"],
                model.arrays["priors"],
                nms=self.postprocess.get("nms", "fast"),
                **post,
            )
            det = det.take(det.scores > np.float32(self.written_score_threshold("conf_thresh")))
            instances, labels = ref.postprocess_image(
                det, raw["proto"], row["width"], row["height"], self.class_names, labels=self.masks == "rle_and_png"
            )
            row["instances"] = instances
        if labels is not None:
            self.write_label_map(row, labels)


@dataclass(frozen=True)
class LegacyDetectorInference(_LegacyPreprocess, DetectorInference):
    """The detector's postprocess is unchanged; only the preprocess differs."""


class _InThreadInference:
    """The current code with each image's inference run by `InferRequest.infer` in the worker's own thread (the CPU
    plugin runs a synchronous request there) instead of OpenVINO's stream thread behind the async queue: the bench's
    "after_thread" row, one busy thread per process where the queue makes two take turns. Bench only: in the job it
    crashed a long-lived process (the test suite's pytest worker)."""

    def model(self) -> ExecutorModel:
        model = super().model()
        if not hasattr(model.ir, "_in_thread"):  # once per process: LazyModel keeps the model
            model.ir._in_thread = _RequestInThisThread(model.ir)
            model.ir.infer = model.ir._in_thread.infer
        return model


class _RequestInThisThread:
    """CompiledIR.infer's contract (static-shape outputs copied into reused [B, ...] arrays) for a one-stream IR,
    each image through one InferRequest in the calling thread."""

    def __init__(self, ir) -> None:
        self.ir, self.request = ir, ir.compiled.create_infer_request()

    def infer(self, batch):
        ir = self.ir
        if ir._static_outputs is None:
            per_image = []
            for image in batch:
                self.request.infer({ir.input_name: image[None]})
                per_image.append({n: self.request.get_tensor(n).data.copy() for n in ir.output_names})
            return {n: np.concatenate([out[n] for out in per_image]) for n in ir.output_names}
        outputs = ir._outputs(len(batch))
        for index, image in enumerate(batch):
            self.request.infer({ir.input_name: image[None]})
            for name, out in outputs.items():
                out[index] = self.request.get_tensor(name).data[0]
        return dict(outputs)


@dataclass(frozen=True)
class InThreadYolactInference(_InThreadInference, YolactInference):
    pass


@dataclass(frozen=True)
class InThreadDetectorInference(_InThreadInference, DetectorInference):
    pass


class _OverlappedInference:
    """The current code with each image's decode and preprocess overlapping the previous image's inference: the
    compiled IR's async queue is fed from a generator that decodes as it is iterated (with one request, starting
    image i waits for image i - 1, and image i + 1 decodes while i runs on OpenVINO's thread). The bench's
    "after_overlap" row, measuring whether a second busy thread per process pays when P processes already fill
    the cores. Bench only (a failing image fails its batch here)."""

    def process_images(self, records: list, guard=None) -> list[dict]:
        rows = [new_row(record) for record in records]
        model = self.model()

        def tensors():
            for row, record in zip(rows, records):
                with timed(row, "preprocess"):
                    tensor, (row["width"], row["height"]) = self.decode_and_preprocess(
                        bytes(record.content), record.path
                    )
                yield tensor

        start = time.perf_counter()
        outputs = model.ir.infer(_Sized(tensors(), len(rows)))
        decode = sum(row["timings"]["preprocess_s"] for row in rows)
        per_image = (time.perf_counter() - start - decode) / max(len(rows), 1)
        names = model.manifest.outputs
        for index, row in enumerate(rows):
            row["timings"]["infer_s"] += per_image
            self.postprocess_one(row, {role: outputs[name][index] for role, name in names.items()}, model)
            row["status"] = "ok"
        return rows


class _Sized:
    """An iterator with a length (CompiledIR.infer sizes its outputs first, then iterates once)."""

    def __init__(self, items, length: int) -> None:
        self.items, self.length = items, length

    def __len__(self) -> int:
        return self.length

    def __iter__(self):
        return iter(self.items)


@dataclass(frozen=True)
class OverlappedYolactInference(_OverlappedInference, YolactInference):
    pass


@dataclass(frozen=True)
class OverlappedDetectorInference(_OverlappedInference, DetectorInference):
    pass
