"""The same per-image code as the Spark job, in one process without Spark: the reference the job is tested
against, and the "OpenVINO in one process" row of the benchmark."""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path
from types import SimpleNamespace

from pipelines.inference.model_manifest import load_manifest
from pipelines.inference.openvino_runtime import RuntimeSettings
from pipelines.io.storage import Location


def infer_files(
    model_dir: str | Path,
    paths: list[str | Path],
    output_uri: str,
    input_root: str,
    settings: RuntimeSettings | None = None,
    masks: str = "rle",
    batch_size: int = 8,
    family: str | None = None,
    score_threshold: float | None = None,
) -> list[dict]:
    """Result rows (as the job's mapInArrow produces them) for local image files, in the given order.
    family: "yolact", "detector", ... (default: the manifest's model); masks, score_threshold: as output.masks
    and output.score_threshold of the job (default: RLE only, no PNG written)."""
    from pipelines.inference.inference_tasks import inference_task_class

    manifest = load_manifest(model_dir, verify=True)
    task = inference_task_class(family or manifest.model)(
        model_dir=str(manifest.root),
        model_sha256=manifest.model_sha256,
        class_names=tuple(manifest.class_names),
        input_spec=manifest.input,
        postprocess=manifest.postprocess,
        settings=settings or RuntimeSettings(),
        output=Location(output_uri),
        input_root=input_root,
        masks=masks,
        score_threshold=score_threshold,
    )
    rows = []
    for start in range(0, len(paths), batch_size):
        rows.extend(task.process_batch(local_file_records(paths[start : start + batch_size])))
    return rows


def local_file_records(paths: list[str | Path]) -> list[SimpleNamespace]:
    """The executor function's input records for local files, with their bytes. Paths as "file:/abs/path", the
    form Spark's binaryFile source gives, so rows compare one to one with the job's."""
    records = []
    for path in paths:
        stat = os.stat(path)
        records.append(
            SimpleNamespace(
                path="file:" + str(Path(path).resolve()),
                content=Path(path).read_bytes(),
                size=stat.st_size,
                modification_time=dt.datetime.fromtimestamp(stat.st_mtime),
            )
        )
    return records
