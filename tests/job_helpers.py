"""Small helpers shared by the inference-job tests: a job config over local directories, and table rows."""
from __future__ import annotations

from pathlib import Path

from pipelines.job_config import load_config
from pipelines.inference.openvino_runtime import RuntimeSettings
from tests.conftest import SAMPLES

DEFAULT_MODEL_DIR = SAMPLES / "models" / "yolact_default"
# What job_config's jobs run with on the test session (spark.task.cpus 1): single-process references that are
# compared exactly must use the same settings (OpenVINO's f32 results depend on the thread count in the last bits).
JOB_RUNTIME = RuntimeSettings.for_task_cpus(1, precision="f32")


def job_config(input_dir: Path, output_dir: Path, model_dir: Path = DEFAULT_MODEL_DIR, **inference) -> dict:
    """conf/local.yaml pointed at these directories: 2 partitions, batches of 4, f32, no progress lines."""
    config = load_config()
    config["input"]["uri"] = str(input_dir)
    config["output"]["uri"] = str(output_dir)
    config["model"]["dir"] = str(model_dir)
    config["inference"].update({"partitions": 2, "batch_size": 4, "precision": "f32", **inference})
    config["run"]["progress_interval_s"] = 0
    return config


def read_rows(spark, output_dir: Path, table: str) -> list:
    from pipelines.io.storage import spark_read_path   # output directories may have glob characters in their names

    return spark.read.parquet(spark_read_path(output_dir / table)).collect()
