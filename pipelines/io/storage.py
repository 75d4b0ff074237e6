"""Driver- and executor-side I/O of single files and listings that do not go through Spark (summaries, locks, table
indexes, masks, manifests). One `FileStore` per store kind (local, Azure SDK, fsspec), chosen by `file_store(uri)` from
the routing rule in `pipelines.io.uris` (which also holds the URI helpers re-exported here).
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import Iterable, Protocol

from pipelines.errors import UsageError
from pipelines.io.uris import (AZURE_SCHEMES, has_extension, is_azure, is_hidden, is_local, join_uri,  # noqa: F401
                            normalize_extensions, scheme_of, store_of, to_local_path)

# fsspec schemes whose Hadoop (Spark) spelling differs.
_SPARK_SCHEMES = {"s3": "s3a"}


def to_spark_uri(uri: str | os.PathLike, account: str | None = None) -> str:
    """The spelling of `uri` that Spark's (Hadoop's) file systems read.

    Plain paths -> `file:/absolute/path` (user and symlinks resolved; Hadoop's spelling, not a URI: Spark reads
    `file:/a b` as the directory "a b" and `file:///a%20b` as "a%20b"); `file:` URIs unchanged; `az://container/p` ->
    `abfss://container@<account>.dfs.core.windows.net/p` (`account` or the environment's AZURE_STORAGE_ACCOUNT_NAME /
    connection string AccountName); `s3://` -> `s3a://`; everything else unchanged. abfss:// needs the hadoop-azure
    jar on the cluster; without it, read with `pipelines.io.azure_storage` instead.
    """
    text = os.fspath(uri)
    scheme = scheme_of(text)
    if scheme == "":
        return f"file:{Path(text).expanduser().resolve()}"
    if scheme == "az":
        from pipelines.io.azure_storage import account_name_from_env, parse_blob_uri

        path = parse_blob_uri(text)
        account = account or account_name_from_env()
        if not account:
            raise UsageError(f"{text!r}: az:// URIs carry no storage account; pass account=..., set "
                             "AZURE_STORAGE_ACCOUNT_NAME, or write abfss://container@account.dfs.core.windows.net/path")
        return f"abfss://{path.container}@{account}.dfs.core.windows.net/{path.path}"
    if scheme in _SPARK_SCHEMES:
        return _SPARK_SCHEMES[scheme] + text[len(scheme):]
    return text



class FileStore(Protocol):
    """What every store does with one file or one directory tree."""

    def write_atomic(self, uri: str, data: bytes) -> None: ...
    def read(self, uri: str) -> bytes: ...
    def exists(self, uri: str) -> bool: ...
    def list(self, uri: str, wanted: tuple[str, ...] | None) -> list[str]: ...


def file_store(uri: str, azure_credentials=None) -> FileStore:
    """The store for single-file I/O on `uri`: local files, the Azure SDK (every Azure spelling: no fsspec backend
    for Azure is installed), else fsspec."""
    if store_of(uri) == "local":
        return LocalFiles()
    if is_azure(uri):
        return AzureFiles(azure_credentials)
    return FsspecFiles()


def write_bytes_atomic(uri: str | os.PathLike, data: bytes, azure_credentials=None) -> None:
    """Write `data` so that readers see the old file or the whole new one, never a part.

    Local: temp file in the same directory, fsync, os.replace. Azure: one blob upload (atomic on commit), with
    `azure_credentials` or AzureCredentials.from_env(). Other schemes: fsspec write to a hidden temp name, then mv.
    Parent directories are created.
    """
    text = os.fspath(uri)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"write_bytes_atomic({text!r}): data must be bytes, got {type(data).__name__}")
    file_store(text, azure_credentials).write_atomic(text, bytes(data))


def read_bytes(uri: str | os.PathLike, azure_credentials=None) -> bytes:
    """The whole content of one file."""
    text = os.fspath(uri)
    return file_store(text, azure_credentials).read(text)


def exists(uri: str | os.PathLike, azure_credentials=None) -> bool:
    """True when `uri` is an existing file or directory (for Azure: a blob, or a prefix with blobs under it)."""
    text = os.fspath(uri)
    return file_store(text, azure_credentials).exists(text)


def list_files(uri: str | os.PathLike, extensions: Iterable[str] | str | None = None,
               azure_credentials=None) -> list[str]:
    """Sorted URIs of the files under `uri` (recursive) whose extension is in `extensions` (case-insensitive).

    Hidden files and directories (names starting with '.' or '_') are skipped, as Spark does. URIs keep the style
    of `uri` (plain path in, plain paths out; `file:` in, `file://` out). A file `uri` lists itself.
    """
    text = os.fspath(uri)
    return file_store(text, azure_credentials).list(text, normalize_extensions(extensions))


class LocalFiles:
    def write_atomic(self, uri: str, data: bytes) -> None:
        _write_local_atomic(Path(to_local_path(uri)), data)

    def read(self, uri: str) -> bytes:
        return Path(to_local_path(uri)).read_bytes()

    def exists(self, uri: str) -> bool:
        return os.path.exists(to_local_path(uri))

    def list(self, uri: str, wanted: tuple[str, ...] | None) -> list[str]:
        return _list_local(uri, wanted)


class AzureFiles:
    def __init__(self, azure_credentials=None):
        self.credentials = azure_credentials

    def write_atomic(self, uri: str, data: bytes) -> None:
        from pipelines.io.azure_storage import write_blob

        write_blob(uri, data, self.credentials)

    def read(self, uri: str) -> bytes:
        from pipelines.io.azure_storage import read_blob

        return read_blob(uri, self.credentials)

    def exists(self, uri: str) -> bool:
        from pipelines.io.azure_storage import blob_exists

        return blob_exists(uri, self.credentials)

    def list(self, uri: str, wanted: tuple[str, ...] | None) -> list[str]:
        from pipelines.io.azure_storage import list_blobs, parse_blob_uri

        root = parse_blob_uri(uri).path.rstrip("/")
        found = []
        for blob in list_blobs(uri, wanted, self.credentials):
            name = parse_blob_uri(blob.uri).path
            if not is_hidden(name[len(root):] if name != root else name.rpartition("/")[2]):
                found.append(blob.uri)
        return sorted(found)


class FsspecFiles:
    def write_atomic(self, uri: str, data: bytes) -> None:
        fs, path = _fsspec(uri)
        parent, _, name = path.rstrip("/").rpartition("/")
        temp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"
        fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(temp, data)
        try:
            fs.mv(temp, path)
        except BaseException:
            fs.rm(temp)
            raise

    def read(self, uri: str) -> bytes:
        fs, path = _fsspec(uri)
        return fs.cat_file(path)

    def exists(self, uri: str) -> bool:
        fs, path = _fsspec(uri)
        return fs.exists(path)

    def list(self, uri: str, wanted: tuple[str, ...] | None) -> list[str]:
        fs, path = _fsspec(uri)
        root = path.rstrip("/")
        if fs.isfile(root):
            candidates = [root]
        else:
            candidates = [found for found in fs.find(root) if not is_hidden(found[len(root):])]
        return sorted(fs.unstrip_protocol(found) for found in candidates if has_extension(found, wanted))


def _list_local(text: str, wanted: tuple[str, ...] | None) -> list[str]:
    root = Path(to_local_path(text)).absolute()
    as_uri = scheme_of(text) == "file"
    if not root.exists():
        raise FileNotFoundError(f"list_files: {text!r} does not exist")
    if root.is_file():
        paths = [root] if has_extension(root.name, wanted) else []
    else:
        paths = []
        for directory, subdirs, files in os.walk(root):
            subdirs[:] = sorted(name for name in subdirs if not is_hidden(name))
            paths.extend(Path(directory) / name for name in files
                         if not is_hidden(name) and has_extension(name, wanted))
    return sorted(("file://" + str(path)) if as_uri else str(path) for path in paths)


def _write_local_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as temp:
            temp.write(data)
            temp.flush()
            os.fsync(temp.fileno())
        os.chmod(temp_name, 0o666 & ~_umask())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    _fsync_dir(path.parent)


def _umask() -> int:
    # os.umask can only be read by setting it; /proc has it without a race.
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    return 0o022


def _fsync_dir(directory: Path) -> None:
    """Make the rename durable (POSIX); a no-op where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsspec(uri: str):
    import fsspec

    try:
        return fsspec.core.url_to_fs(uri)
    except (ImportError, ValueError) as exc:
        raise UsageError(f"cannot open {uri!r} with fsspec ({exc}); install the fsspec backend for "
                         f"{scheme_of(uri)}:// or use a local path, az:// or abfss://") from None
