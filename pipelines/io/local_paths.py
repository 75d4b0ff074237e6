"""Local paths as the job spells them: what to read (`resolve_local`), where to write (`resolve_output`), and the
filesystem path a URI names (`local_path`); URIs of other stores pass through as they are."""

from __future__ import annotations

from pathlib import Path

from pipelines.io.uris import is_local, scheme_of, to_local_path

# the checkout when running from one (samples/, conf/, jobs/ beside pipelines/)
REPO_ROOT = Path(__file__).resolve().parents[2]


def resolve_local(uri: str) -> str:
    """Something to read (an input, a model): a plain relative path is relative to the working directory, or else,
    where only there it exists, to the checkout this package runs from (so the embedded default's samples/ work from
    anywhere); a `file:` URI as its absolute path, symlinks resolved, as plain paths are (one spelling of a local
    directory however it was given); other URIs (`hdfs:/a`, `az://c/a`) as they are."""
    if scheme_of(uri):
        return resolve_output(uri)  # a file: URI names one place, whatever the working directory
    path = Path(uri).expanduser()
    if path.is_absolute() or (Path.cwd() / path).exists() or not (REPO_ROOT / path).exists():
        return str(path.resolve())
    return str((REPO_ROOT / path).resolve())


def resolve_output(uri: str) -> str:
    """Somewhere to write: a local output (a plain path, relative to the working directory, or a `file:` URI) as its
    absolute path, symlinks resolved, so that the paths the job writes (mask_path) have one spelling however the
    output was given; other URIs as they are."""
    return str(Path(to_local_path(uri)).expanduser().resolve()) if is_local(uri) else uri


def local_path(uri: str) -> Path | None:
    """The local filesystem path a URI names (plain paths, and file: URIs in Hadoop's spelling, as the job reads
    them: `file:/a b` is "/a b", `file:///a%20b` is "/a%20b", see storage.to_spark_uri), or None for other schemes."""
    if not is_local(uri):
        return None
    return Path(to_local_path(uri)).expanduser()
