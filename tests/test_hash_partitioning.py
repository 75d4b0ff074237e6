"""The driver's copy of Spark's hash partitioning (pipelines.spark.hash_partitioning) agrees with Spark's own."""

import random

from pyspark.sql import functions as F

from pipelines.spark.hash_partitioning import partition_keys, spark_hash_long


def test_spark_hash_long_equals_spark_hash(spark):
    rng = random.Random(0)
    values = [0, 1, -1, 42, 2**31 - 1, 2**31, -(2**31), 2**32, 2**63 - 1, -(2**63)]
    values += [rng.randrange(-(2**63), 2**63) for _ in range(500)] + list(range(1000))
    rows = spark.createDataFrame([(v,) for v in values], "v long").select("v", F.hash("v").alias("h")).collect()
    assert [row.h for row in rows] == [spark_hash_long(row.v) for row in rows]


def test_partition_keys_land_in_their_partitions(spark):
    for partitions in (1, 2, 7, 64):
        keys = partition_keys(partitions)
        frame = spark.createDataFrame([(k,) for k in keys], "k long").repartition(partitions, "k")
        landed = frame.select(F.spark_partition_id().alias("p"), "k").collect()
        assert sorted((row.p, row.k) for row in landed) == list(enumerate(keys))
