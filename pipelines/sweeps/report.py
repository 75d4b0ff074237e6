"""Sweep rows -> sweep.csv, report.md and plots/*.png (matplotlib, no display needed).

Plots use the successful rows, averaged over repeats:
- images/s vs partitions: one line per combination of the other settings;
- images/s vs total cores (executors x executor cores): one line per combination of the settings other than
  executor cores;
- speedup and efficiency vs executors: speedup = images/s / images/s at the fewest executors of the same other
  settings; efficiency = speedup / (executors / fewest executors).
"""

from __future__ import annotations

import csv
import datetime as dt
import os
import platform
from pathlib import Path
from statistics import mean

from pipelines.sweeps.point_run import ROW_COLUMNS, STAGES

SWEPT = (
    "engine",
    "precision",
    "partitions",
    "executors",
    "executor_cores",
    "task_cpus",
    "batch_size",
    "openvino_streams",
    "openvino_threads",
)
PLOTS = {
    "partitions": "images_per_s_vs_partitions.png",
    "cores": "images_per_s_vs_cores.png",
    "executors": "speedup_vs_executors.png",
}
TABLE_COLUMNS = [
    "point",
    "status",
    "images_per_s",
    "wall_s",
    "one_frame_s",
    "tasks",
    "failed_tasks",
    "retried_tasks",
    "partition_skew",
    "peak_rss_driver_mb",
    "peak_rss_executor_jvm_mb",
    "peak_rss_python_worker_mb",
    "peak_total_pss_mb",
]


def write_csv(rows: list[dict], path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=ROW_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({key: "" if row.get(key) is None else row[key] for key in ROW_COLUMNS})


def averaged(rows: list[dict]) -> list[dict]:
    """Successful rows, one per point (images/s averaged over repeats)."""
    by_point: dict[str, list[dict]] = {}
    for row in rows:
        if row["status"] == "ok" and row.get("images_per_s"):
            by_point.setdefault(row["point"], []).append(row)
    merged = []
    for group in by_point.values():
        merged.append(
            {
                **group[0],
                "images_per_s": mean(float(r["images_per_s"]) for r in group),
                "total_cores": int(group[0]["executors"]) * int(group[0]["executor_cores"]),
            }
        )
    return merged


def varying(rows: list[dict]) -> list[str]:
    """Settings that take more than one value among `rows`."""
    return [key for key in SWEPT if len({row[key] for row in rows}) > 1]


def lines(rows: list[dict], x_key: str, fixed_out: tuple[str, ...]) -> dict[str, list[tuple[float, dict]]]:
    """Group rows by every setting except `fixed_out`; each group sorted by `x_key`. Labels name only the
    settings that vary in the sweep."""
    label_keys = [key for key in varying(rows) if key not in fixed_out]
    groups: dict[str, list[tuple[float, dict]]] = {}
    for row in rows:
        label = ", ".join(f"{key}={row[key]}" for key in label_keys) or "all"
        groups.setdefault(label, []).append((float(row[x_key]), row))
    return {label: sorted(points, key=lambda item: item[0]) for label, points in groups.items()}


def _figure(title: str, xlabel: str, ylabel: str):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    return plt, fig, ax


def _finish(plt, fig, ax, path: Path, empty: bool) -> None:
    from matplotlib.ticker import MaxNLocator

    for axis in fig.axes:
        axis.xaxis.set_major_locator(MaxNLocator(integer=True))
        axis.set_ylim(bottom=0)
    if empty:
        ax.text(0.5, 0.5, "no successful points", ha="center", va="center", transform=ax.transAxes)
    elif len(ax.get_lines()) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_vs(rows: list[dict], x_key: str, fixed_out: tuple[str, ...], xlabel: str, path: Path) -> None:
    plt, fig, ax = _figure(f"images/s vs {xlabel}", xlabel, "images/s")
    for label, points in lines(rows, x_key, fixed_out).items():
        ax.plot([x for x, _ in points], [r["images_per_s"] for _, r in points], marker="o", label=label)
    _finish(plt, fig, ax, path, not rows)


def speedup_rows(rows: list[dict]) -> dict[str, list[tuple[float, float, float]]]:
    """label -> [(executors, speedup, efficiency)] relative to the fewest executors with the same settings."""
    result = {}
    for label, points in lines(rows, "executors", ("executors",)).items():
        base_executors, base = points[0][0], points[0][1]["images_per_s"]
        result[label] = [
            (x, r["images_per_s"] / base, (r["images_per_s"] / base) / (x / base_executors)) for x, r in points
        ]
    return result


def plot_speedup(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    for ax, title, _index in ((left, "speedup", 1), (right, "efficiency", 2)):
        ax.set_title(f"{title} vs executors")
        ax.set_xlabel("executors")
        ax.set_ylabel(title)
        ax.grid(True, alpha=0.3)
    for label, points in speedup_rows(rows).items():
        xs = [p[0] for p in points]
        left.plot(xs, [p[1] for p in points], marker="o", label=label)
        right.plot(xs, [p[2] for p in points], marker="o", label=label)
    if rows:
        executors = sorted({float(r["executors"]) for r in rows})
        left.plot(executors, [e / executors[0] for e in executors], "k--", linewidth=0.8, label="linear")
        right.axhline(1.0, color="k", linestyle="--", linewidth=0.8)
    _finish(plt, fig, left, path, not rows)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def cell(value) -> str:
        if value is None or value == "":
            return ""
        if isinstance(value, float):
            return f"{value:.4g}"
        return str(value).replace("|", "\\|")

    lines_ = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines_ += ["| " + " | ".join(cell(row.get(column)) for column in columns) + " |" for row in rows]
    return "\n".join(lines_)


def report_markdown(rows: list[dict], config, plots: dict[str, Path]) -> str:
    job = config.job
    ok = [row for row in rows if row["status"] == "ok"]
    best = max(ok, key=lambda row: float(row["images_per_s"]), default=None)
    settings = [
        column
        for column in (
            "engine",
            "precision",
            "partitions",
            "executors",
            "executor_cores",
            "task_cpus",
            "batch_size",
            "openvino_streams",
            "openvino_threads",
        )
    ]
    stage_columns = ["point"] + [f"stage_{stage}_s" for stage in STAGES]
    text = [
        "# sparkseg sweep",
        "",
        f"{dt.datetime.now():%Y-%m-%d %H:%M}, {os.cpu_count()} cores ({platform.machine()}), load average "
        f"{os.getloadavg()[0]:.1f}. "
        f"Mode **{config.mode}**, input `{job['input']['uri']}`, model `{job['model']['dir']}`, "
        f"{len(rows)} runs ({len(ok)} ok), repeats {config.repeats}.",
        "",
        "Each point is one run of `jobs/infer_yolact.py --force` in its own driver process (a fresh SparkContext); "
        "in standalone mode on a cluster of `executors` workers x `executor_cores` cores started for that shape.",
        "",
        "- images_per_s, wall_s: the job's summary (wall time from the job's start, SparkContext start-up excluded; "
        "process_s in the CSV includes it).",
        "- one_frame_s: the longest executor busy time (union of its task intervals, from the event log) / images.",
        "- partition_skew: max / min images per inference task. tasks, failed_tasks, retried_tasks: task attempts "
        "from the event log.",
        "- peak_rss_*_mb: largest VmHWM of one process of that role; peak_total_pss_mb: largest total PSS of the "
        "whole process tree (driver, JVMs, Python workers; cluster daemons included) at one sample.",
        "",
    ]
    if best:
        text += [
            f"Best: **{best['point']}**, {best['images_per_s']} images/s "
            f"({', '.join(f'{k}={best[k]}' for k in settings)}).",
            "",
        ]
    text += [
        "## Points",
        "",
        markdown_table(rows, TABLE_COLUMNS),
        "",
        "## Per-stage seconds (summed over images, across parallel tasks)",
        "",
        markdown_table(ok, stage_columns),
        "",
        "## Plots",
        "",
    ]
    text += [f"![{name}](plots/{path.name})" for name, path in plots.items()]
    not_ok = [row for row in rows if row["status"] != "ok"]
    if not_ok:
        text += ["", "## Not run or failed", ""]
        text += [f"- {row['point']}: {row['status']}: {row['error']}" for row in not_ok]
    return "\n".join(text) + "\n"


def write_outputs(rows: list[dict], out_dir: Path, config) -> dict[str, Path]:
    """sweep.csv, report.md and plots/*.png under `out_dir`; returns their paths."""
    plots_dir = out_dir / "plots"
    plots_dir.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out_dir / "sweep.csv", "report": out_dir / "report.md"}
    write_csv(rows, paths["csv"])
    ok = averaged(rows)
    plots = {name: plots_dir / file_name for name, file_name in PLOTS.items()}
    plot_vs(ok, "partitions", ("partitions",), "partitions", plots["partitions"])
    plot_vs(ok, "total_cores", ("executor_cores",), "total cores (executors x executor cores)", plots["cores"])
    plot_speedup(ok, plots["executors"])
    paths["report"].write_text(report_markdown(rows, config, plots), encoding="utf-8")
    return {**paths, **{f"plot_{name}": path for name, path in plots.items()}}
