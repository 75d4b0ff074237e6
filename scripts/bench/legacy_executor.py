"""The "before" executor function of `make bench-executor`: the job's ImageInference with the previous per-image
code (full image-size masks, full-size RLE and label map, PNG at zlib's default level, whole-image float32 copy
before the resize), from tests/reference_postprocess.py, the reference the tests compare the new code against.
Bench only: the job never uses it."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from pipelines.ops import yolact_postprocess as yp
from pipelines.inference.detector_inference import DetectorInference
from pipelines.ops.image_decode import decode_image
from pipelines.inference.image_inference import ExecutorModel, timed
from pipelines.inference.yolact_inference import YolactInference
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
            det = yp.detect(raw["loc"], raw["conf"], raw["mask"], model.arrays["priors"],
                            nms=self.postprocess.get("nms", "fast"), **post)
            det = det.take(det.scores > np.float32(self.written_score_threshold("conf_thresh")))
            instances, labels = ref.postprocess_image(det, raw["proto"], row["width"], row["height"],
                                                      self.class_names, labels=self.masks == "rle_and_png")
            row["instances"] = instances
        if labels is not None:
            self.write_label_map(row, labels)


@dataclass(frozen=True)
class LegacyDetectorInference(_LegacyPreprocess, DetectorInference):
    """The detector's postprocess is unchanged; only the preprocess differs."""


class _QueuedInference:
    """The current code with each image's inference handed to OpenVINO's async queue even with one stream (its
    stream thread runs it while the worker's thread waits), as the executors ran it before session 44: the bench's
    "after_queue" row, to compare with the calling thread's inference (the current code) side by side."""

    def model(self) -> ExecutorModel:
        import openvino as ov

        model = super().model()
        if model.ir._request is not None:   # once per process: LazyModel keeps the model
            model.ir._queue, model.ir._request = ov.AsyncInferQueue(model.ir.compiled, model.ir.num_requests), None
        return model


@dataclass(frozen=True)
class QueuedYolactInference(_QueuedInference, YolactInference):
    pass


@dataclass(frozen=True)
class QueuedDetectorInference(_QueuedInference, DetectorInference):
    pass
