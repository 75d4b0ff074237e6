"""Driver-side progress: what the job is doing, and images done / total with the rate and an ETA while it runs.

The count comes from the session's kind (pipelines.spark.session_kind): on a classic session executors add to a
Spark accumulator as they finish each Arrow batch (the driver sees it when a task ends: the job keeps tasks small,
inference.max_images_per_task, so that the count moves while a wave runs); a Spark Connect session has no
accumulators, and counts the rows as each wave commits. A daemon thread on the driver prints a line every
`interval_s` while tasks run, with the tasks running now (Spark's status tracker, or the Connect server's progress
reports), so a long task still shows signs of life. On a terminal the line is rewritten in place; in a log
file it is one line per interval. The same thread tells of each executor lost meanwhile in one warning line (the
host, the tasks re-run); Spark's own words on it are in its log file only (conf/log4j2.properties).
"""

from __future__ import annotations

import logging
import sys
import threading
import time

from pipelines.spark.executor_loss import ExecutorLossWatch, NoLossWatch, describe
from pipelines.spark.session_kind import ClassicSession, ConnectSession

PREFIX = "[sparkseg]"
LOSS_POLL_S = 5.0  # how often lost executors are looked for when no progress line is printed (interval 0)

log = logging.getLogger(__name__)


def say(message: str, stream=None) -> None:
    """One line about what the job does now (listing, planning), on stderr like the progress line."""
    print(f"{PREFIX} {message}", file=stream or sys.stderr, flush=True)


def duration(seconds: float) -> str:
    seconds = int(round(max(seconds, 0)))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class ProgressReporter:
    def __init__(
        self,
        kind: ClassicSession | ConnectSession,
        total: int,
        interval_s: float = 5.0,
        stream=None,
        unit: str = "images",
    ) -> None:
        self.unit = unit  # what is counted: "images", or "images+frames" when the input holds videos
        self.kind = kind
        self.count = kind.progress_count()
        self.executor_count = self.count.executor_side  # what the executor-side function adds to (None: nothing)
        self.total = total
        self.interval_s = interval_s
        self.stream = stream or sys.stderr
        self._tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._start = time.time()
        self._losses: ExecutorLossWatch | NoLossWatch = NoLossWatch()

    def running_tasks(self) -> int:
        try:
            return self.kind.running_tasks()
        except Exception:  # noqa: BLE001  (the context is stopping: no count is no problem)
            return 0

    def committed(self, rows: int) -> None:
        """A wave of `rows` result rows committed (counted here where the executors do not count)."""
        self.count.committed(rows)

    def line(self, final: bool = False) -> str:
        done = self.count.value
        elapsed = max(time.time() - self._start, 1e-9)
        percent = 100.0 * done / self.total if self.total else 100.0
        rate = done / elapsed
        text = (
            f"{PREFIX} {done}/{self.total} {self.unit} ({percent:.0f}%), {rate:.2f} {self.unit}/s, {duration(elapsed)}"
        )
        if final:
            return text
        eta = duration((self.total - done) / rate) if done else "when the first task ends"
        running = self.running_tasks()
        return f"{text}, {running} task{'' if running == 1 else 's'} running, ETA {eta}"

    def _print(self, text: str, final: bool = False) -> None:
        if self._tty:
            print(f"\r{text}\x1b[K", end="\n" if final else "", file=self.stream, flush=True)
        else:
            print(text, file=self.stream, flush=True)

    def tell_losses(self) -> None:
        """One warning line per executor lost since the last look (on a terminal, below the progress line)."""
        try:
            losses = self._losses.new_losses()
        except Exception as err:  # noqa: BLE001  (the context is stopping: nothing to tell)
            log.debug("could not look for lost executors: %s", err)
            return
        for loss in losses:
            if self._tty and self.interval_s > 0:
                print(file=self.stream, flush=True)
            log.warning(describe(loss, self._losses.log_file))

    def _loop(self) -> None:
        """A terminal gets the line every interval. A log gets it when images or running tasks changed, else as a
        heartbeat whose spacing doubles while nothing changes (up to a minute): a long quiet task does not fill it.
        Without a progress line (interval 0) only lost executors are told of."""
        if self.interval_s <= 0:
            while not self._stop.wait(LOSS_POLL_S):
                self.tell_losses()
            return
        self._print(self.line())
        state, last, quiet_s = None, time.time(), self.interval_s
        while not self._stop.wait(self.interval_s):
            self.tell_losses()
            now_state = (self.count.value, self.running_tasks())
            changed = now_state != state
            if self._tty or changed or time.time() - last >= quiet_s:
                quiet_s = self.interval_s if changed else min(2 * quiet_s, 60.0)
                self._print(self.line())
                state, last = now_state, time.time()

    def __enter__(self) -> ProgressReporter:
        self._start = time.time()
        try:
            self._losses = self.kind.loss_watch()
        except Exception as err:  # noqa: BLE001  (a Spark without this status store: no loss is told)
            log.debug("cannot watch for lost executors: %s", err)
        self._thread = threading.Thread(target=self._loop, name="sparkseg-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join()
        self.tell_losses()
        self._print(self.line(final=True), final=True)
