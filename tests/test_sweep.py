"""The sweep: a 1x2 grid (partitions x executor cores) on standalone clusters it starts itself, one per cluster shape,
writes one CSV row per point with the job's counts and times, the event-log and memory measurements, a report and
the plots. Plus the config checks that need no Spark.

The sweep starts its own clusters (not the session `standalone_cluster` fixture): a grid point's executor cores
are a property of the cluster, so each shape needs its own.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from PIL import Image

from pipelines.job_config import ConfigError
from pipelines.sweeps.config import GridPoint, load_sweep_config
from pipelines.sweeps.point_run import PointEnv, run_point

REPO = Path(__file__).resolve().parents[1]
# Two cluster shapes (each point a spark-submit, ~50 s on 2 cores); grids over partitions are checked without Spark.
GRID = {
    "partitions": [4],
    "executors": [1],
    "executor_cores": [1, 2],
    "task_cpus": [1],
    "batch_size": [4],
    "openvino_streams": [0],
    "openvino_threads": [0],
    "precision": ["f32"],
    "engine": ["native"],
}


def small_images(directory: Path, count: int) -> Path:
    """`count` 160x120 JPEGs made from the bundled samples."""
    directory.mkdir(parents=True)
    samples = sorted(p for p in (REPO / "samples" / "images").iterdir() if p.suffix in (".jpg", ".png"))
    for index in range(count):
        with Image.open(samples[index % len(samples)]) as image:
            image.convert("RGB").resize((160, 120)).save(directory / f"img_{index:02d}.jpg", quality=90)
    return directory


def write_sweep_yaml(path: Path, **values) -> Path:
    path.write_text(yaml.safe_dump(values), encoding="utf-8")
    return path


@pytest.mark.cluster
def test_sweep_over_two_cluster_shapes_on_standalone_clusters(tmp_path):
    images = small_images(tmp_path / "images", 8)
    out = tmp_path / "sweep"
    config = write_sweep_yaml(
        tmp_path / "sweep.yaml",
        mode="standalone",
        out_dir=str(out),
        worker_memory="1g",
        memory_interval_s=0.25,
        grid=GRID,
        job={
            "input": {"uri": str(images)},
            "model": {"dir": "samples/models/yolact_default"},
            "output": {"masks": "rle"},
            "run": {"progress_interval_s": 0},
        },
    )

    done = subprocess.run(
        [sys.executable, str(REPO / "jobs" / "sweep.py"), "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]

    with open(out / "sweep.csv", newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert sorted((int(r["partitions"]), int(r["executor_cores"])) for r in rows) == [(4, 1), (4, 2)]
    for row in rows:
        assert row["status"] == "ok", row["error"]
        assert int(row["images_in"]) == 8 == int(row["done"]) + int(row["failed_images"])
        for column in (
            "wall_s",
            "images_per_s",
            "process_s",
            "one_frame_s",
            "stage_infer_s",
            "peak_rss_driver_mb",
            "peak_rss_executor_jvm_mb",
            "peak_rss_python_worker_mb",
            "peak_total_pss_mb",
        ):
            assert float(row[column]) > 0, column
        assert int(row["executors_seen"]) == 1
        assert int(row["tasks"]) > 0 and int(row["failed_tasks"]) == 0 and int(row["retried_tasks"]) == 0
        # 8 images over 4 partitions: every inference task got the same number of images
        partitions = int(row["partitions"])
        assert int(row["partition_images_min"]) == int(row["partition_images_max"]) == 8 // partitions
        assert float(row["partition_skew"]) == 1.0
        assert Path(row["point_dir"], "driver.log").is_file()
        assert not Path(row["point_dir"], "output").exists()  # keep_outputs: false
    report = (out / "report.md").read_text(encoding="utf-8")
    assert all(row["point"] in report for row in rows)
    for name in ("images_per_s_vs_partitions.png", "images_per_s_vs_cores.png", "speedup_vs_executors.png"):
        assert (out / "plots" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_grid_points_are_grouped_by_cluster_shape(tmp_path):
    grid = {**GRID, "partitions": [2, 4]}
    config = load_sweep_config(write_sweep_yaml(tmp_path / "s.yaml", mode="standalone", grid=grid))
    points = config.points()
    assert len(points) == 4
    assert [p.executor_cores for p in points] == [1, 1, 2, 2]
    assert len({p.point_id for p in points}) == 4


def test_grid_keys_left_out_take_the_job_configs_value(tmp_path):
    """A grid that sweeps one setting names only it: the others take the sweep job's inference values (the
    embedded defaults under the sweep's `job:` overrides), executors, executor cores and task CPUs 1."""
    config = load_sweep_config(
        write_sweep_yaml(
            tmp_path / "s.yaml", grid={"batch_size": [4, 16]}, job={"inference": {"precision": "f32", "partitions": 3}}
        )
    )
    points = config.points()
    assert [p.batch_size for p in points] == [4, 16]
    assert {
        (
            p.partitions,
            p.precision,
            p.engine,
            p.executors,
            p.executor_cores,
            p.task_cpus,
            p.openvino_streams,
            p.openvino_threads,
        )
        for p in points
    } == {(3, "f32", "native", 1, 1, 1, 0, 0)}


@pytest.mark.parametrize(
    "values, message",
    [
        ({"mode": "local", "grid": {**GRID, "executors": [1, 2]}}, "local mode has exactly one executor"),
        ({"grid": {**GRID, "cores": [1]}}, "unknown key(s) ['cores']"),
        ({"grid": {**GRID, "precision": ["fp64"]}}, "grid.precision: bad value(s) ['fp64']"),
        ({"grid": GRID, "job": {"inference": {"partition": 3}}}, "unknown key 'inference.partition'"),
        ({"grid": GRID, "workers": 2}, "unknown key(s) ['workers']"),
    ],
)
def test_bad_sweep_config_names_the_key(tmp_path, values, message):
    with pytest.raises(ConfigError) as error:
        load_sweep_config(write_sweep_yaml(tmp_path / "s.yaml", **values))
    assert message in str(error.value)


def test_unschedulable_and_unavailable_points_are_recorded_not_run(tmp_path):
    config = load_sweep_config(write_sweep_yaml(tmp_path / "s.yaml", grid=GRID))
    point = GridPoint(
        partitions=2,
        executors=1,
        executor_cores=1,
        task_cpus=2,
        batch_size=4,
        openvino_streams=0,
        openvino_threads=0,
        precision="f32",
        engine="native",
    )
    env = PointEnv(mode="local", master="local[1]", python=sys.executable)
    row = run_point(point, config.job, env, tmp_path / "p1")
    assert row["status"] == "skipped" and "spark.task.cpus 2 > executor cores 1" in row["error"]

    bigdl = GridPoint(**{**point.as_dict(), "task_cpus": 1, "engine": "bigdl"})
    row = run_point(
        bigdl, config.job, PointEnv(mode="local", master="local[1]", python=str(tmp_path / "nope")), tmp_path / "p2"
    )
    assert row["status"] == "not available" and "make bigdl-env" in row["error"]
    assert not (tmp_path / "p1").exists() and not (tmp_path / "p2").exists()


@pytest.mark.parametrize("name", ["sweep.yaml", "sweep_cluster.yaml"])
def test_shipped_sweep_configs_load(name):
    config = load_sweep_config(REPO / "conf" / name)
    assert config.mode == "standalone" and config.points()


def test_the_event_log_leaves_the_executors_warm_up_out_of_the_inference_stages(tmp_path):
    from pipelines.inference.executor_warmup import JOB_GROUP_PREFIX
    from pipelines.sweeps.event_log import PYTHON_SQL_METRIC, parse_event_log

    def task_end(stage: int, records: int, executor: str, start: int) -> dict:
        return {
            "Event": "SparkListenerTaskEnd",
            "Stage ID": stage,
            "Task End Reason": {"Reason": "Success"},
            "Task Info": {
                "Attempt": 0,
                "Executor ID": executor,
                "Launch Time": start,
                "Finish Time": start + 10,
                "Accumulables": [
                    {"Name": PYTHON_SQL_METRIC, "Update": 5},
                    {"Name": "internal.metrics.input.recordsRead", "Update": records},
                ],
            },
        }

    events = [
        {
            "Event": "SparkListenerJobStart",
            "Job ID": 0,
            "Stage IDs": [0],
            "Properties": {"spark.jobGroup.id": f"{JOB_GROUP_PREFIX}run-1"},
        },
        task_end(0, 1, "0", 100),
        task_end(0, 1, "1", 100),
        {"Event": "SparkListenerJobStart", "Job ID": 1, "Stage IDs": [1, 2], "Properties": {}},
        task_end(2, 4, "0", 200),
        task_end(2, 4, "1", 200),
    ]
    log = tmp_path / "app"
    log.write_text("".join(json.dumps(event) + "\n" for event in events))
    metrics = parse_event_log(log)
    assert metrics.inference_stages == [2] and metrics.partition_images == [4, 4] and metrics.tasks == 4
