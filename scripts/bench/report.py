"""Bench results -> reports/bench.csv (one line per row and precision) and reports/bench.md (side-by-side table,
the issue 3 per-stage split and memory of the Spark job, the issue 9 load figure)."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from pipelines.sweeps.report import markdown_table

STAGE_LABELS = {
    "read": "read",
    "preprocess": "decode+preprocess",
    "infer": "infer",
    "postprocess": "postprocess",
    "write": "write",
}


def write_report(reports: str | Path, stem: str, data: dict, lines: list[str]) -> None:
    """reports/<stem>.json (the runs) and reports/<stem>.md (the lines), the markdown printed too."""
    reports = Path(reports)
    reports.mkdir(parents=True, exist_ok=True)
    (reports / f"{stem}.json").write_text(json.dumps(data, indent=1) + "\n")
    (reports / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def write_csv(results, path: Path) -> None:
    ceilings = ceilings_by_precision(results)
    rows = [result.as_csv_row(ceilings.get(result.precision)) for result in results]
    columns: list[str] = []
    for row in rows:
        columns += [key for key in row if key not in columns]
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if row.get(key) is None else row[key] for key in columns})


def ceilings_by_precision(results) -> dict[str, float]:
    return {r.precision: r.images_per_s for r in results if r.row == "ceiling" and r.status == "ok"}


def _mb(value) -> str:
    return "" if value in (None, "") else f"{float(value):,.0f}"


def main_table(results, precisions: list[str], row_names: dict[str, str]) -> str:
    ceilings = ceilings_by_precision(results)
    by_key = {(r.row, r.precision): r for r in results}
    order = [row for row in row_names if any((row, p) in by_key for p in precisions)]
    columns = ["row"]
    for precision in precisions:
        columns += [f"{precision} images/s", f"{precision} / ceiling", f"{precision} peak MB"]
    columns.append("notes")
    rows = []
    for row in order:
        line = {"row": row_names[row]}
        notes = []
        for precision in precisions:
            result = by_key.get((row, precision))
            if result is None:
                continue
            if result.status == "ok":
                line[f"{precision} images/s"] = f"{result.images_per_s:.3g}"
                ceiling = ceilings.get(precision)
                line[f"{precision} / ceiling"] = f"{result.images_per_s / ceiling:.2f}" if ceiling else ""
            else:
                line[f"{precision} images/s"] = result.status
                notes.append(f"{precision}: {result.status}: {result.note}")
            line[f"{precision} peak MB"] = _mb(result.memory.get("peak_total_pss_mb"))
        first = next(
            (by_key[(row, p)] for p in precisions if (row, p) in by_key and by_key[(row, p)].status == "ok"), None
        )
        if first is not None:
            notes.insert(0, first.note)
            if first.settings:
                notes.append("settings: " + ", ".join(f"{k} {v}" for k, v in sorted(first.settings.items())))
        line["notes"] = "; ".join(n for n in notes if n)
        rows.append(line)
    return markdown_table(rows, columns)


def stage_table(results) -> str:
    """Issue 3: the Spark job's per-stage seconds (summed over images) and its processes' peak RSS."""
    rows = []
    for result in results:
        if result.row != "spark_native" or result.status != "ok":
            continue
        total = sum(v or 0.0 for v in result.stage_seconds.values()) or 1.0
        line = {"precision": result.precision, "images": result.images, "wall s": f"{result.seconds:.1f}"}
        for stage, label in STAGE_LABELS.items():
            value = result.stage_seconds.get(stage) or 0.0
            line[f"{label} s (%)"] = f"{value:.1f} ({100 * value / total:.0f}%)"
        line["per image ms (sum of stages)"] = f"{1000 * total / max(result.images, 1):.0f}"
        line["peak RSS driver (Python) MB"] = _mb(result.memory.get("peak_rss_driver_mb"))
        line["peak RSS driver JVM (+executor) MB"] = _mb(result.memory.get("peak_rss_driver_jvm_mb"))
        line["peak RSS Python worker MB"] = _mb(result.memory.get("peak_rss_python_worker_mb"))
        line["Python workers"] = result.memory.get("python_workers")
        rows.append(line)
    if not rows:
        return "(the Spark native row did not run)"
    return markdown_table(rows, list(rows[0]))


def load_table(point_row: dict, model: str) -> str:
    columns = {
        "images": "images_in",
        "failed": "failed_images",
        "images/s": "images_per_s",
        "wall s": "wall_s",
        "peak RSS driver (Python) MB": "peak_rss_driver_mb",
        "peak RSS driver JVM MB": "peak_rss_driver_jvm_mb",
        "peak RSS executor JVM MB": "peak_rss_executor_jvm_mb",
        "peak RSS Python worker MB": "peak_rss_python_worker_mb",
        "Python workers": "python_workers",
        "peak total PSS MB": "peak_total_pss_mb",
        "tasks": "tasks",
        "failed tasks": "failed_tasks",
        "retried tasks": "retried_tasks",
        "partition skew": "partition_skew",
    }
    line = {label: point_row.get(key) for label, key in columns.items()}
    for label in line:
        if label.endswith("MB"):
            line[label] = _mb(line[label])
    text = markdown_table([line], list(columns))
    if point_row.get("status") != "ok":
        text += f"\n\nThe load run {point_row.get('status')}: {point_row.get('error')}"
    return text + f"\n\nModel: `{model}`."


def write_markdown(
    path: Path,
    header: list[str],
    results,
    precisions: list[str],
    row_names: dict[str, str],
    load: tuple[dict, str, str] | None,
) -> None:
    text = header + [
        "",
        "## Throughput, ratio to the ceiling, peak memory",
        "",
        main_table(results, precisions, row_names),
        "",
        "- images/s: images / seconds of the row's timed part (see notes); ratio: to benchmark_app in "
        "the same precision.",
        "- peak MB: the largest total PSS of the row's whole process tree (Python, JVMs, Python "
        "workers) at one sample (every 0.5 s); per-process VmHWM peaks are in bench.csv.",
        "",
        "## Issue 3: where the Spark job's time goes (native engine, local[2])",
        "",
        "Seconds summed over images (two tasks run at once, so the sum exceeds wall time).",
        "",
        stage_table(results),
    ]
    if load is not None:
        point_row, model, shape = load
        text += ["", f"## Issue 9: load ({shape})", "", load_table(point_row, model)]
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
