"""One run at a time per output: the lock `<output>/_sparkseg.lock`.

The lock is a small JSON file (or blob) naming its holder: run id, host, pid (and the pid's start time, so that a
reused pid is not mistaken for the holder), start time and a heartbeat that a driver thread rewrites every
`heartbeat_s` while the run goes on. It is created atomically, only when absent:
- local paths (and FUSE mounts such as /dbfs): `open(O_CREAT | O_EXCL)`; a heartbeat's check-and-rewrite and a
  breaker's check-and-remove hold an flock on the lock's directory, so they never interleave (where the file system
  has no flock, they are as atomic as its renames);
- Azure (`az://`, `abfs://` outputs, written with the Azure SDK): Put Blob with `If-None-Match: *`
  (`upload_blob(overwrite=False)`); heartbeats and deletes are conditional on the blob's ETag;
- other Hadoop URIs (`hdfs://`, `abfss://` with hadoop-azure, ...): `FileSystem.create(path, overwrite=false)`
  through Spark's JVM (atomic on HDFS and ABFS).

A second run finds the lock and stops with `LockHeld` (the job exits 4), naming the holder; a run whose lock another
run broke stops before its next write with `LockLost` (exit 4; `RunLock.ensure_held`). A lock is STALE when
its heartbeat is older than `stale_after_s`, or when its holder ran on this host and that process is gone; a stale
lock is broken (with a warning) and the run goes on. `break_lock=True` (`--break-lock`) also breaks a lock that
does not look stale: only for an operator who knows the holder is dead (e.g. its host was lost a minute ago).
Breaking is safe against races: the lock is removed only if it is still exactly the one judged stale.
Heartbeat staleness compares the holder's clock with ours: hosts' clocks must agree to well within stale_after_s.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import socket
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any, Generic, Protocol

from pipelines.errors import OutputBusy, UsageError
from pipelines.io.lock_stores import AzureLockStore, HadoopLockStore, LocalLockStore, LockStore, Token
from pipelines.io.storage import Location
from pipelines.io.uris import join_uri, store_of, to_local_path

log = logging.getLogger(__name__)

LOCK_NAME = "_sparkseg.lock"


class LockHeld(OutputBusy):
    """Another run holds the output's lock; the message names it and says what to do."""


class LockLost(OutputBusy):
    """Another run broke this run's lock while it wrote (`--break-lock`, or this run looked stale): this run stops
    at its next wave, keeping what it committed (exit 4)."""


@dataclass(frozen=True)
class LockSettings:
    """How the lock behaves. Seconds throughout."""

    stale_after_s: float = 600.0  # a heartbeat older than this means the holder is dead
    heartbeat_s: float = 30.0  # how often the holder rewrites its heartbeat
    break_lock: bool = False  # break the lock even when it does not look stale

    def __post_init__(self):
        if not 0 < self.heartbeat_s < self.stale_after_s:
            raise UsageError(
                f"lock settings: need 0 < heartbeat_s ({self.heartbeat_s}) < stale_after_s "
                f"({self.stale_after_s}), else a live run looks dead"
            )


@dataclass(frozen=True)
class LockInfo:
    """What the lock file holds. Times are ISO 8601 UTC."""

    run_id: str
    host: str
    pid: int
    pid_started: int | None  # the process's start time in clock ticks since boot (Linux), None elsewhere
    started: str
    heartbeat: str
    # the holder's Spark Connect session id: its operations run on the server, not in the holder's process, and
    # outlive it (a run that breaks the lock of a dead Connect client interrupts them: session_kind.end_session)
    session: str | None = None

    @classmethod
    def for_this_process(cls, run_id: str, session: str | None = None) -> LockInfo:
        now = _utc_now()
        return cls(run_id, socket.gethostname(), os.getpid(), _process_start(os.getpid()), now, now, session)

    @classmethod
    def parse(cls, data: bytes) -> LockInfo | None:
        """None when `data` is not a complete lock (being written, or not ours)."""
        try:
            return cls(**json.loads(data.decode("utf-8")))
        except (ValueError, TypeError, UnicodeDecodeError):
            return None

    def to_bytes(self) -> bytes:
        return (json.dumps(asdict(self), indent=1) + "\n").encode("utf-8")

    def beat(self) -> LockInfo:
        return LockInfo(**{**asdict(self), "heartbeat": _utc_now()})

    def heartbeat_age_s(self) -> float:
        return time.time() - dt.datetime.fromisoformat(self.heartbeat).timestamp()

    def describe(self) -> str:
        try:
            beat = f"last heartbeat {self.heartbeat_age_s():.0f} s ago"
        except (TypeError, ValueError):
            beat = f"heartbeat {self.heartbeat!r}"
        return f"run {self.run_id} (host {self.host}, pid {self.pid}, started {self.started}, {beat})"


class HeldLock(Protocol):
    """What a run's writing code needs of its lock: RunLock in the process that holds it, LockWatch elsewhere."""

    def ensure_held(self) -> None: ...


class RunLock(Generic[Token]):
    """A held lock. `release()` (idempotent) stops the heartbeat and removes the lock if it is still ours."""

    def __init__(self, store: LockStore[Token], info: LockInfo, token: Token, settings: LockSettings):
        self.store, self.info, self.settings = store, info, settings
        self._token: Token | None = token
        self.lost = False  # set when the heartbeat found the lock taken over (broken by another run)
        self.broke: LockInfo | None = None  # the stale holder this run broke the lock of, if it did
        self.taken_by = ""  # then: the run holding it at that moment, described
        self._stop = threading.Event()
        self._mutex = threading.Lock()
        self._thread = threading.Thread(target=self._heartbeat_loop, name="sparkseg-lock-heartbeat", daemon=True)

    @classmethod
    def acquire(
        cls,
        output: Location | str,
        run_id: str,
        settings: LockSettings = LockSettings(),
        *,
        hadoop_files=None,
        session: str | None = None,
        attempts: int = 3,
    ) -> RunLock[Any]:
        """Take the lock of `output` for `run_id` and start heartbeating; raise LockHeld if a live run has it.
        `hadoop_files` (uri -> the driver's Hadoop FileSystem for it: pipelines.spark.session_kind.hadoop_files) is
        needed for Hadoop URIs (hdfs://, ...); a URI without a Location's credentials uses the
        environment's for az://. `session`: the run's Spark Connect session id, recorded in the lock."""
        store = lock_store(output, hadoop_files=hadoop_files)
        info = LockInfo.for_this_process(run_id, session)
        broke = None
        for _ in range(attempts):
            token = store.create(info.to_bytes())
            if token is not None:
                lock = cls(store, info, token, settings)
                lock.broke = broke
                lock._thread.start()
                return lock
            found = store.read()
            if found is None:
                continue  # released in between: try again
            data, token, modified = found
            holder = LockInfo.parse(data)
            reason = stale_reason(holder, modified, settings.stale_after_s)
            who = holder.describe() if holder else f"an unreadable lock written {time.time() - modified:.0f} s ago"
            if reason is None and not settings.break_lock:
                raise LockHeld(
                    f"{store.uri} is held by {who}: another sparkseg run is writing this output. Wait for "
                    f"it to finish; if that run is dead, rerun with --break-lock (or wait "
                    f"{settings.stale_after_s:.0f} s after its last heartbeat)"
                )
            if store.delete(token):
                log.warning("broke the lock %s of %s (%s)", store.uri, who, reason or "forced by --break-lock")
                broke = holder if reason is not None else None  # a forced break's holder is alive: it stops itself
            # else it changed while we looked (a heartbeat, a release, another breaker): look again
        raise LockHeld(f"{store.uri}: could not take the lock in {attempts} attempts; another run keeps changing it")

    def release(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()
        with self._mutex:
            if self._token is None:
                return
            still_ours = self.store.delete(self._token)
            self._token = None
        if not still_ours:
            log.warning(
                "the lock %s was taken over by another run before this one (%s) ended", self.store.uri, self.info.run_id
            )

    def heartbeat(self) -> bool:
        """Rewrite the heartbeat now; False (and `lost`) when the lock is no longer ours."""
        with self._mutex:
            if self._token is None:
                return False
            info = self.info.beat()
            token = self.store.replace(info.to_bytes(), self._token)
            if token is None:
                self.lost, self._token = True, None
                found = self.store.read()
                holder = LockInfo.parse(found[0]) if found else None
                self.taken_by = holder.describe() if holder else "another run"  # absent: between its break and its take
                log.warning(
                    "the lock %s was broken by %s; this run (%s) stops at its next wave",
                    self.store.uri,
                    self.taken_by,
                    self.info.run_id,
                )
                return False
            self.info, self._token = info, token
            return True

    def ensure_held(self) -> None:
        """Rewrite the heartbeat now and raise LockLost when the lock is no longer ours: the run calls this before
        each write it commits (a wave, the resume index, the summary), so a run whose lock was broken stops instead of
        writing beside the run that broke it. A storage error here is left to the heartbeat thread's retries."""
        try:
            held = self.heartbeat()
        except Exception as err:  # noqa: BLE001 - a storage hiccup must not end the run
            log.warning("lock heartbeat failed (%s: %s); the heartbeat thread retries", type(err).__name__, err)
            return
        if not held:
            raise LockLost(
                f"{self.store.uri}: this run's lock was broken by {self.taken_by} while this run "
                f"({self.info.run_id}) wrote; it stopped, and the images it committed are kept. Let that "
                "run finish, then run again to do what is left (it skips what is done)"
            )

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.settings.heartbeat_s):
            try:
                if not self.heartbeat():
                    return
            except Exception as err:  # noqa: BLE001 - a storage hiccup must not kill the run; the next beat retries
                log.warning("lock heartbeat failed (%s: %s); retrying", type(err).__name__, err)

    def __enter__(self) -> RunLock[Token]:
        return self

    def __exit__(self, *exc_info) -> None:
        self.release()


class LockWatch:
    """A lock held by another process, seen from this one (a Spark Connect server's foreachBatch worker runs the
    stream's micro-batches; the client holds the lock and heartbeats). Picklable. `ensure_held` reads the lock and
    raises LockLost when it no longer names the holder's run, or when the holder is dead (its process gone, or its
    heartbeat stale): a stream does not outlive its client. The run that breaks the lock also ends the holder's
    Connect session, which stops a micro-batch between this check and its commit."""

    def __init__(self, output: Location | str, run_id: str, settings: LockSettings) -> None:
        self.output, self.run_id, self.settings = Location.of(output), run_id, settings

    def ensure_held(self) -> None:
        store = lock_store(self.output)  # local or az:// (a Connect session has no Hadoop FileSystem)
        found = store.read()
        holder = LockInfo.parse(found[0]) if found else None
        if holder is None or holder.run_id != self.run_id:
            taken_by = holder.describe() if holder else "another run (the lock is gone)"
            raise LockLost(
                f"{store.uri}: this stream's lock ({self.run_id}) was broken by {taken_by}; it stopped, and the "
                "images it committed are kept. Let that run finish, then start the stream again"
            )
        dead = stale_reason(holder, found[2] if found else time.time(), self.settings.stale_after_s)
        if dead is not None:
            raise LockLost(
                f"{store.uri}: the client of this stream ({holder.describe()}) is gone ({dead}); its micro-batches "
                "stopped. Start the stream again to go on (it skips what is done)"
            )


def stale_reason(holder: LockInfo | None, modified: float, stale_after_s: float) -> str | None:
    """Why the lock (parsed `holder`, last modified at epoch `modified`) is stale, or None when it looks alive."""
    if holder is None:  # being written right now, or garbage: judge by the file's age
        age = time.time() - modified
        return f"unreadable and {age:.0f} s old" if age > stale_after_s else None
    if holder.host == socket.gethostname() and not process_alive(holder.pid, holder.pid_started):
        return f"its process {holder.pid} on {holder.host} is gone"
    try:
        age = holder.heartbeat_age_s()
    except (TypeError, ValueError):
        age = time.time() - modified
    return f"no heartbeat for {age:.0f} s" if age > stale_after_s else None


def process_alive(pid: int, started: int | None = None) -> bool:
    """True when process `pid` exists (and, when `started` is known, is the same process, not a reused pid)."""
    if pid <= 0:
        return False
    if os.path.isdir("/proc"):
        current = _process_start(pid)
        return current is not None and (started is None or current == started)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def lock_store(output: Location | str, *, hadoop_files=None) -> LockStore[Any]:
    """The store for `<output>/_sparkseg.lock`, chosen like the results writer chooses how to write."""
    output = Location.of(output)
    uri = join_uri(output.uri, LOCK_NAME)
    store = store_of(output.uri)
    if store == "local":
        return LocalLockStore(to_local_path(uri))
    if store == "azure_sdk":
        return AzureLockStore(uri, output.credentials)
    if hadoop_files is None:
        raise ValueError(f"{output.uri}: locking a Hadoop output needs its FileSystem (hadoop_files=...)")
    return HadoopLockStore(uri, hadoop_files(uri))


# ---- helpers --------------------------------------------------------------------------------------------------


def _utc_now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds")


def _process_start(pid: int) -> int | None:
    """Start time of `pid` in clock ticks since boot (field 22 of /proc/<pid>/stat); None without /proc or if gone.
    A zombie counts as gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if fields[0] == "Z" else int(fields[19])
