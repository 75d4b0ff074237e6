"""The one base class of sparkseg's errors and the exit code each kind means.

Command-line entry points map an error to its exit code by class: a `SparkSegError` is an expected outcome (bad
input, a failed error budget, a held lock) reported as one line naming the input and the fix; anything else is a
bug, reported with its traceback and exit 1. Each subclass keeps a builtin base (ValueError, RuntimeError, OSError)
so callers that caught those before still do.
"""

from __future__ import annotations

import sys


class SparkSegError(Exception):
    """Base of every error sparkseg raises on purpose. `exit_code`: what a job's process exits with."""

    exit_code = 1


class UsageError(SparkSegError, ValueError):
    """Bad input, config or model: nothing ran (exit 2). The message names the input and what to do."""

    exit_code = 2


class StorageError(SparkSegError, OSError):
    """A store failed (unreachable, refused) when asked about a URI the message names, without secrets or a stack
    trace (exit 1: the store, not the input, failed; a later run may succeed)."""

    exit_code = 1


class ClusterUnreachable(SparkSegError, ConnectionError):
    """The Spark master named by --master did not answer: nothing ran (exit 1, as for a store: a later run may
    succeed)."""

    exit_code = 1


class RunFailed(SparkSegError, RuntimeError):
    """The job ran but its outcome is not acceptable, e.g. too many errors (exit 3; summary.json was written)."""

    exit_code = 3


class OutputBusy(SparkSegError, RuntimeError):
    """Another run holds the output's lock (exit 4): nothing was done, or (LockLost) the run stopped once another run
    broke its lock, keeping what it had committed."""

    exit_code = 4


class Interrupted(SparkSegError):
    """Ctrl-C (SIGINT) stopped a job's command line (exit 130, as a shell reports a process SIGINT ended): what the
    run committed before is kept, and the same command run again goes on from there."""

    exit_code = 130


class Terminated(Interrupted):
    """SIGTERM (a scheduler's stop, `kill <pid>`) stopped a job's command line, as a Ctrl-C does (exit 143, as a shell
    reports a process SIGTERM ended)."""

    exit_code = 143


def report_error(error: SparkSegError) -> int:
    """What a command line does with an expected error: one line on stderr; returns the exit code it means."""
    print(f"error: {error}", file=sys.stderr)
    return error.exit_code
