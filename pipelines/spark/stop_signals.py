"""Ctrl-C or SIGTERM in a job's command line: the run stops cleanly (stop_on_signals), and the command line tells
which it was (exit_code_of); child processes the driver waits on are stopped too, their output after it dropped
(children_stop_on_signals).

SIGTERM is how schedulers stop a run before they kill it (Airflow, cron's `timeout`, Kubernetes; YARN gives a
container 250 ms by default): to the driver alone or to its whole process group, JVM and Python workers included.
The clean stop releases the output's lock, so the scheduler's next run does not wait for it to go stale.

Under spark-submit the driver JVM is this process's parent, and the signal often reaches it alone (`kill <pid>`,
Kubernetes through the driver pod's init process): the JVM's own handler would run its shutdown hooks and exit at once,
the stopped context making the run's code fail with ~250 lines of Java and Python tracebacks, and its last line lost
with the JVM that copies this process's output. stop_on_signals has that JVM hand its first Ctrl-C or SIGTERM to the
same clean stop (forward_jvm_signals); spark-submit then exits with the run's code."""

from __future__ import annotations

import _thread
import contextlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

from pipelines.errors import Interrupted, SparkSegError, Terminated, report_error
from pipelines.spark.spark_session import active_context, is_connect

log = logging.getLogger(__name__)

# what the first signal prints (on stderr, at once)
_STOPPING = {
    signal.SIGINT: b"\nsparkseg: stopping (Ctrl-C again to quit at once)\n",
    signal.SIGTERM: b"\nsparkseg: stopping on SIGTERM (send it again to quit at once)\n",
}

_DEFERRED_STOP = b"\nsparkseg: stopping after the micro-batch in progress (signal again to quit at once)\n"


def stop_on_signals(session=None) -> None:
    """Ctrl-C (SIGINT) or SIGTERM in a job's command line, once its SparkContext is up: a thread of ours stops the
    context (its running jobs end, and every later call on it fails), so the run's code unwinds with an error that the
    command line reports as errors.Interrupted or errors.Terminated (exit_code_of); a second signal raises
    KeyboardInterrupt at once.
    PySpark's own SIGINT handler instead calls the JVM from inside the handler (cancelAllJobs) while the interrupted
    main thread is often mid-call on the same Py4J connection, then raises KeyboardInterrupt there: a "reentrant call"
    error, Py4J's broken connections and ~100 lines of tracebacks, and the JVM's aborts of the interrupted writes.
    The context's own log is turned off first (the jobs it cancels log their aborts), and Py4J's log records after
    the signal (with tracebacks) are dropped. Main thread only, where Python lets handlers be set.
    A Spark Connect client `session` has no context here: the stop interrupts its operations on the server
    (interruptAll) and releases the session, so that the run's next call fails as on a stopped context."""
    if threading.current_thread() is not threading.main_thread():
        return
    if session is not None and is_connect(session):
        _connect_sessions.append(session)
    for signum in _STOPPING:
        signal.signal(signum, _on_stop_signal)
    forward_jvm_signals()
    # Py4J's modules log on their loggers and with logging.exception() on the root logger (a logger's filters see
    # only the records logged on it)
    for name in ("", "py4j.clientserver", "py4j.java_gateway"):
        logger = logging.getLogger(name)
        if not any(isinstance(existing, _Py4JRecordsAfterStop) for existing in logger.filters):
            logger.addFilter(_Py4JRecordsAfterStop())


_stopped_by: list[int] = []  # the stop's signal number, once one began (empty before): see _begin_stop
_signalled_here: list[int] = []  # the signals this process got (its handler ran): a second one quits at once
_begin_lock = threading.Lock()  # this process's handler and spark-submit JVM's (a Py4J thread) may both begin a stop
_interrupt_for_jvm = threading.Event()  # the JVM's signal asks the main thread to stop waiting on children
_jvm_handlers: list[_JvmSignalHandler] = []  # forward_jvm_signals' handlers in spark-submit's JVM
_connect_sessions: list = []  # Spark Connect client sessions whose operations a stop interrupts


def forward_jvm_signals() -> None:
    """Under spark-submit (the driver JVM runs SparkSubmit and is this process's parent), the JVM's first Ctrl-C or
    SIGTERM begins the same clean stop as this process's own (the JVM no longer exits on it), whether it came to the
    JVM alone or to the whole process group; the JVM's own handler is back for a second one, which ends the JVM at
    once. A no-op elsewhere: a JVM this process started (`python jobs/...`: Ctrl-C does not reach it, SIGTERM to the
    group ends it after the stop began), or a shared one (a notebook's)."""
    context = active_context()
    if context is None:
        return
    jvm = context._jvm
    try:
        parent_is_spark_submit = jvm.java.lang.ProcessHandle.current().pid() == os.getppid() and str(
            jvm.java.lang.System.getProperty("sun.java.command", "")
        ).startswith("org.apache.spark.deploy.SparkSubmit")
        if not parent_is_spark_submit:
            return
        from pyspark.java_gateway import ensure_callback_server_started

        ensure_callback_server_started(context._gateway)  # what lets the JVM's thread call this process
        for signum, name in ((signal.SIGINT, "INT"), (signal.SIGTERM, "TERM")):
            handler = _JvmSignalHandler(jvm, signum, name)
            handler.previous = handler.install(handler)
            _jvm_handlers.append(handler)
    except Exception as error:  # noqa: BLE001 - e.g. a JVM run with -Xrs: its own handlers stay, as without this
        log.debug("spark-submit's JVM keeps its own signal handlers: %s", error)


class _JvmSignalHandler:
    """sun.misc.SignalHandler for spark-submit's JVM, implemented here (Py4J calls it on a thread of its own)."""

    def __init__(self, jvm, signum: int, name: str):
        self._jvm, self._signum, self._name = jvm, signum, name
        self.previous = None

    def install(self, java_handler):
        """java_handler (a SignalHandler) takes the JVM's signal from now on; returns the one that had it."""
        return self._jvm.sun.misc.Signal.handle(self._jvm.sun.misc.Signal(self._name), java_handler)

    def handle(self, java_signal) -> None:
        self.install(self.previous)
        if _begin_stop(self._signum) and _waiting_on_children.is_set():
            _interrupt_for_jvm.set()
            _thread.interrupt_main(self._signum)  # runs _on_stop_signal in the main thread, which sees the Event

    def ignore(self) -> None:
        """The JVM ignores the signal from now on (this process would not answer the call once it exits)."""
        self.install(self._jvm.sun.misc.SignalHandler.SIG_IGN)

    class Java:
        implements = ["sun.misc.SignalHandler"]


def is_stop(error: BaseException) -> bool:
    """Whether error is how a Ctrl-C or SIGTERM ended the run: a KeyboardInterrupt, or anything raised once
    a stop began (stop_on_signals; what the stopped context or the stopped child processes made the run's code
    raise)."""
    return isinstance(error, KeyboardInterrupt) or bool(_stopped_by)


def exit_code_of(error: BaseException, interrupted: str) -> int:
    """What a job's command line does with the error that ended it: after a stop (is_stop) one line,
    `error: interrupted (Ctrl-C): <interrupted>`, exit 130 (errors.Interrupted), or `error: terminated (SIGTERM):
    <interrupted>`, exit 143 (errors.Terminated); a SparkSegError's one line and exit code; anything else is a bug and
    is raised again (traceback, exit 1)."""
    if is_stop(error):
        if _stopped_by[:1] == [signal.SIGTERM]:
            return report_error(Terminated(f"terminated (SIGTERM): {interrupted}"))
        return report_error(Interrupted(f"interrupted (Ctrl-C): {interrupted}"))
    if isinstance(error, SparkSegError):
        return report_error(error)
    raise error


def outcome_decided(code: int) -> int:
    """code, the command line's exit code, once its outcome is printed (the summary, or the error's line): from here
    to the process's exit a Ctrl-C or SIGTERM is ignored. Python's own teardown (with Py4J's and Spark's)
    would restore the default handlers, and a signal then would end a finished run with no line, exit 130 or 143.
    Spark-submit's JVM ignores them too (forward_jvm_signals): it exits with code once this process has. Only where
    stop_on_signals set its handlers."""
    for signum in _STOPPING:
        if signal.getsignal(signum) is _on_stop_signal:
            signal.signal(signum, signal.SIG_IGN)
    for handler in _jvm_handlers:
        try:
            handler.ignore()
        except Exception as error:  # noqa: BLE001 - e.g. the JVM already exiting: it ends with this process anyway
            log.debug("spark-submit's JVM did not take SIG_IGN: %s", error)
    return code


_waiting_on_children = threading.Event()
_deferred_to: list[Callable[[], None]] = []  # stop_deferred_to's callback while its block runs


@contextlib.contextmanager
def stop_deferred_to(on_stop: Callable[[], None]):
    """For the block (a stream between its micro-batches), the first Ctrl-C or SIGTERM, to this process or to
    spark-submit's JVM, calls `on_stop` (in the signal's thread) instead of stopping the context: the stream ends
    once the micro-batch in progress has committed. A second signal quits at once, as in a batch run."""
    _deferred_to.append(on_stop)
    try:
        yield
    finally:
        if on_stop in _deferred_to:
            _deferred_to.remove(on_stop)


@contextlib.contextmanager
def children_stop_on_signals(local: bool):
    """For the block, in which the main thread waits on processes and copies their output to sys.stdout
    (TorchDistributor's ranks): what is written there after a Ctrl-C or SIGTERM (stop_on_signals) is dropped, as a
    terminal's Ctrl-C (or a SIGTERM to the process group) reaches local ranks too and each answers with a traceback.

    local: they are this driver's child processes (TorchDistributor's local mode: ranks under torchrun under its
    wrapper), which the stopped SparkContext does not end. The signal then also ends the main thread's wait with a
    KeyboardInterrupt, and the launcher's clean-up ends them (TorchDistributor: SIGTERM to the wrapper, which ends
    torchrun; the ranks end with it), whether or not the signal reached their process group: `kill -INT <driver>`
    does not, and the ranks would train on to the end, the driver waiting. Else they are Spark tasks, which end with
    the context; the main thread is in a Py4J call there, which an exception raised in it would break."""
    copied_to = sys.stdout
    sys.stdout = _DroppedAfterStop(copied_to)
    if local:
        _waiting_on_children.set()
    try:
        yield
    finally:
        _waiting_on_children.clear()
        sys.stdout = copied_to


def _on_stop_signal(signum, frame) -> None:
    if _interrupt_for_jvm.is_set():  # not a signal: spark-submit's JVM got one while the main thread waits on children
        _interrupt_for_jvm.clear()
        raise KeyboardInterrupt
    if _signalled_here:
        raise KeyboardInterrupt
    _signalled_here.append(signum)
    if _begin_stop(signum) and _waiting_on_children.is_set():
        raise KeyboardInterrupt  # children_stop_on_signals: the main thread stops waiting, its clean-up ends them


def _begin_stop(signum: int) -> bool:
    """The stop, once per run, whichever of this process and spark-submit's JVM got the signal first (a signal to
    the process group reaches both): its line, the context's stop. Whether this call began it."""
    with _begin_lock:
        if _stopped_by:
            return False
        on_stop = _deferred_to.pop() if _deferred_to else None
        if on_stop is None:
            _stopped_by.append(signum)
    if on_stop is not None:
        os.write(2, _DEFERRED_STOP)
        on_stop()
        return False
    os.write(2, _STOPPING[signum])
    _quiet_accumulator_server()
    threading.Thread(target=_stop_spark, name="sparkseg-stop", daemon=True).start()
    return True


def _quiet_accumulator_server() -> None:
    """A JVM that got the SIGTERM too (sent to the process group) closes its connection to PySpark's accumulator
    server mid-update: the server, a socketserver in this process, would print the EOFError's traceback."""
    context = active_context()
    server = getattr(context, "_accumulatorServer", None)
    if server is not None:
        server.handle_error = lambda request, client_address: None


def _stop_spark() -> None:
    for session in _connect_sessions:  # its operations interrupted, then the session released: later calls fail
        with contextlib.suppress(Exception):  # the server may be gone already; the run stops either way
            session.interruptAll()
            session.stop()
    context = active_context()
    if context is None:
        return
    try:
        context.setLogLevel("OFF")
        context._jsc.sc().stop()  # the JVM's context only: PySpark's objects stay usable for the clean-up's calls
    except Exception:  # noqa: BLE001 - the context is stopping anyway (or its JVM got the SIGTERM too); exit follows
        pass


class _Py4JRecordsAfterStop(logging.Filter):
    """Drops Py4J's log records once Ctrl-C was pressed or SIGTERM came (stop_on_signals)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (_stopped_by and f"{os.sep}py4j{os.sep}" in record.pathname)


class _DroppedAfterStop:
    """A text stream that passes writes on to `stream` until Ctrl-C is pressed or SIGTERM comes
    (children_stop_on_signals)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> int:
        return len(text) if _stopped_by else self._stream.write(text)

    def __getattr__(self, name):
        return getattr(self._stream, name)
