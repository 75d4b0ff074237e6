"""Where bytes live: URI helpers and driver/executor-side I/O that does not go through Spark.

Three kinds of location are understood:
- local: plain paths (`/data/x.jpg`, `data/x.jpg`) and `file:` URIs (`file:///data/x.jpg`, Spark's `file:/data/x.jpg`);
- Azure Blob / ADLS Gen2: `az://container/path`, `abfs[s]://container@account.dfs.core.windows.net/path`
  (`wasb[s]://` too), served by the Azure SDK in `pipelines.azure_storage` (credentials from the environment);
- anything else fsspec knows (`hdfs://`, `s3://`, `gs://`, `memory://`, ...), through fsspec.

Local paths follow Hadoop's convention: no percent-decoding (`file:/a b/x.jpg` is the file `/a b/x.jpg`), which is
what Spark puts in the `path` column of `binaryFile` reads.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from pathlib import Path
from typing import Iterable
from urllib.parse import urlsplit

AZURE_SCHEMES = ("az", "abfs", "abfss", "wasb", "wasbs")
# fsspec schemes whose Hadoop (Spark) spelling differs.
_SPARK_SCHEMES = {"s3": "s3a"}


def scheme_of(uri: str | os.PathLike) -> str:
    """Lower-case URI scheme, "" for a plain path (a Windows drive letter counts as a plain path)."""
    text = os.fspath(uri)
    scheme = urlsplit(text).scheme.lower()
    return "" if len(scheme) <= 1 else scheme


def is_local(uri: str | os.PathLike) -> bool:
    """True for plain paths and `file:` URIs."""
    return scheme_of(uri) in ("", "file")


def is_azure(uri: str | os.PathLike) -> bool:
    """True for `az://`, `abfs[s]://` and `wasb[s]://` URIs."""
    return scheme_of(uri) in AZURE_SCHEMES


def to_local_path(uri: str | os.PathLike) -> str:
    """The filesystem path of a local URI: `file:///a/b`, `file:/a/b`, `file://localhost/a/b` and `/a/b` -> `/a/b`."""
    text = os.fspath(uri)
    if scheme_of(text) == "":
        return text
    if scheme_of(text) != "file":
        raise ValueError(f"not a local path: {text!r}; only plain paths and file: URIs have a local path")
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise ValueError(f"file URI {text!r} names host {parts.netloc!r}; use file:///absolute/path")
    if not parts.path:
        raise ValueError(f"file URI {text!r} has no path; use file:///absolute/path")
    # urlsplit would cut the path at '?' or '#', which are legal in file names: take everything after the authority.
    rest = text[len("file:"):]
    if rest.startswith("//"):
        rest = rest[2 + len(parts.netloc):]
    return rest


def join_uri(base: str | os.PathLike, *parts: str) -> str:
    """`base` with `parts` appended by single slashes.

    join_uri("az://c/out/", "masks", "a.png") -> "az://c/out/masks/a.png".

    Plain local paths are joined the same way (`/` separators). A part may not be absolute or contain `..`.
    """
    text = os.fspath(base)
    if not text:
        raise ValueError("join_uri: base is empty; pass a directory path or URI")
    pieces = []
    for part in parts:
        part = os.fspath(part)
        if part.startswith("/") or scheme_of(part):
            raise ValueError(f"join_uri: part {part!r} is absolute; pass a relative name")
        if ".." in part.split("/"):
            raise ValueError(f"join_uri: part {part!r} contains '..'; pass a name below the base")
        pieces.extend(piece for piece in part.split("/") if piece)
    if not pieces:
        return text
    root = text.rstrip("/")
    if not root or root.endswith(":"):  # "/" or "memory://" or "file://"
        root = text if text.endswith("/") else text + "/"
        return root + "/".join(pieces)
    return root + "/" + "/".join(pieces)


def to_spark_uri(uri: str | os.PathLike, account: str | None = None) -> str:
    """The spelling of `uri` that Spark's (Hadoop's) file systems read.

    Plain paths -> `file:///absolute/path`; `az://container/p` -> `abfss://container@<account>.dfs.core.windows.net/p`
    (`account` or the environment's AZURE_STORAGE_ACCOUNT_NAME / connection string AccountName); `s3://` -> `s3a://`;
    everything else unchanged. abfss:// needs the hadoop-azure jar on the cluster; without it, read with
    `pipelines.azure_storage` instead.
    """
    text = os.fspath(uri)
    scheme = scheme_of(text)
    if scheme == "":
        return "file://" + os.path.abspath(text)
    if scheme == "file":
        return "file://" + to_local_path(text)
    if scheme == "az":
        from pipelines.azure_storage import account_name_from_env, parse_blob_uri

        path = parse_blob_uri(text)
        account = account or account_name_from_env()
        if not account:
            raise ValueError(f"{text!r}: az:// URIs carry no storage account; pass account=..., set "
                             "AZURE_STORAGE_ACCOUNT_NAME, or write abfss://container@account.dfs.core.windows.net/path")
        return f"abfss://{path.container}@{account}.dfs.core.windows.net/{path.path}"
    if scheme in _SPARK_SCHEMES:
        return _SPARK_SCHEMES[scheme] + text[len(scheme):]
    return text


def normalize_extensions(extensions: Iterable[str] | str | None) -> tuple[str, ...] | None:
    """("JPG", ".png") -> (".jpg", ".png"); None means every file."""
    if extensions is None:
        return None
    if isinstance(extensions, str):
        extensions = [extensions]
    normalized = tuple("." + ext.lower().lstrip(".") for ext in extensions if ext.strip("."))
    if not normalized:
        raise ValueError(f"extensions {extensions!r} is empty; pass e.g. ['.jpg', '.png'] or None for every file")
    return normalized


def has_extension(name: str, extensions: tuple[str, ...] | None) -> bool:
    """Case-insensitive suffix test; `extensions` as returned by normalize_extensions."""
    return extensions is None or name.lower().endswith(extensions)


def is_hidden(relative_path: str) -> bool:
    """True when any component starts with '.' or '_' (Spark/Hadoop skip these: `_SUCCESS`, `.part.tmp`)."""
    return any(part[:1] in (".", "_") for part in relative_path.split("/") if part)


def write_bytes_atomic(uri: str | os.PathLike, data: bytes, azure_credentials=None) -> None:
    """Write `data` so that readers see the old file or the whole new one, never a part.

    Local: temp file in the same directory, fsync, os.replace. Azure: one blob upload (atomic on commit), with
    `azure_credentials` or AzureCredentials.from_env(). Other schemes: fsspec write to a hidden temp name, then mv.
    Parent directories are created.
    """
    text = os.fspath(uri)
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise TypeError(f"write_bytes_atomic({text!r}): data must be bytes, got {type(data).__name__}")
    if is_local(text):
        _write_local_atomic(Path(to_local_path(text)), bytes(data))
    elif is_azure(text):
        from pipelines.azure_storage import write_blob

        write_blob(text, bytes(data), azure_credentials)
    else:
        fs, path = _fsspec(text)
        parent, _, name = path.rstrip("/").rpartition("/")
        temp = f"{parent}/.{name}.{uuid.uuid4().hex}.tmp"
        fs.makedirs(parent, exist_ok=True)
        fs.pipe_file(temp, bytes(data))
        try:
            fs.mv(temp, path)
        except BaseException:
            fs.rm(temp)
            raise


def read_bytes(uri: str | os.PathLike, azure_credentials=None) -> bytes:
    """The whole content of one file."""
    text = os.fspath(uri)
    if is_local(text):
        return Path(to_local_path(text)).read_bytes()
    if is_azure(text):
        from pipelines.azure_storage import read_blob

        return read_blob(text, azure_credentials)
    fs, path = _fsspec(text)
    return fs.cat_file(path)


def exists(uri: str | os.PathLike, azure_credentials=None) -> bool:
    """True when `uri` is an existing file or directory (for Azure: a blob, or a prefix with blobs under it)."""
    text = os.fspath(uri)
    if is_local(text):
        return os.path.exists(to_local_path(text))
    if is_azure(text):
        from pipelines.azure_storage import blob_exists

        return blob_exists(text, azure_credentials)
    fs, path = _fsspec(text)
    return fs.exists(path)


def list_files(uri: str | os.PathLike, extensions: Iterable[str] | str | None = None,
               azure_credentials=None) -> list[str]:
    """Sorted URIs of the files under `uri` (recursive) whose extension is in `extensions` (case-insensitive).

    Hidden files and directories (names starting with '.' or '_') are skipped, as Spark does. URIs keep the style
    of `uri` (plain path in, plain paths out; `file:` in, `file://` out). A file `uri` lists itself.
    """
    text = os.fspath(uri)
    wanted = normalize_extensions(extensions)
    if is_local(text):
        return _list_local(text, wanted)
    if is_azure(text):
        from pipelines.azure_storage import list_blobs, parse_blob_uri

        root = parse_blob_uri(text).path.rstrip("/")
        found = []
        for blob in list_blobs(text, wanted, azure_credentials):
            name = parse_blob_uri(blob.uri).path
            if not is_hidden(name[len(root):] if name != root else name.rpartition("/")[2]):
                found.append(blob.uri)
        return sorted(found)
    fs, path = _fsspec(text)
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
        raise ValueError(f"cannot open {uri!r} with fsspec ({exc}); install the fsspec backend for "
                         f"{scheme_of(uri)}:// or use a local path, az:// or abfss://") from None
