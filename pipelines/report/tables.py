"""A job's output read without Spark (pyarrow only): summary.json, and the CURRENT rows of detections/ and errors/.

The current record of an image is the newest run's (run ids start with the UTC start time; ties go to the newer
image modification time); a video has one per frame, among the records of its newest version and kind: the rule
`pipelines.results.incremental.ranked_keys` applies with Spark. A path whose current record is an error is in
`errors` only. Only local outputs (a path or file:/) are read: download others first (`hdfs dfs -get`, `azcopy`).

    output = read_output("output")   # OutputTables: summary, detections and errors (lists of dicts, by path)
    output.detections[0]["instances"]  # [{class_id, class_name, score, box [x1, y1, x2, y2], mask RLE or None}]

read_output holds the rows in memory (a run's evaluation, a labelled sample); iter_current_rows streams them (the
report, pipelines.report.render, keeps only what it draws and counts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.dataset as ds

from pipelines.errors import UsageError
from pipelines.io.storage import Location
from pipelines.report.report_rows import row_order
from pipelines.results.summary_file import read_summary

log = logging.getLogger(__name__)
KEY_COLUMNS = ["path", "frame_index", "run_id", "size", "modification_time", "model_sha256"]
ROWS_PER_BATCH = 512  # rows made Python objects at a time (a row holds up to ~100 instances with their RLEs)


class OutputError(UsageError):
    """The output directory cannot be read: the message names it and what to do."""


@dataclass
class OutputTables:
    root: Path
    summary: dict | None
    model_sha256: str | None  # rows of this model only (the summary's), None: all rows
    detections: list[dict] = field(default_factory=list)  # current rows: path, frame_index, width, instances, ...
    errors: list[dict] = field(default_factory=list)  # current rows: path, frame_index, stage, error_type, ...


def local_output(output: str | Path) -> Path:
    text = str(output)
    if "://" in text and not text.startswith("file://"):
        raise OutputError(
            f"{output}: only local outputs can be read here; download it first "
            "(hdfs dfs -get, azcopy copy, databricks fs cp -r) and pass the local copy"
        )
    root = Path(text.removeprefix("file://").removeprefix("file:")).expanduser().resolve()
    if not root.is_dir():
        raise OutputError(f"{root}: no such output directory; pass the job's --output")
    return root


def _dataset(root: Path, name: str):
    table_dir = root / name
    if not table_dir.is_dir() or not any(table_dir.rglob("*.parquet")):
        return None
    return ds.dataset(str(table_dir), format="parquet", exclude_invalid_files=True)


def _keys(root: Path, model_sha256: str | None) -> Iterator[tuple[str, dict]]:
    """(table, key row) of every record of detections/ and errors/ (of one model unless None), streamed."""
    for table in ("detections", "errors"):
        dataset = _dataset(root, table)
        if dataset is None:
            continue
        columns = [c for c in KEY_COLUMNS if c in dataset.schema.names]
        for batch in dataset.to_batches(columns=columns, batch_size=64 * ROWS_PER_BATCH):
            for row in batch.to_pylist():
                if model_sha256 is None or row.get("model_sha256") == model_sha256:
                    yield table, row


def _rank(row: dict) -> tuple:
    mtime = row.get("modification_time")
    return (row.get("run_id") or "", mtime is not None, mtime.timestamp() if mtime is not None else 0.0)


def current_keys(root: Path, model_sha256: str | None) -> dict[tuple[str, int | None], tuple[str, str]]:
    """(path, frame_index) -> (table, run_id) of each current record (frame_index None: an image, or a video that
    could not be read)."""
    newest: dict[str, tuple] = {}  # path -> its newest record's rank, version and kind (two passes: no record held)
    for _, row in _keys(root, model_sha256):
        rank = _rank(row)
        if row["path"] not in newest or rank > newest[row["path"]][0]:
            newest[row["path"]] = (rank, _version(row))
    best: dict[tuple, tuple[tuple, str, str]] = {}
    for table, row in _keys(root, model_sha256):
        if _version(row) != newest[row["path"]][1]:
            continue  # an older file version, or the other kind (frames / the whole video)
        key, rank = (row["path"], row.get("frame_index")), _rank(row)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, table, row.get("run_id"))
    return {key: (table, run_id) for key, (_, table, run_id) in best.items()}


def _version(row: dict) -> tuple:
    """A record's file version (size, modification time) and kind (a whole-file record or a frame)."""
    return row.get("size"), row.get("modification_time"), row.get("frame_index") is None


def iter_current_rows(root: Path, table: str, keys: dict, columns: list[str]) -> Iterator[dict]:
    """The current rows of `table` (each (path, frame_index) once), streamed in the table's order: one Parquet batch
    in memory at a time."""
    dataset = _dataset(root, table)
    if dataset is None:
        return
    seen = set()
    names = [c for c in columns if c in dataset.schema.names]
    for batch in dataset.to_batches(columns=names, batch_size=ROWS_PER_BATCH):
        for row in batch.to_pylist():
            key = (row["path"], row.get("frame_index"))
            if key not in seen and keys.get(key) == (table, row.get("run_id")):
                seen.add(key)
                yield row


def _current_rows(root: Path, table: str, keys: dict, columns: list[str]) -> list[dict]:
    return sorted(iter_current_rows(root, table, keys, columns), key=row_order)


DETECTION_COLUMNS = [
    "path",
    "frame_index",
    "timestamp_s",
    "width",
    "height",
    "instances",
    "mask_path",
    "run_id",
    "model_sha256",
]
ERROR_COLUMNS = ["path", "frame_index", "stage", "error_type", "message", "run_id", "model_sha256"]


def output_keys(output: str | Path, all_models: bool = False) -> tuple[Path, dict | None, str | None, dict]:
    """(root, summary, model sha256 or None, current_keys) of a local output: the summary's model's records, unless
    `all_models`, no summary, or none of that model's rows are there."""
    root = local_output(output)
    summary = read_summary(Location(str(root)))
    model, keys = summary_model_records(root, summary, lambda model: current_keys(root, model), all_models)
    return root, summary, model, keys


def summary_model_records(root: Path, summary: dict | None, current: Callable, all_models: bool = False) -> tuple:
    """(model sha256 or None, current(model)): the current records of the summary's model, unless `all_models`, no
    summary, or none of that model's records are there (current(model) falsy): then every model's, with a warning."""
    model = None if all_models or not summary else summary.get("model", {}).get("sha256")
    records = current(model)
    if not records and (root / "detections").is_dir() and model:
        log.warning("%s: no rows of model %s (the summary's); reading every model's rows", root, model[:12])
        model, records = None, current(None)
    return model, records


def read_output(output: str | Path, with_instances: bool = True, all_models: bool = False) -> OutputTables:
    """summary.json and the current rows. Rows of the summary's model only, unless `all_models` or no summary."""
    root, summary, model, keys = output_keys(output, all_models)
    columns = DETECTION_COLUMNS if with_instances else [c for c in DETECTION_COLUMNS if c != "instances"]
    return OutputTables(
        root,
        summary,
        model,
        _current_rows(root, "detections", keys, columns),
        _current_rows(root, "errors", keys, ERROR_COLUMNS),
    )


def local_file(uri: str) -> Path:
    """file:/x, file:///x or /x -> Path('/x')."""
    text = uri
    if text.startswith("file://"):
        text = text[len("file://") :]
        text = text[text.index("/") :] if not text.startswith("/") else text
    elif text.startswith("file:"):
        text = text[len("file:") :]
    return Path(text)
