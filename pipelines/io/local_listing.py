"""Executor side: the files under a local (or mounted) directory as Spark's binaryFile source lists them for a
`file:` input, streamed, so that no process holds the whole listing (image_sources.local_files_listing
spreads the walk over the cluster beyond a bound of names on the driver).

Same rows as Spark's file index (tested side by side): paths in Hadoop's spelling (`file:/a b/c%.jpg`, the root as
given, symlinks under it not resolved), names and directories starting with '.' or '_' skipped (`uris.is_hidden`),
the extension filter case-insensitive, symlinks followed (a directory symlink that leads back into its own
ancestors is not walked twice; Spark would loop), broken symlinks and non-regular files skipped, sizes in bytes and
modification times to the millisecond, as Hadoop's local file system gives them. Zero-byte files are listed with
their size, 0 (Spark's scan skips them: its listing needs them added back from its index). Not recursive: the files
directly under the root only (Spark refuses a tree with subdirectories then).
"""

from __future__ import annotations

import datetime as dt
import itertools
import os
import stat
from collections.abc import Iterator
from typing import NamedTuple

from pipelines.io.uris import has_extension, is_hidden, to_local_path

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)


class ListedFile(NamedTuple):
    path: str  # Hadoop's spelling: "file:" + the absolute path, not percent-encoded
    size: int  # bytes
    modification_time: dt.datetime  # UTC, milliseconds


def listing_root(spark_uri: str) -> str:
    """The local directory (or file) a `file:` URI names, normalized as Hadoop's Path is (no trailing or double
    slashes, '.' and '..' segments removed)."""
    return os.path.normpath(to_local_path(spark_uri))


def walk_top(
    root: str, extensions: tuple[str, ...] | None, recursive: bool, skip: str | None = None
) -> Iterator[ListedFile | str]:
    """The top level of the listing: `root` itself when it is a file, the wanted files directly under it, and
    (recursive) the paths of its subdirectories, each of which `walk_entry` completes: they can be walked in
    parallel. `skip`: a directory (spelled as the walk spells paths: `root` and the names under it) not walked,
    e.g. the job's output under its input."""
    if not os.path.isdir(root):
        found = _listed(root, extensions)
        if found is not None:
            yield found
        return
    for child in _children(root, extensions, skip):
        if isinstance(child, ListedFile) or recursive:
            yield child


def walk(
    root: str, extensions: tuple[str, ...] | None, recursive: bool, skip: str | None = None
) -> Iterator[ListedFile]:
    """Every wanted file under `root` in this process: walk_top, each of its entries completed by walk_entry."""
    return itertools.chain.from_iterable(
        walk_entry(entry, extensions, skip) for entry in walk_top(root, extensions, recursive, skip)
    )


def walk_entry(
    entry: ListedFile | str, extensions: tuple[str, ...] | None, skip: str | None = None
) -> Iterator[ListedFile]:
    """An entry of `walk_top` as files: a file as itself, a directory as every wanted file under it (but `skip`),
    depth first."""
    if isinstance(entry, ListedFile):
        yield entry
        return
    pending = [entry]
    while pending:
        directory = pending.pop()
        subdirectories = []
        for child in _children(directory, extensions, skip):
            if isinstance(child, ListedFile):
                yield child
            else:
                subdirectories.append(child)
        pending.extend(subdirectories)


def underscored_files(
    root: str, extensions: tuple[str, ...] | None, recursive: bool, skip: str | None = None
) -> Iterator[str]:
    """The wanted files the walk skips only for their name starting with '_' (Hadoop's hidden files, and cameras'
    Adobe RGB photos: `_DSC0001.JPG`), in the directories the walk enters, streamed in its order. For the message
    of a run that lists nothing; names starting with '.' (hidden everywhere, macOS's `._` metadata) are not these."""
    if not os.path.isdir(root):
        return
    pending = [root]
    while pending:
        directory = pending.pop()
        for entry in _entries(directory, hidden=True):
            if entry.name.startswith("_") and has_extension(entry.name, extensions) and not entry.is_dir():
                yield entry.path
        if recursive:
            pending.extend(child for child in _children(directory, (), skip) if isinstance(child, str))


def _children(
    directory: str, extensions: tuple[str, ...] | None, skip: str | None = None
) -> Iterator[ListedFile | str]:
    """The wanted files directly under `directory` and the paths of its subdirectories (`skip`, and a directory
    symlink that leads back into its own ancestors left out), in the file system's order."""
    for entry in _entries(directory):
        if entry.is_dir():
            if entry.path != skip and not (entry.is_symlink() and _leads_back(entry.path)):
                yield entry.path
        else:
            found = _listed(entry.path, extensions)
            if found is not None:
                yield found


def _entries(directory: str, hidden: bool = False) -> Iterator[os.DirEntry]:
    """The directory's entries that are not hidden (hidden: those that are), streamed in the file system's order (a
    flat directory of millions of files is never held). A directory that cannot be read fails the listing, naming
    it: its images could not be accounted for."""
    try:
        entries = os.scandir(directory)
    except OSError as err:
        raise OSError(
            f"{directory}: cannot list this input directory ({err.strerror or err}); make it readable "
            "to the executors or move it out of the input"
        ) from None
    with entries:
        for entry in entries:
            if is_hidden(entry.name) == hidden:
                yield entry


def _listed(path: str, extensions: tuple[str, ...] | None) -> ListedFile | None:
    """The file at `path` (symlinks followed) when it is a wanted regular file, else None."""
    if not has_extension(os.path.basename(path), extensions):
        return None
    try:
        info = os.stat(path)
    except OSError:  # a broken symlink, or a file removed while listing: not a file, as for Hadoop
        return None
    if not stat.S_ISREG(info.st_mode):
        return None
    modified = _EPOCH + dt.timedelta(milliseconds=info.st_mtime_ns // 1_000_000)
    # a name that is not UTF-8 (Python keeps its bytes as surrogates, which no Spark string holds) is spelled with
    # U+FFFD for them, as Hadoop's listing spells it: reading that path fails, naming the file (read_local_file)
    return ListedFile("file:" + os.fsencode(path).decode("utf-8", "replace"), info.st_size, modified)


def _leads_back(link: str) -> bool:
    """Whether the directory symlink `link` resolves to one of its own ancestors (walking it would never end)."""
    target = os.path.realpath(link)
    parent = os.path.realpath(os.path.dirname(link))
    return parent == target or parent.startswith(target.rstrip("/") + "/")
