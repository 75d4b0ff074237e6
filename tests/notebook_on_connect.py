"""Run a Databricks notebook source file cell by cell on a Spark Connect session, in a process of its own, as a
serverless or standard access mode notebook runs: the process holds no classic session (pyspark refuses a remote
session beside one, and once a remote session exists its functions take the Connect path for the whole process),
so tests start this as a subprocess.

    python -m tests.notebook_on_connect SPEC.json
    SPEC: {"remote": "sc://host:port", "notebook": PATH, "parameters": {...}, "secrets": [[scope, key, value], ...]}

Prints the value given to dbutils.notebook.exit; an exception in a cell ends it with its traceback (exit 1).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from tests.dbutils_standin import DbutilsStandIn, run_notebook_source


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    spark = SparkSession.builder.remote(spec["remote"]).getOrCreate()
    try:
        if not type(spark).__module__.startswith("pyspark.sql.connect"):
            raise SystemExit(f"not a Spark Connect session: {type(spark)}")
        dbutils = DbutilsStandIn(spec["parameters"], {(scope, key): value for scope, key, value in spec["secrets"]})
        result = run_notebook_source(spec["notebook"], spark=spark, dbutils=dbutils)
    finally:
        spark.stop()
    print(result)


if __name__ == "__main__":
    main(sys.argv[1])
