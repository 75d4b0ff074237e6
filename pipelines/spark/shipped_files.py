"""Executor side of the session kinds' ship_archive (pipelines.spark.session_kind): where a shipped archive is.
A module of its own: executor tasks import it, and they import no pyspark.sql."""

from __future__ import annotations


def shipped_path(name: str) -> str:
    """Where a file or archive shipped by ship_archive is on this executor (an archive: the directory it unpacked
    to; a Spark Connect session's artifacts live in the session's own directory, which SparkFiles resolves too)."""
    from pyspark import SparkFiles

    return SparkFiles.get(name)
