"""Run every grid point of a SweepConfig and write the CSV, report and plots.

Standalone mode: one cluster per cluster shape (engine env, executors, executor cores), started before that
shape's first point and stopped after its last; each point is its own application (fresh SparkContext, fresh
executors and Python workers) on it. Local mode: master local[executor_cores].
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable
from pathlib import Path

from pipelines.sweeps.cluster_process import ClusterProcess
from pipelines.sweeps.config import GridPoint, SweepConfig
from pipelines.sweeps.point_run import PointEnv, python_for, run_point
from pipelines.sweeps.report import write_outputs


def cluster_shape(point: GridPoint) -> tuple[str, int, int]:
    return point.engine, point.executors, point.executor_cores


def run_sweep(config: SweepConfig, log: Callable[[str], None] | None = None) -> tuple[list[dict], dict]:
    """Run the grid; return (rows, paths of the written csv/report/plots)."""
    log = log or (lambda message: print(f"[sweep] {message}", file=sys.stderr, flush=True))
    out_dir = config.resolve(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    points = config.points()
    rows: list[dict] = []
    started = time.perf_counter()
    total = len(points) * int(config.repeats)
    for shape, group in itertools.groupby(points, key=cluster_shape):
        group = list(group)
        engine, executors, cores = shape
        python, extra_env = python_for(engine, config.python, str(config.resolve(config.bigdl_python)))
        runnable = Path(python).is_file() and any(not p.unschedulable_reason() for p in group)
        cluster = None
        if config.mode == "standalone" and runnable:
            log(f"starting a standalone cluster: {executors} worker(s) x {cores} core(s), {config.worker_memory}")
            cluster = ClusterProcess(
                python,
                executors,
                cores,
                config.worker_memory,
                out_dir / "clusters" / f"{engine}-e{executors}x{cores}",
                start_timeout_s=config.cluster_start_timeout_s,
            ).start()
        try:
            env = PointEnv(
                mode=config.mode,
                master=cluster.master_url if cluster else f"local[{cores}]",
                python=python,
                worker_memory=config.worker_memory,
                extra_env=extra_env,
                cluster_pids=[cluster.pid] if cluster else [],
                timeout_s=config.point_timeout_s,
                memory_interval_s=config.memory_interval_s,
                keep_outputs=config.keep_outputs,
            )
            for point in group:
                for repeat in range(int(config.repeats)):
                    point_dir = out_dir / "points" / (point.point_id + (f"-r{repeat}" if config.repeats > 1 else ""))
                    row = run_point(point, config.job, env, point_dir, repeat)
                    rows.append(row)
                    log(
                        f"{len(rows)}/{total} {point.point_id}: {row['status']}"
                        + (
                            f", {row['images_per_s']} images/s, wall {row['wall_s']} s"
                            if row["status"] == "ok"
                            else f" ({row['error']})"
                        )
                    )
        finally:
            if cluster is not None:
                cluster.stop()
    log(f"{len(rows)} points in {time.perf_counter() - started:.0f} s")
    return rows, write_outputs(rows, out_dir, config)
