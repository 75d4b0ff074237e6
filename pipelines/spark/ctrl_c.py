"""Ctrl-C in a job's command line: the run stops cleanly (stop_on_ctrl_c), and the command line tells it was that
(exit_code_of); child processes the driver waits on are stopped too, their output after it dropped
(children_stop_on_ctrl_c)."""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading

from pyspark import SparkContext

from pipelines.errors import Interrupted, SparkSegError, report_error


def stop_on_ctrl_c() -> None:
    """Ctrl-C (SIGINT) in a job's command line, once its SparkContext is up: a thread of ours stops the context
    (its running jobs end, and every later call on it fails), so the run's code unwinds with an error that the
    command line reports as errors.Interrupted (exit_code_of); a second Ctrl-C raises KeyboardInterrupt at once.
    PySpark's own handler instead calls the JVM from inside the handler (cancelAllJobs) while the interrupted main
    thread is often mid-call on the same Py4J connection, then raises KeyboardInterrupt there: a "reentrant call"
    error, Py4J's broken connections and ~100 lines of tracebacks, and the JVM's aborts of the interrupted writes.
    The context's own log is turned off first (the jobs it cancels log their aborts), and Py4J's log records after
    the Ctrl-C (with tracebacks) are dropped. Main thread only, where Python lets handlers be set."""
    if threading.current_thread() is not threading.main_thread():
        return
    signal.signal(signal.SIGINT, _on_ctrl_c)
    # Py4J's modules log on their loggers and with logging.exception() on the root logger (a logger's filters see
    # only the records logged on it)
    for name in ("", "py4j.clientserver", "py4j.java_gateway"):
        logger = logging.getLogger(name)
        if not any(isinstance(existing, _Py4JRecordsAfterCtrlC) for existing in logger.filters):
            logger.addFilter(_Py4JRecordsAfterCtrlC())


_ctrl_c = threading.Event()


def is_ctrl_c(error: BaseException) -> bool:
    """Whether error is how a Ctrl-C ended the run: a KeyboardInterrupt, or anything raised once stop_on_ctrl_c's
    handler ran (what the stopped context or the stopped child processes made the run's code raise)."""
    return isinstance(error, KeyboardInterrupt) or _ctrl_c.is_set()


def exit_code_of(error: BaseException, interrupted: str) -> int:
    """What a job's command line does with the error that ended it: after a Ctrl-C (is_ctrl_c) one line,
    `error: interrupted (Ctrl-C): <interrupted>`, exit 130 (errors.Interrupted); a SparkSegError's one line and exit
    code; anything else is a bug and is raised again (traceback, exit 1)."""
    if is_ctrl_c(error):
        return report_error(Interrupted(f"interrupted (Ctrl-C): {interrupted}"))
    if isinstance(error, SparkSegError):
        return report_error(error)
    raise error


_waiting_on_children = threading.Event()


@contextlib.contextmanager
def children_stop_on_ctrl_c(local: bool):
    """For the block, in which the main thread waits on processes and copies their output to sys.stdout
    (TorchDistributor's ranks): what is written there after a Ctrl-C (stop_on_ctrl_c) is dropped, as a terminal's
    Ctrl-C reaches local ranks too and each answers with a traceback.

    local: they are this driver's child processes (TorchDistributor's local mode: ranks under torchrun under its
    wrapper), which the stopped SparkContext does not end. A Ctrl-C then also ends the main thread's wait with a
    KeyboardInterrupt, and the launcher's clean-up ends them (TorchDistributor: SIGTERM to the wrapper, which ends
    torchrun; the ranks end with it), whether or not the SIGINT reached their process group: `kill -INT <driver>`
    does not, and the ranks would train on to the end, the driver waiting. Else they are Spark tasks, which end with
    the context; the main thread is in a Py4J call there, which an exception raised in it would break."""
    copied_to = sys.stdout
    sys.stdout = _DroppedAfterCtrlC(copied_to)
    if local:
        _waiting_on_children.set()
    try:
        yield
    finally:
        _waiting_on_children.clear()
        sys.stdout = copied_to


def _on_ctrl_c(signum, frame) -> None:
    if _ctrl_c.is_set():
        raise KeyboardInterrupt
    _ctrl_c.set()
    os.write(2, b"\nsparkseg: stopping (Ctrl-C again to quit at once)\n")
    threading.Thread(target=_stop_spark, name="sparkseg-ctrl-c", daemon=True).start()
    if _waiting_on_children.is_set():
        raise KeyboardInterrupt   # children_stop_on_ctrl_c: the main thread stops waiting, its clean-up ends them


def _stop_spark() -> None:
    context = SparkContext._active_spark_context
    if context is None:
        return
    try:
        context.setLogLevel("OFF")
        context._jsc.sc().stop()   # the JVM's context only: PySpark's objects stay usable for the clean-up's calls
    except Exception:  # noqa: BLE001 - the context is stopping anyway; the process exits next
        pass


class _Py4JRecordsAfterCtrlC(logging.Filter):
    """Drops Py4J's log records once Ctrl-C was pressed (stop_on_ctrl_c)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_ctrl_c.is_set() and f"{os.sep}py4j{os.sep}" in record.pathname)


class _DroppedAfterCtrlC:
    """A text stream that passes writes on to `stream` until Ctrl-C is pressed (children_stop_on_ctrl_c)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return len(text) if _ctrl_c.is_set() else self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)
