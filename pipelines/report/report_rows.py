"""What the report takes from an output's current rows: the `limit` top-scoring detection rows it draws, counts of
all of them (per class, score histograms) and the first error rows.

Gathered row by row and mergeable, so that its memory is bounded by `limit`, not by the number of images: over one
stream of rows (a local output read with pyarrow: pipelines.report.render.gather), or over each Spark partition of
the current rows, merged on the driver (the job: pipelines.report.spark_rows). No Spark and no drawing here: the
executors import it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from pipelines.report.page import MAX_ERROR_ROWS

SCORE_BINS = 20  # the score histograms' bins over 0..1
DEFAULT_LIMIT = 100  # top-scoring images drawn
DEFAULT_THRESHOLD = 0.5  # instances drawn and counted at or above this score


@dataclass
class ReportRows:
    """Rows and counts gathered at `score_threshold`: add every current row (add_detection, add_error), merge partial
    gathers (merged), then `finished()`."""

    score_threshold: float
    limit: int | None = None  # top rows kept: None none (counts only), 0 all of them
    root: Path | None = None  # the output directory (set once gathered)
    summary: dict | None = None
    top: list[dict] = field(default_factory=list)  # top-scoring detection rows, instances included, in order
    images_total: int = 0  # current detection rows (images and video frames)
    classes: dict[str, list[int]] = field(default_factory=dict)  # [>= threshold, all, images with one >=]
    score_bins: dict[str, list[int]] = field(default_factory=dict)  # SCORE_BINS counts over 0..1
    errors: list[dict] = field(default_factory=list)  # the first MAX_ERROR_ROWS current error rows, by path
    errors_total: int = 0

    def add_detections(self, rows: Iterable[dict]) -> ReportRows:
        for row in rows:
            self.add_detection(row)
        return self

    def add_detection(self, row: dict) -> ReportRows:
        """Count a current detection row's instances and keep it if it may be among the top rows."""
        self.images_total += 1
        seen = set()
        for inst in row.get("instances") or []:
            name, score = inst["class_name"], float(inst["score"])
            counts = self.classes.setdefault(name, [0, 0, 0])
            counts[1] += 1
            if score >= self.score_threshold:
                counts[0] += 1
                seen.add(name)
            bins = self.score_bins.setdefault(name, [0] * SCORE_BINS)
            bins[min(max(int(score * SCORE_BINS), 0), SCORE_BINS - 1)] += 1
        for name in seen:
            self.classes[name][2] += 1
        if self.limit is not None:
            self.top.append(row)
            if self.limit and len(self.top) >= 2 * self.limit:
                self.top = self._best(self.top)
        return self

    def add_errors(self, rows: Iterable[dict]) -> ReportRows:
        for row in rows:
            self.add_error(row)
        return self

    def add_error(self, row: dict) -> ReportRows:
        self.errors_total += 1
        self.errors.append(row)
        if len(self.errors) >= 2 * MAX_ERROR_ROWS:
            self.errors = heapq.nsmallest(MAX_ERROR_ROWS, self.errors, key=row_order)
        return self

    def merged(self, other: ReportRows) -> ReportRows:
        """self with other's rows and counts added (gathered at the same threshold and limit)."""
        self.images_total += other.images_total
        self.errors_total += other.errors_total
        for name, counts in other.classes.items():
            mine = self.classes.setdefault(name, [0, 0, 0])
            self.classes[name] = [a + b for a, b in zip(mine, counts)]
        for name, bins in other.score_bins.items():
            mine = self.score_bins.setdefault(name, [0] * SCORE_BINS)
            self.score_bins[name] = [a + b for a, b in zip(mine, bins)]
        self.top += other.top
        self.errors += other.errors
        return self.finished()

    def finished(self) -> ReportRows:
        """self with only the top rows, best first, and the first errors by path (what the report draws and lists)."""
        self.top = self._best(self.top)
        self.errors = heapq.nsmallest(MAX_ERROR_ROWS, self.errors, key=row_order)
        return self

    def _best(self, rows: list[dict]) -> list[dict]:
        if self.limit is None:
            return []
        rank = self.rank
        return heapq.nsmallest(self.limit, rows, key=rank) if self.limit > 0 else sorted(rows, key=rank)

    def rank(self, row: dict) -> tuple:
        """Top-scoring first (the row's best score at or above the threshold); ties by path, then frame."""
        return -top_score(row, self.score_threshold), *row_order(row)

    def class_order(self) -> list[str]:
        """Classes in the model's order where the summary names them, others after them by name."""
        order = list((self.summary or {}).get("model", {}).get("classes") or [])
        return [n for n in order if n in self.classes] + sorted(n for n in self.classes if n not in order)


def top_score(row: dict, threshold: float) -> float:
    return max([i["score"] for i in row.get("instances") or [] if i["score"] >= threshold], default=0.0)


def row_order(row: dict) -> tuple:
    """Rows by path, a video's whole-file record before its frames, frames in order."""
    return row["path"], -1 if row.get("frame_index") is None else row["frame_index"]
