"""Transform: DataFrame of images (path, size, modification_time, content?) -> DataFrame of results, one row per
image, `status` "ok" (instances) or "error" (stage, type, message), as Arrow batches (mapInArrow: no pandas between
Spark and the rows). Runs on executors with numpy, pyarrow, Pillow and OpenVINO only. Model families (YOLACT, the
detector) subclass `ImageInference` and implement `postprocess_one`.

Per image: read (content column, or fetched from Azure on the executor) -> decode -> preprocess -> infer (batched)
-> postprocess -> (optional) PNG label map under masks/. A failure at any stage becomes an error row for that image;
the rest of the batch goes on.
"""

from __future__ import annotations

import collections
import logging
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np
import pyarrow as pa

from pipelines.inference.crash_guard import crash_groups
from pipelines.inference.executor_cache import LazyModel
from pipelines.inference.openvino_runtime import CompiledIR, RuntimeSettings
from pipelines.inference.video_inference import is_segment, segment_rows
from pipelines.io.storage import Location
from pipelines.job_config import check_output_options
from pipelines.ops.image_decode import decode_image, decode_image_reduced, reuse_decode_memory
from pipelines.ops.preprocess import preprocess_rgb
from pipelines.results.result_rows import (
    RESULT_COLUMNS,  # noqa: F401
    fail,
    input_records,
    new_row,
    result_batch,
    timed,
)  # (re-exported: the families and tests use them)
from pipelines.spark.shipped_files import shipped_path

if TYPE_CHECKING:
    from pipelines.inference.crash_guard import CrashGuard
    from pipelines.inference.model_manifest import ModelManifest
    from pipelines.job_config import VideoSettings


@dataclass
class ExecutorModel:
    """What an executor loads once per model hash: the verified manifest, the compiled IR and the model's extra
    arrays (YOLACT's priors)."""

    manifest: ModelManifest
    ir: CompiledIR | None  # None where another runtime runs the IR (the bigdl engine)
    arrays: dict


def load_executor_model(model_dir: str, expected_sha256: str, settings: RuntimeSettings | None) -> ExecutorModel:
    """Resolve the shipped model directory, verify every file against the manifest (again, on the executor) and
    compile it (settings None: verify and load the arrays only)."""
    from pipelines.inference.model_manifest import ModelManifestError, load_manifest

    local_dir = model_dir
    if not os.path.isdir(local_dir):
        local_dir = shipped_path(os.path.basename(model_dir.rstrip("/")) + ".zip")  # unpacked by ship_archive
    manifest = load_manifest(local_dir, verify=True)
    reuse_decode_memory()
    if manifest.model_sha256 != expected_sha256:
        raise ModelManifestError(
            f"{local_dir}: manifest sha256 {manifest.model_sha256[:12]} differs from the "
            f"driver's {expected_sha256[:12]}: the model changed while the job ran"
        )
    arrays = {"priors": np.load(manifest.path("priors"))} if "priors" in manifest.data["files"] else {}
    ir = CompiledIR(manifest.path("ir_xml"), settings) if settings is not None else None
    return ExecutorModel(manifest, ir, arrays)


class RowCounter(Protocol):
    """What the executor-side function counts its rows in: a Spark accumulator on a classic session."""

    def add(self, term: int) -> None: ...


@dataclass(frozen=True)
class ImageInference:
    """The mapInArrow function. Small and picklable: the model itself is loaded on the executor, once per
    Python worker, through LazyModel keyed by (model sha256, runtime settings)."""

    model_dir: str  # driver path; executors use the shipped copy (shipped_path) when not shared
    model_sha256: str
    class_names: tuple[str, ...]
    input_spec: dict
    postprocess: dict
    settings: RuntimeSettings
    output: Location  # the job's output (masks/ under it) and its credentials
    input_root: str
    masks: str = "rle_and_png"  # one of job_config.MASK_OUTPUTS (families without masks ignore it)
    score_threshold: float | None = None  # instances scoring above it are written; None: the manifest's threshold
    jpeg_draft: bool = False  # decode JPEGs at a reduced DCT scale when the network input is much smaller
    # (faster; changes the model's input pixels, so off by default: see docs/engines.md)
    max_image_pixels: int = 100_000_000
    fetch_bytes: Callable[[str], bytes] | None = None  # for readers that don't ship `content` (Azure SDK)
    progress: RowCounter | None = None  # rows processed, read by the driver's progress line (None: the
    # session counts them as waves commit, pipelines.spark.session_kind)
    crash_guard: CrashGuard | None = None  # poison images become errors, not job failures
    video: VideoSettings | None = None  # frame sampling of video segment units
    frames_per_batch: int = 8  # video frames per inference batch (inference.batch_size)

    def __post_init__(self) -> None:
        check_output_options(self.masks, self.score_threshold)

    def written_score_threshold(self, manifest_key: str) -> float:
        """Instances with score > this are written: `score_threshold`, else the manifest's postprocess[key]."""
        if self.score_threshold is not None:
            return float(self.score_threshold)
        return float(self.postprocess.get(manifest_key, 0.05))

    def model(self) -> ExecutorModel:
        return LazyModel(
            (self.model_sha256, self.settings),
            lambda: load_executor_model(self.model_dir, self.model_sha256, self.settings),
        )()

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        guard = self.crash_guard.for_task() if self.crash_guard is not None else None
        rewritten = []  # label maps a retried task wrote: an earlier attempt may have died writing them
        for batch in batches:
            rows = self.process_batch(input_records(batch), guard)
            if guard is not None and guard.retried:
                rewritten.extend(row["mask_path"] for row in rows if row["mask_path"])
            if self.progress is not None:
                self.progress.add(len(rows))
            yield result_batch(rows)
        if guard is not None:
            self.remove_temp_files_of(rewritten)
            guard.done()

    def remove_temp_files_of(self, targets: list[str]) -> None:
        """Remove the temp files an earlier, killed attempt left beside these label maps (one listing per
        directory; only in retried tasks, which are rare). Housekeeping: a failure is logged, the task's rows stand."""
        directories = collections.defaultdict(set)
        for target in targets:
            directory, _, name = target.rpartition("/")
            directories[directory].add(name)
        for directory, names in directories.items():
            try:
                self.output.sibling(directory).remove_temp_files(names)
            except Exception as err:  # noqa: BLE001
                logging.getLogger(__name__).warning("could not remove temp files in %s: %s", directory, err)

    def process_batch(self, records: list, guard=None) -> list[dict]:
        """Records (objects with the input columns as attributes: path, content?, size, ...; video units) -> result
        rows. With a crash guard, the images go in flight in groups (crash_guard.crash_groups), a unit alone."""
        rows, images = [], []
        for record in records:
            if is_segment(record):
                rows.extend(segment_rows(self, record, guard))
            else:
                images.append(record)
        for group in crash_groups(images, guard):
            if guard is not None:
                guard.in_flight([record.path for record in group])
            rows.extend(self.process_images(group, guard))
        return rows

    def process_images(self, records: list, guard=None) -> list[dict]:
        rows, pending = [], []
        for record in records:
            row = new_row(record)
            rows.append(row)
            try:
                with timed(row, "read"):
                    data = getattr(record, "content", None)
                    if data is None and self.fetch_bytes is not None:
                        data = self.fetch_bytes(record.path)
                    if data is None:
                        raise FileNotFoundError(f"{record.path}: no bytes could be read")
                with timed(row, "preprocess"):
                    if guard is not None:
                        guard.check(record.path)
                    tensor, (row["width"], row["height"]) = self.decode_and_preprocess(bytes(data), record.path)
                    del data
                pending.append((row, tensor))
            except Exception as err:  # noqa: BLE001  (every failure becomes an error row)
                fail(row, err)
        if pending:
            self.infer_and_postprocess(pending)
        return rows

    def decode_and_preprocess(self, data: bytes, path: str) -> tuple[np.ndarray, tuple[int, int]]:
        """Encoded bytes -> (network input [3, S_h, S_w] float32, the image's (width, height) in pixels)."""
        if self.jpeg_draft:
            _, _, in_height, in_width = self.input_spec["shape"]
            rgb, size = decode_image_reduced(data, path, (int(in_width), int(in_height)), self.max_image_pixels)
            return preprocess_rgb(rgb, self.input_spec), size
        rgb = decode_image(data, path, self.max_image_pixels, shared_memory=True)  # [H, W, 3 or 4]
        return preprocess_rgb(rgb, self.input_spec), (int(rgb.shape[1]), int(rgb.shape[0]))

    def infer_and_postprocess(self, pending: list[tuple[dict, np.ndarray]]) -> None:
        try:
            model = self.model()
        except Exception as err:  # noqa: BLE001
            for row, _ in pending:
                fail(row, err, stage="model")  # not the images' failure: the next run tries them again
            return
        start = time.perf_counter()
        try:
            outputs = model.ir.infer([tensor for _, tensor in pending])  # no stacked copy: each request copies its own
        except Exception:  # noqa: BLE001  (isolate the image that breaks the batch)
            outputs = None
        per_image = (time.perf_counter() - start) / len(pending)
        names = model.manifest.outputs
        for index, (row, tensor) in enumerate(pending):
            try:
                with timed(row, "infer"):
                    if outputs is None:
                        single = model.ir.infer(tensor[None])
                        raw = {role: single[name][0] for role, name in names.items()}
                    else:
                        raw = {role: outputs[name][index] for role, name in names.items()}
                        row["timings"]["infer_s"] += per_image
            except Exception as err:  # noqa: BLE001
                fail(row, err)
                continue
            try:
                self.postprocess_one(row, raw, model)
                row["status"] = "ok"
            except Exception as err:  # noqa: BLE001
                fail(row, err)

    def postprocess_one(self, row: dict, raw: dict, model: ExecutorModel) -> None:
        """Fill row['instances'] (and masks) from one image's raw outputs {role: array without batch axis}."""
        raise NotImplementedError

    def write_label_map(self, row: dict, labels) -> None:
        with timed(row, "write"):
            from pipelines.io.output_paths import frame_mask_output_path, mask_output_path

            if row["frame_index"] is None:
                target = mask_output_path(self.output.uri, row["path"], self.input_root)
            else:
                target = frame_mask_output_path(self.output.uri, row["path"], self.input_root, row["frame_index"])
            # atomic (a reader never sees half a PNG) but not fsynced: the result rows that name it are written by
            # Spark, which does not fsync either, so a crashed machine loses both and the task runs again
            self.output.sibling(target).write_bytes_atomic(labels.png(), durable=False)
            row["mask_path"] = target
