"""Driver-side progress: images done / total and the rate, printed while the job runs.

Executors add to a Spark accumulator as they finish each Arrow batch; a daemon thread on the driver reads it.
"""
from __future__ import annotations

import sys
import threading
import time

from pyspark.sql import SparkSession


class ProgressReporter:
    def __init__(self, spark: SparkSession, total: int, interval_s: float = 5.0, stream=None) -> None:
        self.accumulator = spark.sparkContext.accumulator(0)
        self.total = total
        self.interval_s = interval_s
        self.stream = stream or sys.stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.time()

    def line(self) -> str:
        done = self.accumulator.value
        elapsed = max(time.time() - self._start, 1e-9)
        percent = 100.0 * done / self.total if self.total else 100.0
        return f"[sparkseg] {done}/{self.total} images ({percent:.0f}%), {done / elapsed:.2f} images/s"

    def _loop(self) -> None:
        last, quiet = -1, 0
        while not self._stop.wait(self.interval_s):
            done = self.accumulator.value
            quiet = 0 if done != last else quiet + 1
            if done != last or quiet % 12 == 0:      # unchanged: say it again only once a minute or so
                print(self.line(), file=self.stream, flush=True)
            last = done

    def __enter__(self) -> "ProgressReporter":
        self._start = time.time()
        if self.interval_s > 0:
            self._thread = threading.Thread(target=self._loop, name="sparkseg-progress", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        print(self.line(), file=self.stream, flush=True)
