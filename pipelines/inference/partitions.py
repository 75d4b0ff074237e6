"""Balance: number the listed rows and spread them evenly over a wave's partitions, whatever the directory layout
and file sizes (Spark's own file splitting packs by bytes). All in the JVM: only one number per partition reaches
the driver."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.spark.hash_partitioning import partition_keys


def assign_partitions(
    listing: DataFrame,
    partitions: int,
    order: tuple[str, ...] = ("path",),
    rows_per_partition: dict[int, int] | None = None,
) -> DataFrame:
    """Add `idx` (dense, 0..n-1), `part` (idx mod partitions) and `part_key`, a value whose Spark hash lands in
    partition `part`, so that `balanced(df, partitions)` gives every partition the same number of images (+-1)
    whatever the directory layout and file sizes (Spark's own file splitting packs by bytes, and the paper's
    NNImageReader left everything in one task).

    idx follows `listing`'s partitions, and `order` within each (video segments: path, then segment_start; a video's
    segments are listed in one partition, so they get consecutive idx and land on consecutive partitions). All in the
    JVM, in two passes (the rows per partition, then the index): no Python serialization of the listing, and only one
    number per partition reaches the driver. Both passes must see the same partitions: persist an expensive
    `listing` first (run_waves does). `rows_per_partition` ({partition id: rows}, counted by the caller over the
    same partitions) saves the first pass."""
    local = listing.sortWithinPartitions(*order).select(
        "*",
        F.spark_partition_id().alias("_partition"),
        (F.monotonically_increasing_id() - F.shiftleft(F.spark_partition_id().cast("long"), 33)).alias("_row"),
    )
    counts = rows_per_partition if rows_per_partition is not None else row_counts(local.select("_partition"))
    offsets, total = [], 0
    for partition in range(max(counts, default=-1) + 1):
        offsets.append(total)
        total += counts.get(partition, 0)
    offset = F.element_at(
        F.array(*[F.lit(value) for value in offsets or [0]]).cast("array<bigint>"), F.col("_partition") + 1
    )
    with_idx = local.withColumn("idx", offset + F.col("_row")).drop("_partition", "_row")
    with_part = with_idx.withColumn("part", F.col("idx") % F.lit(partitions))
    # the key of each partition, found on the driver (hash_partitioning): no Spark job, no join
    keys = F.array(*[F.lit(key) for key in partition_keys(partitions)]).cast("array<bigint>")  # a long's hash
    return with_part.withColumn("part_key", F.element_at(keys, F.col("part").cast("int") + 1))


def row_counts(partition_ids: DataFrame) -> dict[int, int]:
    """{partition id: rows} of a one-column frame of spark_partition_id() values, in one task and no shuffle (the ids
    are evaluated below the coalesce, in the frame's own partitions)."""
    return dict(partition_ids.coalesce(1).groupBy(partition_ids.columns[0]).count().collect())


def balanced(df: DataFrame, partitions: int) -> DataFrame:
    """Repartition rows that carry `part_key` (from assign_partitions) into exactly `partitions` even partitions."""
    return df.repartition(partitions, "part_key")
