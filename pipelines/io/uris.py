"""URIs: which store serves a location, and how each layer spells it. Pure string functions, no I/O, no imports
of other sparkseg modules but pipelines.errors (every other module may import this one).

Three stores:
- local: plain paths (`/data/x.jpg`, `data/x.jpg`) and `file:` URIs (`file:///data/x.jpg`, Spark's `file:/data/x.jpg`);
- azure_sdk: `az://container/path` and `abfs://container@account.dfs.core.windows.net/path`, read and written with
  the Azure SDK (pipelines.io.azure_storage; no Hadoop jar needed);
- hadoop: everything else (`hdfs://`, `abfss://`, `wasb[s]://`, `s3://`, `gs://`, ...): Spark's Hadoop file systems
  for tables and listings; single small files (summary, lock, masks) through fsspec, or the Azure SDK for the
  Azure schemes (no fsspec Azure backend is installed).

Local paths follow Hadoop's convention: no percent-decoding (`file:/a b/x.jpg` is the file `/a b/x.jpg`), which is
what Spark puts in the `path` column of `binaryFile` reads.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Literal
from urllib.parse import unquote, urlsplit

from pipelines.errors import UsageError

Store = Literal["local", "azure_sdk", "hadoop"]

AZURE_SCHEMES = ("az", "abfs", "abfss", "wasb", "wasbs")  # every Azure Blob / ADLS Gen2 spelling
AZURE_SDK_SCHEMES = ("az", "abfs")  # the ones sparkseg serves with the Azure SDK


def scheme_of(uri: str | os.PathLike) -> str:
    """Lower-case URI scheme, "" for a plain path (a Windows drive letter counts as a plain path)."""
    scheme = urlsplit(os.fspath(uri)).scheme.lower()
    return "" if len(scheme) <= 1 else scheme


def store_of(uri: str | os.PathLike) -> Store:
    """The one routing rule: which store serves `uri` (see the module docstring)."""
    scheme = scheme_of(uri)
    if scheme in ("", "file"):
        return "local"
    if scheme in AZURE_SDK_SCHEMES:
        return "azure_sdk"
    return "hadoop"


def is_local(uri: str | os.PathLike) -> bool:
    """True for plain paths and `file:` URIs."""
    return store_of(uri) == "local"


def is_azure(uri: str | os.PathLike) -> bool:
    """True for every Azure spelling: `az://`, `abfs[s]://`, `wasb[s]://`."""
    return scheme_of(uri) in AZURE_SCHEMES


def to_local_path(uri: str | os.PathLike) -> str:
    """The filesystem path of a local URI: `file:///a/b`, `file:/a/b`, `file://localhost/a/b` and `/a/b` -> `/a/b`."""
    text = os.fspath(uri)
    if scheme_of(text) == "":
        return text
    if scheme_of(text) != "file":
        raise UsageError(f"not a local path: {text!r}; only plain paths and file: URIs have a local path")
    parts = urlsplit(text)
    if parts.netloc not in ("", "localhost"):
        raise UsageError(f"file URI {text!r} names host {parts.netloc!r}; use file:///absolute/path")
    if not parts.path:
        raise UsageError(f"file URI {text!r} has no path; use file:///absolute/path")
    # urlsplit would cut the path at '?' or '#', which are legal in file names: take everything after the authority.
    rest = text[len("file:") :]
    if rest.startswith("//"):
        rest = rest[2 + len(parts.netloc) :]
    return rest


def join_uri(base: str | os.PathLike, *parts: str) -> str:
    """`base` with `parts` appended by single slashes.

    join_uri("az://c/out/", "masks", "a.png") -> "az://c/out/masks/a.png".

    Plain local paths are joined the same way (`/` separators). A part may not be absolute or contain `..`.
    """
    text = os.fspath(base)
    if not text:
        raise ValueError("join_uri: base is empty; pass a directory path or URI")
    pieces: list[str] = []
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


def hadoop_path_string(uri: str) -> str:
    """A file index URI (java.net.URI.toString: `file:///d/a%20b%25.jpg`) as Hadoop's Path.toString spells it, which
    is the `path` column of Spark's file sources (`file:/d/a b%.jpg`)."""
    return unquote(uri.replace("file:///", "file:/", 1))


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
