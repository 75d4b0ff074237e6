"""See a job's results: overlay images and a static report page, from a (local) output directory. No Spark.

    python -m pipelines.report.render --output OUT [--input-root DIR] [--limit N] [--score-threshold T] [--spark]

Writes OUT/overlays/<image key>.png (each instance's mask tinted in its own colour, with box, class and score;
the key is the image's path under the job's input, as for masks/; a video frame is <video key>/<frame index>.png,
drawn on the frame decoded from the video), OUT/overlays/thumbs/*.jpg, OUT/overlays/index.json
and OUT/report.html (+ OUT/report_files/*.png): open report.html in a browser, copy OUT to view it elsewhere, or
`displayHTML(open(".../report.html").read())` on Databricks. `--input-root DIR`: where the input images are now,
when they moved since the run (an hdfs:// or abfss:// input downloaded to DIR): an image is looked up at
DIR/<its path under the run's input>. The job draws them itself with `output.overlays: true`. `--spark`: the rows
are gathered by a local Spark session (pyspark and Java), for outputs too large for one key per image in memory.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from pipelines.errors import report_error
from pipelines.io.output_paths import parse_location, relative_key
from pipelines.io.storage import Location
from pipelines.ops.mask_outputs import PNG_COMPRESS_LEVEL
from pipelines.ops.video_decode import VideoDecodeError, frames_at
from pipelines.report import overlays as ov
from pipelines.report import page, plots
from pipelines.report.report_rows import DEFAULT_LIMIT, DEFAULT_THRESHOLD, ReportRows, top_score
from pipelines.report.tables import (
    DETECTION_COLUMNS,
    ERROR_COLUMNS,
    OutputError,
    iter_current_rows,
    local_file,
    local_output,
    output_keys,
)

log = logging.getLogger(__name__)
OVERLAYS_DIR = "overlays"
INDEX_NAME = "index.json"
REPORT_NAME = "report.html"
PLOTS_DIR = "report_files"


def gather(
    output: str | Path, limit: int | None = DEFAULT_LIMIT, score_threshold: float = DEFAULT_THRESHOLD
) -> ReportRows:
    """The report's rows of a local `output`: the `limit` top-scoring current detection rows (0: all of them, None:
    none; ties by path and frame) and the counts of all of them, and the errors' first rows, streaming the tables
    once (the job gathers them with Spark instead: pipelines.report.spark_rows)."""
    root, summary, _, keys = output_keys(output)
    rows = ReportRows(score_threshold, limit, root, summary)
    rows.add_detections(iter_current_rows(root, "detections", keys, DETECTION_COLUMNS))
    rows.add_errors(iter_current_rows(root, "errors", keys, ERROR_COLUMNS))
    return rows.finished()


def source_file(path: str, run_input: str | None, input_root: str | Path | None) -> Path:
    """Where to read an image: its own local path, or DIR/<its path under the run's input> with `input_root`."""
    if input_root is None:
        return local_file(path)
    location = parse_location(path)
    if run_input:
        root = parse_location(run_input)
        if location.parts[: len(root.parts)] == root.parts and len(location.parts) > len(root.parts):
            return Path(input_root).joinpath(*location.parts[len(root.parts) :])
    return Path(input_root) / location.parts[-1]


def _frame(row: dict) -> int | None:
    return row.get("frame_index")


def render_overlays(rows: ReportRows, input_root: str | Path | None = None) -> dict:
    """Draw the gathered top-scoring images and video frames (gather: `limit`, score threshold) under OUT/overlays/
    (a frame as <video key>/<frame index>.png); returns (and writes) the index."""
    score_threshold = rows.score_threshold
    out_dir = rows.root / OVERLAYS_DIR
    (out_dir / "thumbs").mkdir(parents=True, exist_ok=True)
    run_input = (rows.summary or {}).get("input")
    chosen = rows.top
    frames = video_frames(chosen, run_input, input_root)
    entries, missing = [], []
    for row in chosen:
        source = source_file(row["path"], run_input, input_root)
        image = (
            frames.get((row["path"], _frame(row)))
            if _frame(row) is not None
            else (ov.load_rgb(source) if source.is_file() else None)
        )
        if image is None:
            missing.append({"path": row["path"], "looked_at": str(source)})
            continue
        key = relative_key(row["path"], run_input) if run_input else Path(row["path"]).name
        name = Path(row["path"]).name
        if _frame(row) is not None:
            key, name = f"{key}/{_frame(row):06d}", f"{name} frame {_frame(row)} ({row.get('timestamp_s') or 0:.2f} s)"
        drawn = ov.drawn_instances(row.get("instances"), score_threshold)
        overlay = ov.draw_overlay(image, drawn, score_threshold)
        overlay_path, thumb_path = out_dir / f"{key}.png", out_dir / "thumbs" / f"{key}.jpg"
        overlay_path.parent.mkdir(parents=True, exist_ok=True)
        thumb_path.parent.mkdir(parents=True, exist_ok=True)
        ov.Image.fromarray(overlay).save(overlay_path, "PNG", compress_level=PNG_COMPRESS_LEVEL)
        ov.thumbnail(overlay).save(thumb_path, "JPEG", quality=85)
        entries.append(
            {
                "path": row["path"],
                "frame_index": _frame(row),
                "name": name,
                "drawn": len(drawn),
                "top_score": top_score(row, score_threshold),
                "classes": sorted({i["class_name"] for i in drawn}),
                "overlay": f"{OVERLAYS_DIR}/{key}.png",
                "thumbnail": f"{OVERLAYS_DIR}/thumbs/{key}.jpg",
            }
        )
    if missing:
        log.warning(
            "%d source images not found, e.g. %s (looked at %s): pass --input-root DIR where they are now",
            len(missing),
            missing[0]["path"],
            missing[0]["looked_at"],
        )
    index = {
        "score_threshold": score_threshold,
        "images_total": rows.images_total,
        "images": entries,
        "missing": missing,
    }
    (out_dir / INDEX_NAME).write_text(json.dumps(index, indent=1) + "\n", encoding="utf-8")
    return index


def video_frames(rows: list[dict], run_input: str | None, input_root: str | Path | None) -> dict[tuple, object]:
    """{(path, frame index): RGB} of the video frames among `rows`, each video decoded once up to its last frame
    wanted; a video not found (or not readable) gives none."""
    wanted: dict[str, set[int]] = {}
    for row in rows:
        if _frame(row) is not None:
            wanted.setdefault(row["path"], set()).add(_frame(row))
    frames = {}
    for path, indices in wanted.items():
        source = source_file(path, run_input, input_root)
        if not source.is_file():
            continue
        try:
            frames.update(((path, index), rgb) for index, rgb in frames_at(str(source), indices).items())
        except VideoDecodeError as err:
            log.warning("%s: %s", source, err)
    return frames


def write_report(output: str | Path, rows: ReportRows | None = None) -> Path:
    """OUT/report.html from what OUT holds now (summary, tables, overlays/index.json, evaluation.json). rows: gathered
    already (render), else gathered here for the counts only, at the overlays' score threshold."""
    root = rows.root if rows is not None else local_output(output)
    index_path = root / OVERLAYS_DIR / INDEX_NAME
    index = json.loads(index_path.read_text(encoding="utf-8")) if index_path.is_file() else None
    if rows is None:
        rows = gather(root, None, index["score_threshold"] if index else DEFAULT_THRESHOLD)
    threshold = rows.score_threshold
    evaluation_path = root / "evaluation.json"
    evaluation = json.loads(evaluation_path.read_text(encoding="utf-8")) if evaluation_path.is_file() else None
    names = rows.class_order()
    counts = {n: tuple(rows.classes[n]) for n in names}
    plot_dir = root / PLOTS_DIR
    plot_dir.mkdir(exist_ok=True)
    written = [
        plots.class_counts_png({n: c[:2] for n, c in counts.items()}, threshold, plot_dir),
        plots.score_histograms_png({n: rows.score_bins[n] for n in names}, threshold, plot_dir),
    ]
    plot_links = [f"{PLOTS_DIR}/{p.name}" for p in written if p is not None]
    html = page.report_html(
        rows.summary, counts, threshold, plot_links, evaluation, rows.errors, rows.errors_total, index
    )
    path = root / REPORT_NAME
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(path)
    return path


def render(
    output: str | Path,
    input_root: str | Path | None = None,
    limit: int = DEFAULT_LIMIT,
    score_threshold: float = DEFAULT_THRESHOLD,
    spark=None,
) -> Path:
    """Overlays and report.html for `output`; returns the report's path. spark: a SparkSession that gathers the rows
    (pipelines.report.spark_rows: this process holds the rows it draws, not a key per image), else pyarrow here."""
    if input_root is not None and not Path(input_root).is_dir():
        raise OutputError(f"--input-root {input_root}: no such directory; pass where the input images are now")
    if spark is None:
        return draw(gather(output, limit, score_threshold), input_root)
    from pipelines.report.spark_rows import gather_with_spark  # pyspark: optional here (the report needs no Spark)

    return draw(gather_with_spark(spark, Location(str(local_output(output))), limit, score_threshold), input_root)


def draw(rows: ReportRows, input_root: str | Path | None = None) -> Path:
    """Overlays and report.html from gathered rows (gather, or spark_rows.gather_with_spark); the report's path."""
    render_overlays(rows, input_root)
    return write_report(rows.root, rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--output", required=True, help="the job's --output (a local directory)")
    parser.add_argument("--input-root", help="where the input images are now, if they moved since the run")
    parser.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIMIT,
        help=f"draw at most this many images, top-scoring first (default {DEFAULT_LIMIT}; 0: all)",
    )
    parser.add_argument(
        "--score-threshold",
        type=float,
        default=DEFAULT_THRESHOLD,
        help=f"draw and count instances with at least this score (default {DEFAULT_THRESHOLD})",
    )
    parser.add_argument(
        "--spark",
        action="store_true",
        help="gather the rows with a local Spark session (local[*]; needs pyspark and Java): for "
        "outputs of millions of images, of which this process would otherwise hold a key each",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        path = render(
            args.output, args.input_root, args.limit, args.score_threshold, local_spark() if args.spark else None
        )
    except OutputError as err:
        return report_error(err)
    print(f"report: {path}")
    return 0


def local_spark():
    """A local[*] SparkSession for --spark (quiet), or OutputError where pyspark is not installed."""
    try:
        from pipelines.spark.spark_session import local_session  # pyspark: optional here, see the except
    except ImportError as err:
        raise OutputError(
            f"--spark needs pyspark and Java ({err}): install the job's dependencies (pip install "
            "sparkseg), or leave --spark out"
        ) from None
    return local_session(app_name="sparkseg-report")


if __name__ == "__main__":
    sys.exit(main())
