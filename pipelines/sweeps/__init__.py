"""Parameter sweeps over the inference job and the measurements they share with `make bench`: driver-side tools for
developers and benchmarks, never shipped to executors (pipelines.spark.spark_session.ship_library leaves them out).

- `standalone_cluster`: a local Spark standalone cluster (master + workers from the pyspark wheel) for tests, demos,
  sweeps and fault drills.

- `config`: the sweep YAML (conf/sweep.yaml) -> `SweepConfig`, and its grid -> `GridPoint`s.
- `cluster_process`: a standalone cluster run by a given Python env (`python -m pipelines.sweeps.standalone_cluster`).
- `process_memory`: peak RSS / PSS of a process tree (driver, driver JVM, executor JVMs, Python workers).
- `event_log`: task counts, failures, retries, per-executor busy time and partition sizes from a Spark event log.
- `point_run`: one grid point = one driver subprocess running `jobs/infer_yolact.py`, measured -> a CSV row.
- `sweep`: every point, one cluster per cluster shape -> rows.
- `report`: rows -> CSV, Markdown report and PNG plots.
"""
