"""Which executor task class runs a model family: the manifest's "model" -> its ImageInference subclass. No Spark
imports, so one-process runs and benchmarks use the job's own classes without pyspark."""

from __future__ import annotations

import importlib

FAMILIES = {  # manifest "model" -> the ImageInference subclass that postprocesses its outputs
    "yolact": ("pipelines.inference.yolact_inference", "YolactInference"),
    "detector": ("pipelines.inference.detector_inference", "DetectorInference"),
}


def inference_task_class(family: str):
    module, name = FAMILIES[family]
    return getattr(importlib.import_module(module), name)
