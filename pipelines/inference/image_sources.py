"""List: the images of any storage as a DataFrame (spreading them over partitions: `partitions`; reading their
bytes: `image_content`).

Two readers share one contract, a DataFrame with `path`, `size`, `modification_time` (listing) and later `content`:
- `spark`: Spark's own binaryFile source, for every Hadoop URI the cluster can read (hdfs://, abfss:// and
  wasbs:// where hadoop-azure is installed). Listing reads no file content. Local `file:` inputs (a mount every
  executor sees) are listed by the executors instead (the driver walks small ones itself), the same rows
  (pipelines.io.local_listing), and read by path.
- `azure_sdk`: for clusters without hadoop-azure: executors list the container with the Azure SDK and read
  the bytes (credentials from the environment or a secret scope, shipped in the task closure, never logged).

Spark's file index lists on the driver and holds every file's status there (~1 KB per file: gigabytes of driver heap
at 10^7 files); the driver holds at most DRIVER_LISTING_MAX_FILES names of a local listing, none of an azure_sdk one.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

from pipelines.errors import UsageError
from pipelines.inference.image_content import extension_glob

# The job and the tests reach balancing and reading through this module (image_sources.balanced, .with_content, ...)
from pipelines.inference.image_content import local_file_path as local_file_path
from pipelines.inference.image_content import read_local_file as read_local_file
from pipelines.inference.image_content import reads_on_executors as reads_on_executors
from pipelines.inference.image_content import with_content as with_content
from pipelines.inference.partitions import assign_partitions as assign_partitions
from pipelines.inference.partitions import balanced as balanced
from pipelines.io.azure_credentials import parse_blob_uri
from pipelines.io.azure_storage import blob_exists, listing_part, listing_top
from pipelines.io.local_listing import listing_root, underscored_files, walk, walk_entry, walk_top
from pipelines.io.storage import spark_read_path, to_spark_uri
from pipelines.io.uris import (
    is_azure,
    is_local,
    normalize_extensions,
    store_of,
    to_local_path,
)
from pipelines.spark.java_errors import unreachable_storage
from pipelines.spark.session_kind import qualify_root, session_kind

LISTING_SCHEMA = T.StructType(
    [
        T.StructField("path", T.StringType(), False),
        T.StructField("size", T.LongType(), False),
        T.StructField("modification_time", T.TimestampType(), True),
    ]
)
DRIVER_LISTING_MAX_FILES = 10_000  # a local listing's names the driver may hold (local_files_listing)


class InputError(UsageError):
    pass


def missing_input(uri: str) -> InputError:
    """The error for an input that does not exist. Paths are read in Hadoop's spelling, never percent-decoded
    (`file:///a%20b` is the directory "a%20b"): where the decoded spelling of a local URI exists, say so."""
    message = f"{uri}: input path does not exist: check --input"
    decoded = unquote(uri)
    if decoded != uri and is_local(uri):
        try:
            found = os.path.exists(to_local_path(decoded))
        except UsageError:
            found = False
        if found:
            message += f" (paths are not percent-decoded: write '{decoded}')"
    if any(character in uri for character in "*?[{"):
        message += (
            " (wildcards are not expanded: every character of a path is literal; give the directory, and "
            "input.extensions for the kinds of files)"
        )
    return InputError(message)


def nothing_listed(
    uri: str, extensions: list[str], recursive: bool = True, output_prefix_: str | None = None, sample: int = 1000
) -> str:
    """Why a listing of `uri` found no input, for the run's log: the endings it lists, and for a local input the
    other files there (the first `sample` the walk meets), e.g. phone photos in HEIC that no ending matches."""
    message = (
        f"no file under {uri} ends with {', '.join(extensions)} (input.extensions and input.video.extensions, "
        "case-insensitive; names starting with '.' or '_' are skipped as hidden)"
    )
    if not is_local(uri):  # not to_spark_uri: an az:// URI's account may come from the job's credentials only
        return message

    root, skip = listing_root(to_spark_uri(uri)), walk_skip(output_prefix_)
    try:
        others = list(itertools.islice(walk(root, None, recursive, skip), sample))
    except OSError:
        return message
    hidden = underscored_note(uri, extensions, recursive, output_prefix_, sample)
    if hidden:
        message += f"; {hidden}"
    if others:
        endings = sorted({os.path.splitext(f.path)[1].lower() or "(none)" for f in others})
        more = "+" if len(others) == sample else ""
        message += (
            f"; it holds {len(others)}{more} other files, ending with {', '.join(endings[:10])}"
            f"{' ...' if len(endings) > 10 else ''}: add their ending to input.extensions where Pillow reads "
            "them, or convert them to JPEG or PNG"
        )
    return message


def underscored_note(
    uri: str, extensions: list[str], recursive: bool = True, output_prefix_: str | None = None, sample: int = 1000
) -> str | None:
    """For a local input: how many files with a listed ending the listing skipped only for a name starting with '_'
    (a camera's `_DSC0001.JPG`), what to do about them; None for none (or another store: not looked at)."""
    if not is_local(uri):
        return None

    root = listing_root(to_spark_uri(uri))
    try:
        hidden = list(
            itertools.islice(
                underscored_files(root, normalize_extensions(extensions), recursive, walk_skip(output_prefix_)), sample
            )
        )
    except OSError:
        return None
    if not hidden:
        return None
    more = "+" if len(hidden) == sample else ""
    files = "file with those endings is" if len(hidden) == 1 else "files with those endings are"
    return (
        f"{len(hidden)}{more} {files} skipped for a name starting with '_' (e.g. {os.path.basename(hidden[0])}; "
        "Spark and Hadoop skip these as hidden, and so does this job on every store): rename them without the "
        "leading '_' to process them"
    )


def choose_reader(uri: str, reader: str = "auto") -> str:
    if reader not in ("auto", "spark", "azure_sdk"):
        raise InputError(f"input.reader '{reader}': choose auto, spark or azure_sdk")
    if reader == "azure_sdk" and not is_azure(uri):
        raise InputError(
            f"{uri}: input.reader azure_sdk (--reader) reads Azure URIs (az://container/prefix, "
            "abfss://...) only: use auto or spark for this input"
        )
    if reader != "auto":
        return reader
    return "azure_sdk" if store_of(uri) == "azure_sdk" else "spark"


@dataclass(frozen=True)
class ImageListing:
    """The images found under a URI, not yet counted: `scanned`, DataFrame[path, size, modification_time] of every
    image with bytes, and for Spark's binaryFile source the DataFrame it came from (`source`), whose file index also
    holds the zero-byte files that Spark's scan silently skips (None: `scanned` is the whole listing, azure_sdk)."""

    scanned: DataFrame
    source: DataFrame | None = None
    excluded: str | None = None  # a path prefix whose files are no inputs (output_prefix)

    def indexed_files(self) -> int:
        """Files in the source's index, zero-byte ones included (a number from the JVM: no Spark job, no list)."""
        return session_kind(self.source.sparkSession).indexed_files(self.source) if self.source is not None else -1

    def complete(self) -> DataFrame:
        """The whole listing: `scanned` and the zero-byte files (size 0), which are inputs too (they end up in
        errors/). Costs a join of the index against the scan: see whole_listing for when it is needed."""
        if self.source is None:
            return self.scanned
        empty = empty_files(self.scanned.sparkSession, self.source, self.scanned)
        return self.scanned.unionByName(without_prefix(empty, self.excluded))

    def excluding(self, prefix: str | None) -> ImageListing:
        """This listing without the files whose path starts with `prefix` (None: all of it)."""
        return ImageListing(without_prefix(self.scanned, prefix), self.source, prefix)


def without_prefix(listing: DataFrame, prefix: str | None) -> DataFrame:
    return listing if prefix is None else listing.where(~F.col("path").startswith(F.lit(prefix)))


def output_is_input(output_uri: str) -> InputError:
    """The error for an --output that is the --input directory (in any spelling)."""
    return InputError(
        f"{output_uri}: --output is the --input directory, whose listing would take the job's label "
        "maps for images; give the output a directory of its own (one under the input is left out of "
        "its listing)"
    )


def output_prefix(spark: SparkSession, input_uri: str, output_uri: str) -> str | None:
    """The listing's spelling of the output's root + '/' when the output lies under the input (its files are the
    job's own results, not inputs: a second run would read its label maps as images), else None; an output that is
    the input is an InputError (output_is_input)."""
    store = store_of(input_uri)
    if store != store_of(output_uri):
        return None
    if store == "local":
        root, output = listing_root(to_spark_uri(input_uri)), listing_root(to_spark_uri(output_uri))
    elif store == "azure_sdk":  # az://c/p and abfs://c@account.dfs.../p are one place: compare in the input's spelling
        source, target = parse_blob_uri(input_uri), parse_blob_uri(output_uri)
        if (
            source.container != target.container
            or None not in (source.account, target.account)
            and source.account != target.account
        ):
            return None
        root, output = source.uri, source.uri_for(target.path)
    else:
        try:
            root, output = qualify_root(spark, to_spark_uri(input_uri)), qualify_root(spark, to_spark_uri(output_uri))
        except Exception:  # noqa: BLE001 - py4j: a scheme without a file system here; the listing will say so
            return None
    root, output = root.rstrip("/"), output.rstrip("/")
    if output == root:
        raise output_is_input(output_uri)
    if not output.startswith(root + "/"):
        return None
    return ("file:" if store == "local" else "") + output + "/"


def walk_skip(prefix: str | None) -> str | None:
    """The directory a local walk does not enter for an output prefix under the input (output_prefix), as the
    walk spells paths."""
    return prefix.removeprefix("file:").rstrip("/") if prefix else None


def find_images(
    spark: SparkSession,
    uri: str,
    extensions: list[str],
    recursive: bool = True,
    reader: str = "auto",
    azure_credentials=None,
    output_uri: str | None = None,
) -> ImageListing:
    """The images under `uri` (no content read), without those under `output_uri` where the output lies under the
    input (output_prefix); a missing path or an unreadable scheme is an InputError now."""
    prefix = output_prefix(spark, uri, output_uri) if output_uri else None
    if choose_reader(uri, reader) == "azure_sdk":
        found = ImageListing(blobs_listed_by_executors(spark, uri, extensions, azure_credentials))
    elif reads_on_executors(uri):  # the walk does not enter the output (its files are left out below all the same)
        found = ImageListing(local_files_listing(spark, uri, extensions, recursive, skip=walk_skip(prefix)))
    else:
        found = spark_file_index(spark, uri, extensions, recursive)
    return found.excluding(prefix)


def spark_file_index(spark: SparkSession, uri: str, extensions: list[str], recursive: bool = True) -> ImageListing:
    """The images under a Hadoop URI from Spark's binaryFile source (its file index lists on the driver)."""
    try:
        source = (
            spark.read.format("binaryFile")
            .option("recursiveFileLookup", str(bool(recursive)).lower())
            .option("pathGlobFilter", extension_glob(extensions))
            .load(spark_read_path(uri))
        )
        source.schema  # noqa: B018  (forces the path check now, on the driver)
    except Exception as err:  # AnalysisException, Py4JJavaError: both carry the reason in the message
        text = str(err).splitlines()[0]
        if "PATH_NOT_FOUND" in text or "does not exist" in text:
            raise missing_input(uri) from None
        if "ClassNotFoundException" in str(err) or "No FileSystem for scheme" in str(err):
            raise InputError(
                f"{uri}: this Spark cannot read this scheme (no Hadoop connector on the classpath, e.g. "
                "hadoop-azure for abfss://): install it on the cluster or use input.reader azure_sdk "
                "with an az://container/prefix URI"
            ) from None
        raise unreachable_storage(spark, uri, err) or err from None
    scanned = source.select("path", F.col("length").alias("size"), F.col("modificationTime").alias("modification_time"))
    return ImageListing(scanned, source)


def blobs_listed_by_executors(spark: SparkSession, uri: str, extensions: list[str], credentials) -> DataFrame:
    """DataFrame[path, size, modification_time] of the blobs under an Azure URI, listed by the executors: one task
    walks the top level (the blobs directly under it and its virtual directories), the entries are spread over the
    cluster and each task lists its directories, streaming. The driver checks the path and holds no name (a Python
    list of 10^7 blobs would be gigabytes there). Always recursive, as the Azure listing is."""

    if not blob_exists(uri, credentials):
        raise missing_input(uri)
    kind = session_kind(spark)
    return kind.fanned_out(
        uri,
        lambda top_uri: listing_top(top_uri, extensions, credentials),
        lambda entry: listing_part(entry, extensions, credentials),
        LISTING_SCHEMA,
        kind.default_parallelism(),
    )


def local_files_listing(
    spark: SparkSession,
    uri: str,
    extensions: list[str],
    recursive: bool,
    driver_max_files: int = DRIVER_LISTING_MAX_FILES,
    skip: str | None = None,
) -> DataFrame:
    """DataFrame[path, size, modification_time] of the files under a local `file:` input (pipelines.io.local_listing,
    Spark's rows). Up to `driver_max_files` files the driver walks them itself (no Spark job, no Python task: for a
    small input the executors' walk costs more than it saves); beyond that the executors
    list the input as blobs_listed_by_executors lists a container: one task walks the top level, the directories
    under it are dealt over the cluster and each task walks its own, streaming. The driver never holds more than
    `driver_max_files` names. `skip`: a directory under the input not walked (local_listing.walk_top)."""

    root = listing_root(to_spark_uri(uri))
    if not os.path.exists(root):
        raise missing_input(uri)
    wanted = normalize_extensions(extensions)
    walked = walk(root, wanted, recursive, skip)
    first = list(itertools.islice(walked, driver_max_files + 1))
    if len(first) <= driver_max_files:
        return small_listing_frame(spark, first)
    del first, walked
    kind = session_kind(spark)
    return kind.fanned_out(
        root,
        lambda top_root: walk_top(top_root, wanted, recursive, skip),
        lambda entry: walk_entry(entry, wanted, skip),
        LISTING_SCHEMA,
        kind.default_parallelism(),
    )


def small_listing_frame(spark: SparkSession, files: list[tuple]) -> DataFrame:
    """A listing the driver holds (path, size, modification time in UTC) as a local relation, through Arrow: a
    DataFrame of Python rows would be re-pickled by a Python task before its first use, while the first Python
    worker is still starting."""
    import pandas as pd

    frame = pd.DataFrame(files, columns=LISTING_SCHEMA.fieldNames()).astype(
        {"path": object, "size": "int64", "modification_time": "datetime64[ns, UTC]"}
    )
    return spark.createDataFrame(frame, LISTING_SCHEMA)


def list_images(
    spark: SparkSession,
    uri: str,
    extensions: list[str],
    recursive: bool = True,
    reader: str = "auto",
    azure_credentials=None,
) -> DataFrame:
    """DataFrame[path, size, modification_time] of the images under `uri` (no content read), zero-byte files
    included (size 0)."""
    return find_images(spark, uri, extensions, recursive, reader, azure_credentials).complete()


def whole_listing(
    found: ImageListing,
    count: Callable[[DataFrame], tuple[int, ...]],
    storage: StorageLevel = StorageLevel.MEMORY_AND_DISK,
) -> tuple[DataFrame, tuple[int, ...]]:
    """The whole listing, persisted, and `count` of it (a tuple whose first item is its rows), in one pass where no
    file is empty: the scan is counted first, and only when the file index holds more files than the scan found
    (zero-byte files) is the index joined against it and the result counted again. The join is a shuffle of every
    path twice (10^7 rows at a data lake's scale) that almost every run would make to find nothing."""
    listing = found.scanned.persist(storage)
    counts = count(listing)
    if found.source is None or counts[0] >= found.indexed_files():
        return listing, counts
    whole = found.complete().persist(storage)
    counts = count(whole)
    listing.unpersist()
    return whole, counts


def empty_files(spark: SparkSession, source: DataFrame, scanned: DataFrame) -> DataFrame:
    """Spark's file scan silently skips zero-byte files; the file index behind it still lists them. They are
    inputs too (they must end up in errors/), so add them back with size 0. The index gives URI strings
    (`file:///a/UPPER%20CASE.JPG`: spaces, %, # escaped); the scan's `path` is Hadoop's unescaped spelling
    (`file:/a/UPPER CASE.JPG`), the one every output uses: compare in that spelling (hadoop_path_column, the
    JVM-side twin of hadoop_path_string). On a classic session the index's file list stays in the JVM: no Python
    list of every input."""
    uris = session_kind(spark).input_files(source)  # one column, "value"
    paths = uris.select(hadoop_path_column(F.col("value")).alias("path"))
    # the index also lists `_metadata*` and `_common_metadata*` files, which the scan skips as hidden, as
    # uris.is_hidden does: they are no input of ours, empty or not
    paths = paths.where(~F.col("path").rlike("/[._][^/]*$"))
    return paths.join(scanned.select("path"), "path", "left_anti").select(
        "path", F.lit(0).cast("long").alias("size"), F.lit(None).cast("timestamp").alias("modification_time")
    )


def hadoop_path_column(uri):
    """hadoop_path_string as a Column expression: `file:///` -> `file:/`, then %XX decoded (url_decode would also
    turn '+' into a space, which a URI path keeps as '+': protect it first)."""
    fixed = F.regexp_replace(uri, "^file:///", "file:/")
    return F.url_decode(F.regexp_replace(fixed, "[+]", "%2B"))
