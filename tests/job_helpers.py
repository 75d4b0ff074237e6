"""Small helpers shared by the inference-job tests: a job config over local directories, and table rows."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from pipelines.inference.openvino_runtime import RuntimeSettings
from pipelines.job_config import load_config
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


def spark_submit_command(*arguments: str) -> tuple[list[str], dict]:
    """The command line and environment of this interpreter's env's `spark-submit` as a user runs it, the env
    activated: its bin/ first on PATH (pyspark's launcher finds its SPARK_HOME with the `python3` on PATH), its
    Python for the driver and the workers."""
    venv_bin = Path(sys.executable).parent
    path = f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"
    env = {**os.environ, "PATH": path, "PYSPARK_PYTHON": sys.executable}
    return [str(venv_bin / "spark-submit"), *arguments], env


def read_rows(spark, output_dir: Path, table: str) -> list:
    from pipelines.io.storage import spark_read_path  # output directories may have glob characters in their names

    return spark.read.parquet(spark_read_path(output_dir / table)).collect()


def sample_copies(folder: Path, names) -> Path:
    """`folder` holding copies of these samples/images files."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        shutil.copy(SAMPLES / "images" / name, folder / name)
    return folder
