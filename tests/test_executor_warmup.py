"""The executors' warm-up (pipelines.inference.executor_warmup): the model it loads is in the cache of the Python
workers that the next tasks run in, and the job runs it, in a job group of its own, beside its planning."""

from __future__ import annotations

import pandas as pd

from pipelines.inference.executor_cache import loaded_keys
from pipelines.inference.executor_warmup import LoadModel
from pipelines.inference.inference_job import run
from pipelines.inference.model_manifest import load_manifest
from pipelines.inference.yolact_inference import YolactInference
from pipelines.io.storage import Location
from tests.job_helpers import DEFAULT_MODEL_DIR, JOB_RUNTIME, job_config
from tests.test_incremental import write_image


class LoadedKeys:
    def __call__(self, batches):
        for batch in batches:
            yield pd.DataFrame({"id": batch["id"], "keys": [repr(loaded_keys())] * len(batch)})


def test_the_next_tasks_find_the_model_the_warm_up_loaded(spark, tmp_path):
    """As in a job's own session, the warm-up starts the Python workers the next tasks get. Spark keeps one pool of
    idle Python workers per executor environment and hands out the longest idle first: the session's shared pool may
    hold more idle workers than cores (started by earlier tests), which the next tasks would get before the warm-up's.
    So these two jobs run with an environment variable of their own (captured when their functions are made), which
    gives them a pool of their own, empty when the warm-up starts."""
    manifest = load_manifest(DEFAULT_MODEL_DIR)
    task = YolactInference(
        model_dir=str(manifest.root),
        model_sha256=manifest.model_sha256,
        class_names=tuple(manifest.class_names),
        input_spec=manifest.input,
        postprocess=manifest.postprocess,
        settings=JOB_RUNTIME,
        output=Location(str(tmp_path)),
        input_root=str(tmp_path),
    )
    cores = spark.sparkContext.defaultParallelism
    frame = spark.range(0, cores, numPartitions=cores)
    environment = spark.sparkContext.environment
    environment["SPARKSEG_TEST_WORKER_POOL"] = str(tmp_path)
    try:
        frame.mapInPandas(LoadModel(task), frame.schema).collect()
        seen = frame.mapInPandas(LoadedKeys(), "id long, keys string").collect()
    finally:
        del environment["SPARKSEG_TEST_WORKER_POOL"]
    assert len(seen) == cores
    assert all(repr((manifest.model_sha256, JOB_RUNTIME)) in row["keys"] for row in seen), seen


def test_a_run_warms_its_executors_up_in_a_job_group_of_its_own(spark, tmp_path):
    images = tmp_path / "images"
    for seed in range(3):
        write_image(images / f"{seed}.jpg", seed)
    summary = run(spark, job_config(images, tmp_path / "out"))
    assert summary["counts"]["done"] == 3
    tracker = spark.sparkContext.statusTracker()
    assert tracker.getJobIdsForGroup(f"sparkseg-warm-up-{summary['run_id']}"), "no warm-up job"
    # and before it, while the driver listed the input of this new output, a one-task job that started a worker
    assert tracker.getJobIdsForGroup(f"sparkseg-warm-up-{summary['run_id']}-workers"), "no early worker start"
    # a resume may find nothing new: its workers start only once it knows it has images to do
    write_image(images / "new.jpg", 7)
    resumed = run(spark, job_config(images, tmp_path / "out"))
    assert resumed["counts"]["done"] == 1
    assert tracker.getJobIdsForGroup(f"sparkseg-warm-up-{resumed['run_id']}")
    assert not tracker.getJobIdsForGroup(f"sparkseg-warm-up-{resumed['run_id']}-workers")
