"""Driver- and executor-side I/O of single files and listings that do not go through Spark (summaries, locks, table
indexes, masks, manifests). One `FileStore` per store kind (local, Azure SDK, fsspec), chosen by `file_store(uri)` from
the routing rule in `pipelines.io.uris` (which also holds the URI helpers re-exported here).

A `Location` is a URI with the credentials that open it: the job makes one for its output and passes that, never a
URI and its credentials apart; the stores it opens are shared by every Location derived from it (`output /
"detections"`), once per process (a Location pickled to an executor opens its own there).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from pipelines.errors import UsageError
from pipelines.io.azure_credentials import AzureCredentials, account_name_from_env, parse_blob_uri
from pipelines.io.azure_storage import AzureBlobStore
from pipelines.io.uris import (
    has_extension,
    is_azure,
    is_hidden,
    join_uri,
    normalize_extensions,
    scheme_of,
    store_of,
    to_local_path,
)

# fsspec schemes whose Hadoop (Spark) spelling differs.
_SPARK_SCHEMES = {"s3": "s3a"}
# Characters with a meaning in Hadoop glob patterns (FileSystem.globStatus): escaped by a backslash.
_HADOOP_GLOB_CHARACTERS = re.compile(r"([\\*?\[\]{}])")


def to_spark_uri(uri: str | os.PathLike, account: str | None = None) -> str:
    """The spelling of `uri` that Spark's (Hadoop's) file systems read.

    Plain paths and `file:` URIs -> `file:/absolute/path` (user and symlinks resolved, so that one directory has one
    spelling however it was given; Hadoop's spelling, not a URI: Spark reads `file:/a b` as the directory "a b" and
    `file:///a%20b` as "a%20b"); `az://container/p` ->
    `abfss://container@<account>.dfs.core.windows.net/p` (`account` or the environment's AZURE_STORAGE_ACCOUNT_NAME /
    connection string AccountName); `s3://` -> `s3a://`; everything else unchanged. abfss:// needs the hadoop-azure
    jar on the cluster; without it, read with `pipelines.io.azure_storage` instead.
    """
    text = os.fspath(uri)
    scheme = scheme_of(text)
    if scheme in ("", "file"):
        return f"file:{Path(to_local_path(text)).expanduser().resolve()}"
    if scheme == "az":
        path = parse_blob_uri(text)
        account = account or account_name_from_env()
        if not account:
            raise UsageError(
                f"{text!r}: az:// URIs carry no storage account; pass account=..., set "
                "AZURE_STORAGE_ACCOUNT_NAME, or write abfss://container@account.dfs.core.windows.net/path"
            )
        return f"abfss://{path.container}@{account}.dfs.core.windows.net/{path.path}"
    if scheme in _SPARK_SCHEMES:
        return _SPARK_SCHEMES[scheme] + text[len(scheme) :]
    return text


def spark_read_path(uri: str | os.PathLike, account: str | None = None) -> str:
    """`to_spark_uri(uri)` for a Spark file reader (``spark.read...load/parquet``), which expands every path it is
    given as a Hadoop glob: `photo [1].jpg` would mean "photo 1.jpg" (and "does not exist"), `a{b,c}` two names. The
    glob characters (``* ? [ ] { } \\``) are escaped, so the path names only itself; the rows read carry the real
    paths."""
    return _HADOOP_GLOB_CHARACTERS.sub(r"\\\1", to_spark_uri(uri, account))


class FileStore(Protocol):
    """What every store does with one file or one directory tree."""

    def write_atomic(self, uri: str, data: bytes, durable: bool = True) -> None: ...
    def read(self, uri: str) -> bytes: ...
    def exists(self, uri: str) -> bool: ...
    def list(self, uri: str, wanted: tuple[str, ...] | None) -> list[str]: ...
    def remove_temp_files(self, directory_uri: str, names: set[str]) -> int: ...
    def remove_tree(self, uri: str) -> None: ...


def file_store(uri: str, azure_credentials=None) -> FileStore:
    """The store for single-file I/O on `uri`: local files, the Azure SDK (every Azure spelling: no fsspec backend
    for Azure is installed), else fsspec."""
    kind = _store_kind(uri)
    return LocalFiles() if kind == "local" else AzureFiles(azure_credentials) if kind == "azure" else FsspecFiles()


def _store_kind(uri: str) -> str:
    return "local" if store_of(uri) == "local" else "azure" if is_azure(uri) else "fsspec"


class _OpenStores:
    """The FileStores a Location and the Locations derived from it have opened, by kind; not pickled (SDK clients
    are made where they are used)."""

    def __init__(self) -> None:
        self.by_kind: dict[str, FileStore] = {}

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self.by_kind = {}


@dataclass(frozen=True)
class Location:
    """A file or directory URI and the credentials that open it (Azure; None: the environment's)."""

    uri: str
    credentials: AzureCredentials | None = field(default=None, repr=False)
    _stores: _OpenStores = field(default_factory=_OpenStores, repr=False, compare=False)

    @classmethod
    def of(cls, where: Location | str | os.PathLike) -> Location:
        """`where` as a Location: a URI or path gets the environment's credentials."""
        return where if isinstance(where, Location) else cls(os.fspath(where))

    def __truediv__(self, name: str) -> Location:
        """The location of `name` under this one, sharing its credentials and open stores."""
        return self.sibling(join_uri(self.uri, name))

    def sibling(self, uri: str) -> Location:
        """Another URI (e.g. one this location listed) opened with this location's credentials and stores."""
        return Location(uri, self.credentials, self._stores)

    @property
    def store(self) -> FileStore:
        kind = _store_kind(self.uri)
        if kind not in self._stores.by_kind:
            self._stores.by_kind[kind] = file_store(self.uri, self.credentials)
        return self._stores.by_kind[kind]

    def write_bytes_atomic(self, data: bytes, durable: bool = True) -> None:
        """Write `data` so that readers see the old file or the whole new one, never a part.

        Local: temp file in the same directory, fsync, os.replace, fsync of the directory (`durable=False`: no
        fsyncs: the file outlives a crashed process, not a crashed machine). Azure: one blob upload (atomic on
        commit). Other schemes: fsspec write to a hidden temp name, then mv. Parent directories are created.
        """
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"write_bytes_atomic({self.uri!r}): data must be bytes, got {type(data).__name__}")
        self.store.write_atomic(self.uri, bytes(data), durable)

    def read_bytes(self) -> bytes:
        """The whole content of one file."""
        return self.store.read(self.uri)

    def exists(self) -> bool:
        """True for an existing file or directory (for Azure: a blob, or a prefix with blobs under it)."""
        return self.store.exists(self.uri)

    def remove_temp_files(self, names: Iterable[str]) -> int:
        """In this directory, remove the temp files that write_bytes_atomic calls for the files `names` left when
        their process was killed between the temp file and the rename (a retried task calls it for what it
        rewrote); one listing of the directory. Returns how many were removed."""
        return self.store.remove_temp_files(self.uri, set(names))

    def remove_tree(self) -> None:
        """Remove this directory and everything under it, hidden files included; nothing when it does not exist."""
        self.store.remove_tree(self.uri)

    def list_files(self, extensions: Iterable[str] | str | None = None) -> list[str]:
        """Sorted URIs of the files under this location (recursive) whose extension is in `extensions`
        (case-insensitive). Hidden files and directories (names starting with '.' or '_') are skipped, as Spark
        does. URIs keep the style of `uri` (plain path in, plain paths out; `file:` in, `file://` out). A file lists
        itself."""
        return self.store.list(self.uri, normalize_extensions(extensions))


# One-call shortcuts for a URI opened with the environment's credentials (Location.of(uri).<method>).


def write_bytes_atomic(uri: str | os.PathLike, data: bytes) -> None:
    Location.of(uri).write_bytes_atomic(data)


def read_bytes(uri: str | os.PathLike) -> bytes:
    return Location.of(uri).read_bytes()


def exists(uri: str | os.PathLike) -> bool:
    return Location.of(uri).exists()


def list_files(uri: str | os.PathLike, extensions: Iterable[str] | str | None = None) -> list[str]:
    return Location.of(uri).list_files(extensions)


class LocalFiles:
    def write_atomic(self, uri: str, data: bytes, durable: bool = True) -> None:
        _write_local_atomic(Path(to_local_path(uri)), data, durable)

    def read(self, uri: str) -> bytes:
        return Path(to_local_path(uri)).read_bytes()

    def exists(self, uri: str) -> bool:
        return os.path.exists(to_local_path(uri))

    def list(self, uri: str, wanted: tuple[str, ...] | None) -> list[str]:
        return _list_local(uri, wanted)

    def remove_temp_files(self, directory_uri: str, names: set[str]) -> int:
        directory = to_local_path(directory_uri)
        with os.scandir(directory) as entries:
            stale = [entry.path for entry in entries if temp_file_target(entry.name) in names]
        for path in stale:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        return len(stale)

    def remove_tree(self, uri: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            shutil.rmtree(to_local_path(uri))


class AzureFiles:
    """Files as blobs, through one AzureBlobStore (its SDK clients made at the first call, one per account)."""

    def __init__(self, azure_credentials: AzureCredentials | None = None):
        self.blobs = AzureBlobStore(azure_credentials)

    def write_atomic(self, uri: str, data: bytes, durable: bool = True) -> None:
        self.blobs.write(uri, data)

    def read(self, uri: str) -> bytes:
        return self.blobs.read(uri)

    def exists(self, uri: str) -> bool:
        return self.blobs.exists(uri)

    def list(self, uri: str, wanted: tuple[str, ...] | None) -> list[str]:
        root = parse_blob_uri(uri).path.rstrip("/")
        found = []
        for blob in self.blobs.list(uri, wanted):
            name = parse_blob_uri(blob.uri).path
            if not is_hidden(name[len(root) :] if name != root else name.rpartition("/")[2]):
                found.append(blob.uri)
        return sorted(found)

    def remove_temp_files(self, directory_uri: str, names: set[str]) -> int:
        return 0  # one blob upload per write: no temp files

    def remove_tree(self, uri: str) -> None:
        self.blobs.remove_tree(uri)


class FsspecFiles:
    def write_atomic(self, uri: str, data: bytes, durable: bool = True) -> None:
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

    def remove_temp_files(self, directory_uri: str, names: set[str]) -> int:
        fs, directory = _fsspec(directory_uri)
        stale = [
            path
            for path in fs.ls(directory.rstrip("/"), detail=False)
            if temp_file_target(path.rstrip("/").rpartition("/")[2]) in names
        ]
        for path in stale:
            fs.rm(path)
        return len(stale)

    def remove_tree(self, uri: str) -> None:
        fs, path = _fsspec(uri)
        if fs.exists(path):
            fs.rm(path, recursive=True)

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
            candidates = [found for found in fs.find(root) if not is_hidden(found[len(root) :])]
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
            paths.extend(
                Path(directory) / name for name in files if not is_hidden(name) and has_extension(name, wanted)
            )
    return sorted(("file://" + str(path)) if as_uri else str(path) for path in paths)


def temp_file_target(name: str) -> str | None:
    """The file name a write_bytes_atomic temp file named `name` was for (`.img.png.k3j_x9a2.tmp` -> `img.png`: a
    dot, the name, a dot, a random part without dots, `.tmp`), None for any other name."""
    if not (name.startswith(".") and name.endswith(".tmp")):
        return None
    target, _, random_part = name[1 : -len(".tmp")].rpartition(".")
    return target if target and random_part else None


def publish_once(staging: Path, target: Path) -> None:
    """Move the finished file `staging` to `target` unless a file is there already: the first of processes building
    the same content-keyed file at once wins, and a file at `target` never changes once there (a SparkContext
    that added it copies it again by path for its tasks, and fails them with "File ... exists" when the bytes
    changed; numba keys its cache by the file's time stamp). A hard link: atomic, and refused when `target`
    exists."""
    try:
        os.link(staging, target)
    except FileExistsError:
        pass
    finally:
        os.unlink(staging)


def _write_local_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as temp:
            temp.write(data)
            if durable:
                temp.flush()
                os.fsync(temp.fileno())
        os.chmod(temp_name, 0o666 & ~_umask())
        os.replace(temp_name, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp_name)
        raise
    if durable:
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
        raise UsageError(
            f"cannot open {uri!r} with fsspec ({exc}); install the fsspec backend for "
            f"{scheme_of(uri)}:// or use a local path, az:// or abfss://"
        ) from None
