"""The report's plots (matplotlib, Agg): per-class instance counts and per-class score histograms, as PNG files.

matplotlib is in the `report` extra (`pip install sparkseg[report]`); without it the page says so and has no
plots.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)
COUNTS_PNG = "class_counts.png"
SCORES_PNG = "score_histograms.png"


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        log.warning("matplotlib is not installed: the report has no plots (pip install 'sparkseg[report]')")
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def class_counts_png(counts: dict[str, tuple[int, int]], threshold: float, out_dir: Path) -> Path | None:
    """counts: class -> (instances >= threshold, all instances). A grouped bar chart."""
    plt = _pyplot()
    if plt is None or not counts:
        return None
    names = list(counts)
    xs = range(len(names))
    fig, ax = plt.subplots(figsize=(max(4.0, 1.1 * len(names) + 2), 3.2))
    ax.bar([x - 0.2 for x in xs], [counts[n][1] for n in names], width=0.4, color="#b0b8c4", label="all")
    ax.bar(
        [x + 0.2 for x in xs],
        [counts[n][0] for n in names],
        width=0.4,
        color="#1f6fb4",
        label=f"score >= {threshold:g}",
    )
    ax.set_xticks(list(xs), names, rotation=30 if len(names) > 6 else 0, ha="right" if len(names) > 6 else "center")
    ax.set_ylabel("instances")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    path = out_dir / COUNTS_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def score_histograms_png(bins: dict[str, list[int]], threshold: float, out_dir: Path) -> Path | None:
    """One histogram of instance scores per class (bins: counts over 0..1 in equal bins), the threshold marked."""
    plt = _pyplot()
    if plt is None or not bins:
        return None
    names = list(bins)
    cols = min(4, len(names))
    rows = (len(names) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols, 2.4 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names):
        counts = bins[name]
        ax.stairs(counts, [i / len(counts) for i in range(len(counts) + 1)], fill=True, color="#1f6fb4")
        ax.axvline(threshold, color="#d62728", linewidth=1)
        ax.set_title(f"{name} ({sum(counts)})", fontsize=9)
        ax.set_xlim(0, 1)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names) :]:
        ax.axis("off")
    fig.supxlabel("score", fontsize=8)
    fig.tight_layout()
    path = out_dir / SCORES_PNG
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
