"""Poison images: an image that crashes its Python worker (a decoder segfault, an abort in a native library) kills
the whole task, and Spark's retries would crash on it again until the job fails. The guard makes the retries
smarter.

Before the risky work on a group of images (a batch: decode, inference, postprocess) a task records them as "in
flight" in a marker for its (scope, partition, task attempt) on shared storage, one write per group, and clears it when
the task ends normally. A retried task first reads the markers its earlier attempts left behind: an image that was
in flight when `threshold` attempts died is not touched again and becomes an error row ("PoisonImage") instead, so
the task, and the job, go on. The images in flight at an earlier death (suspects) are processed one group each,
so a second death names its image alone. Once a wave's results are committed, its markers have no more use: the
job removes the markers directory (remove_markers), with any that a killed run left behind.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass

from pipelines.errors import SparkSegError
from pipelines.io.storage import Location

MARKER_DIR = "_sparkseg_attempts"


def remove_markers(output: Location) -> None:
    """Remove the output's markers directory: called between waves, when no task of the run is running (and the run
    lock keeps other runs away), so every marker in it is spent. Housekeeping: a failure is logged, not raised."""
    try:
        (output / MARKER_DIR).remove_tree()
    except Exception as err:  # noqa: BLE001 (storage errors of any store)
        logging.getLogger(__name__).warning(
            "could not remove %s: %s: %s", (output / MARKER_DIR).uri, type(err).__name__, err
        )


class PoisonImage(SparkSegError, RuntimeError):
    """An image that crashed run.poison_attempts task attempts: recorded as an errors/ row."""


@dataclass(frozen=True)
class CrashGuard:
    """scope: a location unique to the run and wave, e.g. <output>/_sparkseg_attempts/<run>-w00001."""

    scope: Location
    threshold: int = 2

    def for_task(self) -> TaskCrashGuard:
        from pyspark import TaskContext

        context = TaskContext.get()
        partition, attempt_id = (context.partitionId(), context.taskAttemptId()) if context else (0, 0)
        return TaskCrashGuard(self, self.scope / f"p{partition:05d}", attempt_id)


class TaskCrashGuard:
    """One task attempt's guard, its marker named by Spark's task attempt id (unique in the application, growing as
    attempts start). Not by the attempt number: when an executor dies with shuffle output that the stage reads,
    Spark runs the stage again and its tasks' attempt numbers start at 0 again."""

    def __init__(self, guard: CrashGuard, directory: Location, attempt_id: int) -> None:
        self.guard = guard
        self.marker = directory / f"attempt-{attempt_id:012d}"
        earlier = self._read_earlier(directory, attempt_id)
        self.retried = earlier is not None  # an earlier attempt of this task ran (and died or failed)
        self.crashes = collections.Counter(earlier or [])

    @staticmethod
    def _read_earlier(directory: Location, attempt_id: int) -> list[str] | None:
        """Every key in flight when an earlier attempt of the task died, once per attempt; None when no earlier
        attempt left a marker (one listing of the task's markers: none, almost always)."""
        try:
            uris = directory.list_files()
        except FileNotFoundError:
            return None
        names = sorted(uri.rstrip("/").rpartition("/")[2] for uri in uris)
        earlier = [name for name in names if name.startswith("attempt-") and int(name[len("attempt-") :]) < attempt_id]
        if not earlier:
            return None
        keys = []
        for name in earlier:
            keys.extend({line for line in (directory / name).read_bytes().decode().splitlines() if line})
        return keys

    def check(self, key: str) -> None:
        """Raise PoisonImage if `key` (an image's path, a video segment's) was in flight when `threshold` earlier
        attempts died."""
        crashes = self.crashes.get(key, 0)
        if crashes >= self.guard.threshold:
            raise PoisonImage(
                f"{key}: crashed its Python worker in {crashes} task attempts; skipped so the job can "
                "go on. Check the file (a decoder bug or a malicious image) and remove or re-encode it"
            )

    def suspected(self, key: str) -> bool:
        """Was `key` in flight when an earlier attempt died? (Then it goes in a group of its own.)"""
        return self.crashes.get(key, 0) > 0

    def in_flight(self, keys: list[str]) -> None:
        """Record `keys` as the ones being worked on, until the next call or done()."""
        self._write("\n".join(keys))

    def done(self) -> None:
        """The task ends normally: nothing of it is in flight."""
        self._write("")

    def _write(self, text: str) -> None:
        # once per group: no fsync, the marker only has to outlive a crashed Python worker (the page cache does)
        self.marker.write_bytes_atomic(text.encode(), durable=False)


def crash_groups(records: list, guard: TaskCrashGuard | None) -> list[list]:
    """The records (with a .path) in the groups they are put in flight as: all together, except that each suspect
    of an earlier attempt's death gets a group of its own."""
    if guard is None or not guard.crashes:
        return [records] if records else []
    suspects = [record for record in records if guard.suspected(record.path)]
    others = [record for record in records if not guard.suspected(record.path)]
    return ([others] if others else []) + [[record] for record in suspects]
