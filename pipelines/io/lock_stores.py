"""Where the run lock lives: one store per kind of output, each with atomic create, conditional replace and
conditional delete (pipelines.io.run_lock says what the lock means and how runs use it).

- local paths (and FUSE mounts such as /dbfs): `open(O_CREAT | O_EXCL)`; a heartbeat's check-and-rewrite and a
  breaker's check-and-remove hold an flock on the lock's directory;
- Azure (`az://`, `abfs://`, Azure SDK): Put Blob with `If-None-Match: *`, then ETag-conditional writes;
- other Hadoop URIs (`hdfs://`, `abfss://` with hadoop-azure, ...): `FileSystem.create(path, overwrite=false)`.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import time
import uuid
from typing import Protocol, TypeVar

from pipelines.errors import StorageError
from pipelines.io.azure_credentials import AzureCredentials, parse_blob_uri
from pipelines.io.azure_storage import AzureBlobStore, translate_error

log = logging.getLogger(__name__)

Token = TypeVar("Token")


class LockStore(Protocol[Token]):
    """Atomic operations on one lock location. A token identifies one version of the lock (its bytes, or an ETag):
    `replace` and `delete` act only if the lock is still that version."""

    uri: str

    def create(self, data: bytes) -> Token | None:
        """Create the lock with `data` if absent; its token, or None when it exists."""

    def read(self) -> tuple[bytes, Token, float] | None:
        """(data, token, last-modified epoch seconds), or None when there is no lock."""

    def replace(self, data: bytes, token: Token) -> Token | None:
        """Rewrite the lock if it is still version `token`; the new token, or None when it is not."""

    def delete(self, token: Token) -> bool:
        """Remove the lock if it is still version `token`; False when it is not (or is gone)."""


class LocalLockStore:
    """A lock file on a local (or FUSE-mounted) file system. The token is the file's content. Each operation's
    check and act run under an flock on the lock's directory (serialized): without it a heartbeat that had read its
    own version could rename its new one over the lock a breaker had just written, and the breaker, not the broken
    run, would find itself lost."""

    FLOCK_WAIT_S = 10.0  # a holder of the flock stopped (SIGSTOP) or stuck: go on unserialized after this

    def __init__(self, path: str):
        self.path = self.uri = path

    @contextlib.contextmanager
    def serialized(self):
        """Hold an flock on the lock's directory for the block (other processes' and threads' operations on this
        lock wait); without it where the file system has no flock or the wait passes FLOCK_WAIT_S."""
        try:
            fd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY | os.O_DIRECTORY)
        except OSError:
            yield
            return
        try:
            deadline = time.monotonic() + self.FLOCK_WAIT_S
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        log.warning(
                            "%s: its directory's flock is held for over %.0f s; going on without it",
                            self.path,
                            self.FLOCK_WAIT_S,
                        )
                        break
                    time.sleep(0.005)
                except OSError:  # no flock here (an NFS mount's emulation needs a writable file, some FUSE mounts)
                    break
            yield
        finally:
            os.close(fd)  # releases the flock

    def create(self, data: bytes) -> bytes | None:
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        except OSError as err:  # the output cannot be made here (a read-only or special file system)
            raise StorageError(
                f"{os.path.dirname(self.path)}: cannot create the output directory ({err.strerror or err})"
            ) from None
        try:
            with self.serialized():  # not inside a breaker's put-back (delete)
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return None
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return data

    def read(self) -> tuple[bytes, bytes, float] | None:
        try:
            with open(self.path, "rb") as handle:
                data = handle.read()
                modified = os.fstat(handle.fileno()).st_mtime
        except FileNotFoundError:
            return None
        return data, data, modified

    def replace(self, data: bytes, token: bytes) -> bytes | None:
        temp = self._written(data)
        try:
            with self.serialized():
                found = self.read()
                if found is not None and found[1] == token:
                    os.replace(temp, self.path)  # atomic: the lock never disappears while it is rewritten
                    return data
        except BaseException:
            os.unlink(temp)
            raise
        os.unlink(temp)
        return None

    def delete(self, token: bytes) -> bool:
        aside = f"{self.path}.{uuid.uuid4().hex}.released"
        with self.serialized():
            try:
                os.rename(self.path, aside)  # atomic: of two deleters only one gets the file
            except FileNotFoundError:
                return False
            with open(aside, "rb") as handle:
                taken = handle.read()
            if taken != token:  # not the version we meant: put it back unless a new lock appeared meanwhile
                try:
                    os.link(aside, self.path)
                except OSError:
                    pass
                os.unlink(aside)
                return False
        os.unlink(aside)
        return True

    def _written(self, data: bytes) -> str:
        """A temp file beside the lock holding data, synced (before the flock: the serialized part stays short)."""
        temp = f"{self.path}.{uuid.uuid4().hex}.tmp"
        with open(temp, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        return temp


class AzureLockStore:
    """A lock blob; tokens are ETags, every change is conditional on the ETag."""

    def __init__(self, uri: str, credentials=None):
        self.uri = uri
        self._credentials = credentials if credentials is not None else AzureCredentials.from_env()
        self._store = AzureBlobStore(self._credentials)
        path = parse_blob_uri(uri)
        self._blob = self._store.container_client(path).get_blob_client(path.path)

    def create(self, data: bytes) -> str | None:
        from azure.core.exceptions import ResourceExistsError

        try:
            return self._call(lambda: self._blob.upload_blob(data, overwrite=False))["etag"]  # If-None-Match: *
        except ResourceExistsError:
            return None

    def read(self) -> tuple[bytes, str, float] | None:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            download = self._call(lambda: self._blob.download_blob())
            data = download.readall()
        except ResourceNotFoundError:
            return None
        return data, download.properties.etag, download.properties.last_modified.timestamp()

    def replace(self, data: bytes, token: str) -> str | None:
        from azure.core import MatchConditions

        return self._conditional(
            lambda: self._blob.upload_blob(
                data, overwrite=True, etag=token, match_condition=MatchConditions.IfNotModified
            )["etag"]
        )

    def delete(self, token: str) -> bool:
        from azure.core import MatchConditions

        return (
            self._conditional(
                lambda: self._blob.delete_blob(etag=token, match_condition=MatchConditions.IfNotModified) or True
            )
            is not None
        )

    def _conditional(self, operation):
        """`operation()`, or None when its condition failed (412) or the blob is gone (404)."""
        from azure.core.exceptions import ResourceModifiedError, ResourceNotFoundError

        try:
            return self._call(operation)
        except (ResourceModifiedError, ResourceNotFoundError):
            return None

    def _call(self, operation):
        """Expected outcomes (exists, not found, modified) pass through; any other failure is scrubbed of secrets."""
        from azure.core.exceptions import ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

        try:
            return operation()
        except (ResourceExistsError, ResourceModifiedError, ResourceNotFoundError):
            raise
        except Exception as exc:  # noqa: BLE001
            error = translate_error(exc, "lock", self.uri, self._credentials)
        raise error


class HadoopLockStore:
    """A lock file through Spark's Hadoop FileSystem (hdfs://, abfss://, ...). The token is the file's content.
    `files`: the driver's Hadoop FileSystem for `uri` (pipelines.spark.session_kind.HadoopFiles)."""

    def __init__(self, uri: str, files):
        self.uri, self._files = uri, files
        self._path = files.hadoop_path
        self._fs = files.file_system

    def create(self, data: bytes) -> bytes | None:
        try:
            self._write(self._path, data, overwrite=False)  # HDFS, ABFS: atomic create-if-absent
        except Exception as err:  # noqa: BLE001 - py4j wraps the Java exception
            if "FileAlreadyExistsException" in str(err):
                return None
            raise
        return data

    def read(self) -> tuple[bytes, bytes, float] | None:
        if not self._fs.exists(self._path):
            return None
        try:
            data = self._read(self._path)
            modified = self._fs.getFileStatus(self._path).getModificationTime() / 1000.0
        except Exception as err:  # noqa: BLE001 - FileNotFoundException through py4j: removed in between
            if "FileNotFoundException" in str(err):
                return None
            raise
        return data, data, modified

    def replace(self, data: bytes, token: bytes) -> bytes | None:
        found = self.read()
        if found is None or found[1] != token:
            return None
        self._write(self._path, data, overwrite=True)
        return data

    def delete(self, token: bytes) -> bool:
        aside = self._sibling("released")
        if not self._fs.rename(self._path, aside):
            return False
        taken = self._read(aside)
        if taken != token:
            self._fs.rename(aside, self._path)  # put it back (fails harmlessly if a new lock appeared)
        self._fs.delete(aside, False)
        return taken == token

    def _sibling(self, suffix: str):
        return self._files.path(f"{self.uri}.{uuid.uuid4().hex}.{suffix}")

    def _write(self, path, data: bytes, overwrite: bool = False) -> None:
        stream = self._fs.create(path, overwrite)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()

    def _read(self, path) -> bytes:
        stream = self._fs.open(path)
        try:
            return self._files.read_all(stream)
        finally:
            stream.close()
