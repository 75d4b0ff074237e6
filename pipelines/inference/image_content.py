"""Read: the bytes of the listed images. Local `file:` inputs are read by the executors by path (read_local_file);
other Hadoop schemes get a `content` column from Spark's binaryFile source (with_content), one wave's paths at a
time."""

from __future__ import annotations

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines.io.storage import spark_read_path, to_spark_uri
from pipelines.ops.image_decode import NAME_NOT_UTF8, ImageDecodeError

BROADCAST_LISTING_MAX_ROWS = 1_000_000


def extension_glob(extensions: list[str]) -> str:
    """A case-insensitive Hadoop glob for file names: ['.jpg'] -> '*.{[jJ][pP][gG]}'."""

    def caseless(ext: str) -> str:
        return "".join(f"[{c.lower()}{c.upper()}]" if c.isalpha() else c for c in ext.lstrip("."))

    return "*.{" + ",".join(caseless(e) for e in extensions) + "}"


def reads_on_executors(uri: str) -> bool:
    """Whether the executors read this input's bytes themselves, by path (read_local_file): local `file:` inputs.
    Other Hadoop schemes get a `content` column from Spark's binaryFile source (with_content)."""
    return to_spark_uri(uri).startswith("file:")


def local_file_path(path: str) -> str:
    """The local file a listed `file:` path names. `path` is Hadoop's unescaped spelling, the listing's
    (`file:/a b/c%.jpg` is the file "/a b/c%.jpg"), so it is not URL-decoded."""
    local = path[len("file:") :] if path.startswith("file:") else path
    if local.startswith("//"):  # file:///a (an authority-less URI) is /a
        local = local[2:]
    return local


def read_local_file(path: str) -> bytes:
    """The bytes of a listed `file:` path, read where the task runs (see local_file_path). A name the listing could
    not spell (not UTF-8: its bytes show as U+FFFD) is the file's own error, not a read failure to retry."""
    try:
        with open(local_file_path(path), "rb") as handle:
            return handle.read()
    except FileNotFoundError:
        if "\ufffd" not in path:
            raise
        raise ImageDecodeError(
            path,
            NAME_NOT_UTF8,
            "its name is not valid UTF-8 (the bytes shown as U+FFFD), so no path names it",
            "rename it with a UTF-8 name (e.g. convmv -f latin1 -t utf-8 --notest)",
        ) from None


def with_content(
    spark: SparkSession,
    todo: DataFrame,
    todo_count: int,
    uri: str,
    extensions: list[str],
    recursive: bool,
    all_listed: bool,
) -> DataFrame:
    """Join the image bytes (`content`) read by Spark's binaryFile source onto `todo` (a subset of the listing),
    for inputs the executors cannot open by path themselves (hdfs://, abfss://, wasbs://: see reads_on_executors).

    Python workers have no handle on the JVM's Hadoop FileSystem, and pyarrow's HadoopFileSystem needs libhdfs and
    the Hadoop CLASSPATH on every executor, which clusters do not promise; a binaryFile scan of the whole input root
    joined on path would read every image's bytes once per wave. So a partial to-do (resume, waves) is read by
    binaryFile.load(<its paths>): the driver holds the paths of ONE wave (at most run.commit_every), never the
    whole input. Local `file:` inputs never come here: their bytes are read on the executors by path."""
    reader = spark.read.format("binaryFile")
    if all_listed:
        source = (
            reader.option("recursiveFileLookup", str(bool(recursive)).lower())
            .option("pathGlobFilter", extension_glob(extensions))
            .load(spark_read_path(uri))
        )
    else:
        source = reader.load([spark_read_path(row.path) for row in todo.select("path").toLocalIterator()])
    small = F.broadcast(todo) if todo_count <= BROADCAST_LISTING_MAX_ROWS else todo
    read = source.select("path", "content").join(small, "path")
    # zero-byte files are not in Spark's scan: they go on without content (and become "empty" error rows)
    return read.unionByName(todo.where("size = 0").withColumn("content", F.unhex(F.lit(""))))
