"""OpenVINO on executors: runtime settings (precision, threads, streams) and a compiled IR with named outputs.
Executors keep one per Python worker through `pipelines.inference.executor_cache.LazyModel`, keyed by the manifest's
sha256 and these settings, so a new model (or new settings) never reuses a stale compiled model."""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipelines.inference.core_pinning import pin_to_free_cores

PRECISION_HINTS = {"f32": "f32", "bf16": "bf16", "auto": None}


@dataclass(frozen=True)
class RuntimeSettings:
    """precision: f32 | bf16 | auto (device default: bf16 on CPUs with AVX512-BF16). threads/streams: None =
    OpenVINO's default. pin_cores: the process claims `threads` free cores and runs on them only (core_pinning;
    needs threads)."""

    precision: str = "auto"
    threads: int | None = None
    streams: int | None = None
    device: str = "CPU"
    pin_cores: bool = False

    def __post_init__(self) -> None:
        if self.precision not in PRECISION_HINTS:
            raise ValueError(f"precision '{self.precision}': choose one of {sorted(PRECISION_HINTS)}")
        if self.pin_cores and not self.threads:
            raise ValueError("pin_cores: give threads, the number of cores the process claims")

    def ov_config(self) -> dict:
        config: dict = {}
        if PRECISION_HINTS[self.precision]:
            config["INFERENCE_PRECISION_HINT"] = PRECISION_HINTS[self.precision]
        if self.threads:
            config["INFERENCE_NUM_THREADS"] = int(self.threads)
            # Several Python workers share an executor's cores: pinning threads to cores would make them collide.
            config["ENABLE_CPU_PINNING"] = False
        if self.streams:
            config["NUM_STREAMS"] = int(self.streams)
        return config

    @classmethod
    def for_task_cpus(
        cls,
        task_cpus: int,
        precision: str = "auto",
        threads: int | None = None,
        streams: int | None = None,
        pin_cores: bool = False,
    ) -> RuntimeSettings:
        """Each concurrent task owns `task_cpus` cores: by default one stream with that many threads."""
        return cls(precision=precision, threads=threads or max(1, task_cpus), streams=streams or 1, pin_cores=pin_cores)


_core = None
_core_lock = threading.Lock()


def openvino_core():
    """This process's one `openvino.Core`, made on first use and never released. OpenVINO's CPU plugin (one per
    Core) gives the thread that first compiles on it an alternate signal stack of its own, and when that Core is
    released it puts back the stack it found and unmaps its own. Two Cores released in the order they were made
    therefore leave the thread's alternate stack pointing at unmapped memory, and the next signal with a handler
    (Python's Ctrl-C, torch's SIGCHLD, a job's SIGTERM) kills the process with SIGSEGV instead of running it. A Core
    that is never released leaves nothing to unmap; compiled models share its plugin, and their settings are per
    compile_model."""
    global _core
    with _core_lock:
        if _core is None:
            import openvino as ov

            _core = ov.Core()
        return _core


class CompiledIR:
    """A compiled IR with named outputs. `infer(batch)` runs images through an async queue (one request per
    stream) and returns {output name: [B, ...] array}."""

    def __init__(self, xml_path: str | Path, settings: RuntimeSettings) -> None:
        import openvino as ov

        if settings.pin_cores:  # before compiling: the inference threads it starts inherit the affinity
            pin_to_free_cores(settings.threads)
        self.settings = settings
        self.compiled = openvino_core().compile_model(str(xml_path), settings.device, settings.ov_config())
        self.input_name = self.compiled.inputs[0].get_any_name()
        self.output_names = [out.get_any_name() for out in self.compiled.outputs]
        self._static_outputs = _static_output_shapes(self.compiled.outputs)
        self.num_requests = int(self.compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS"))
        self._queue = ov.AsyncInferQueue(self.compiled, self.num_requests)
        self._lock = threading.Lock()
        self._last_outputs: dict[str, np.ndarray] = {}  # the previous static-shape result, to reuse (_outputs)

    def infer(self, batch: Sequence[np.ndarray]) -> dict[str, np.ndarray]:
        """batch: B images [3, H, W] float32, as a list or a [B, 3, H, W] array (the IR takes one image; the queue
        overlaps them, each request copying its image in: a list needs no stacked copy). Outputs of static shape
        are copied once, from each request straight into the [B, ...] result; dynamic ones per image, then joined.
        The result is the caller's: it is never written again while anything holds it or a view of it."""
        per_image: list[dict | None] = [None] * len(batch)
        outputs: dict[str, np.ndarray] | None = None

        def collect(request, index):
            if outputs is not None:
                for name, out in outputs.items():
                    out[index] = request.get_tensor(name).data[0]
            else:
                per_image[index] = {name: request.get_tensor(name).data.copy() for name in self.output_names}

        with self._lock:
            if self._static_outputs is not None:
                outputs = self._outputs(len(batch))
            self._queue.set_callback(collect)
            try:
                for index, image in enumerate(batch):
                    self._queue.start_async({self.input_name: image[None]}, index)
                self._queue.wait_all()
            except BaseException:
                self._replace_queue()
                raise
        if outputs is not None:
            return dict(outputs)
        return {name: np.concatenate([image[name] for image in per_image]) for name in self.output_names}

    def _replace_queue(self) -> None:
        """After a failed start or inference: the requests still running finish, and a new queue replaces the
        old one. The queue never hands out again a request whose start failed (an input of the wrong shape), so
        the next image would wait for it forever; the executors retry a failed batch image by image."""
        import openvino as ov

        try:
            self._queue.wait_all()
        except Exception:  # noqa: BLE001  (the error being raised is the caller's; this one adds nothing)
            pass
        self._queue = ov.AsyncInferQueue(self.compiled, self.num_requests)

    def _outputs(self, count: int) -> dict[str, np.ndarray]:
        """[count, ...] arrays for the static-shape outputs: the previous call's where nothing but this object holds
        them any more (no result, no view of one: a reference count of 2 is this dict's and the call's), else new
        ones. New arrays of a large model's outputs are new pages each time (glibc maps large blocks afresh and
        unmaps them when freed), which the copies fault in, a visible share of a large model's time per image."""
        last = self._last_outputs
        if not (
            last and len(next(iter(last.values()))) == count and all(sys.getrefcount(last[name]) == 2 for name in last)
        ):
            last = self._last_outputs = {
                name: np.empty((count,) + shape, dtype) for name, (shape, dtype) in self._static_outputs.items()
            }
        return last

    def infer_one(self, image: np.ndarray) -> dict[str, np.ndarray]:
        """image: [3, H, W] -> {name: output with its batch axis removed}."""
        return {name: value[0] for name, value in self.infer(image[None]).items()}


def _static_output_shapes(ports) -> dict[str, tuple[tuple[int, ...], np.dtype]] | None:
    """{output name: (shape without the batch axis, dtype)} when every output has a static shape and batch 1;
    else None (outputs are then copied per image and joined)."""
    outputs = {}
    for port in ports:
        shape = port.get_partial_shape()
        if shape.is_dynamic or len(shape) == 0 or shape[0].get_length() != 1:
            return None
        outputs[port.get_any_name()] = (tuple(shape.to_shape())[1:], port.get_element_type().to_dtype())
    return outputs


def cpu_count() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
