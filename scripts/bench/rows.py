"""The bench rows: each runs as its own process tree, sampled for peak memory, and gives a `BenchResult`.

Rows (same images, same IR, same cores):
- ceiling: OpenVINO's benchmark_app on the IR, throughput hint (model only: no decode, no postprocess);
- torch, onnxruntime, openvino: one process, the job's per-image code (scripts/bench/single_process.py);
- spark_native: the real job (jobs/infer_yolact.py) in local[2] with its defaults (pipelines.sweeps.point_run);
- spark_udf: Spark's predict_batch_udf recipe at default settings (scripts/bench/udf_recipe.py);
- bigdl: the job with --engine bigdl in .venv-bigdl ("not available: <reason>" when it cannot run).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pipelines.sweeps.config import GridPoint
from pipelines.sweeps.point_run import PointEnv, python_for, run_point
from pipelines.sweeps.process_memory import MemoryPeaks, TreeMemorySampler

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
BENCHMARK_APP = Path(sys.executable).with_name("benchmark_app")
BIGDL_DRIVER_MEMORY = "4g"
ROW_NAMES = {
    "ceiling": "benchmark_app on the IR (ceiling, model only)",
    "torch": "PyTorch eager, one process (YOLACT Original)",
    "onnxruntime": "ONNX Runtime, one process",
    "openvino": "OpenVINO, one process (pipelines/inference/single_process.py)",
    "spark_native": "Spark job, native engine, local[2]",
    "spark_udf": "Spark predict_batch_udf + OpenVINO, default settings, local[2]",
    "bigdl": "Spark job, BigDL engine, local[2]",
}


@dataclass
class BenchResult:
    """One row in one precision. status: ok | failed | not available | n/a."""

    row: str
    precision: str
    status: str
    images: int = 0
    images_per_s: float | None = None
    seconds: float | None = None
    note: str = ""
    settings: dict = field(default_factory=dict)
    stage_seconds: dict = field(default_factory=dict)
    memory: dict = field(default_factory=dict)  # MemoryPeaks.as_row() of the row's process tree
    extra: dict = field(default_factory=dict)
    load_average: list = field(default_factory=list)  # the machine's 1-min load average [at start, at end]

    def as_csv_row(self, ceiling: float | None) -> dict:
        row = {
            "row": self.row,
            "name": ROW_NAMES.get(self.row, self.row),
            "precision": self.precision,
            "status": self.status,
            "images": self.images,
            "images_per_s": self.images_per_s,
            "ratio_to_ceiling": round(self.images_per_s / ceiling, 3) if self.images_per_s and ceiling else None,
            "seconds": self.seconds,
            "note": self.note,
            "settings": json.dumps(self.settings, sort_keys=True),
        }
        row.update({f"stage_{k}_s": v for k, v in self.stage_seconds.items()})
        row.update(self.memory)
        if self.load_average:
            row["load_avg_start"], row["load_avg_end"] = (round(v, 1) for v in self.load_average)
        return row


def save_result(result: BenchResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(asdict(result), default=str), encoding="utf-8")


def load_result(path: Path) -> BenchResult | None:
    """A saved result, or None when there is none (or it is not usable)."""
    try:
        return BenchResult(**json.loads(path.read_text(encoding="utf-8")))
    except (FileNotFoundError, json.JSONDecodeError, TypeError):
        return None


def child_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYSPARK_GATEWAY")}
    env.update(
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    return env


def run_measured(command: list[str], log_path: Path, timeout_s: float) -> tuple[int, str, MemoryPeaks, float]:
    """Run `command`, sampling its process tree; (exit code, stdout, peaks, seconds). stderr goes to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=log, stdin=subprocess.DEVNULL, env=child_env(), cwd=REPO
        )
        with TreeMemorySampler([process.pid]) as sampler:
            try:
                stdout, _ = process.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                stdout, _ = process.communicate()
    return process.returncode, stdout.decode("utf-8", "replace"), sampler.peaks, time.perf_counter() - started


def last_json(stdout: str) -> dict | None:
    for line in reversed(stdout.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    return None


def failure(row: str, precision: str, code: int, log_path: Path, peaks: MemoryPeaks) -> BenchResult:
    from pipelines.sweeps.point_run import last_error_line

    return BenchResult(
        row, precision, "failed", note=f"exit code {code}: {last_error_line(log_path)}", memory=peaks.as_row()
    )


def images_failed(
    row: str, precision: str, failed: int, images: int, first_error: str | None, memory: dict
) -> BenchResult:
    """A row whose bench images failed is not timed: a rate over failed images measures nothing."""
    which = f" (first: {first_error})" if first_error else " (the job's errors/ table says why)"
    return BenchResult(row, precision, "failed", note=f"{failed} of {images} bench images failed{which}", memory=memory)


def ceiling(ir_xml: Path, precision: str, seconds: int, logs: Path, timeout_s: float) -> BenchResult:
    command = [
        str(BENCHMARK_APP),
        "-m",
        str(ir_xml),
        "-d",
        "CPU",
        "-hint",
        "throughput",
        "-infer_precision",
        precision,
        "-t",
        str(seconds),
    ]
    log = logs / f"ceiling-{precision}.log"
    code, stdout, peaks, _ = run_measured(command, log, timeout_s)
    log.write_text(log.read_text() + stdout)
    found = re.search(r"Throughput:\s+([\d.]+)\s*FPS", stdout)
    if code != 0 or not found:
        return failure("ceiling", precision, code, log, peaks)
    streams = re.search(r"NUM_STREAMS:\s*(\d+)", stdout)
    return BenchResult(
        "ceiling",
        precision,
        "ok",
        images_per_s=float(found.group(1)),
        seconds=float(seconds),
        settings={"hint": "throughput", "streams": int(streams.group(1)) if streams else None},
        memory=peaks.as_row(),
        note="model only: no decode, preprocess or postprocess",
    )


def single_process(
    engine: str, precision: str, model: Path, images: Path, cores: int, logs: Path, timeout_s: float
) -> BenchResult:
    if engine == "onnxruntime" and precision != "f32":
        return BenchResult(engine, precision, "n/a", note="ONNX Runtime's CPU provider runs this model in f32")
    command = [
        sys.executable,
        str(HERE / "single_process.py"),
        "--engine",
        engine,
        "--precision",
        precision,
        "--model",
        str(model),
        "--images",
        str(images),
        "--threads",
        str(cores),
        "--streams",
        str(cores),
    ]
    log = logs / f"{engine}-{precision}.log"
    code, stdout, peaks, _ = run_measured(command, log, timeout_s)
    result = last_json(stdout) if code == 0 else None
    if result is None:
        return failure(engine, precision, code, log, peaks)
    if result["failed"]:
        return images_failed(
            engine, precision, result["failed"], result["images"], result["first_error"], peaks.as_row()
        )
    return BenchResult(
        engine,
        precision,
        "ok",
        images=result["images"],
        images_per_s=result["images_per_s"],
        seconds=result["seconds"],
        settings=result["settings"],
        stage_seconds=result["stage_seconds"],
        memory=peaks.as_row(),
        note=f"model load + warm-up {result['load_s']} s not counted",
    )


def spark_udf(precision: str, model: Path, images: Path, work: Path, logs: Path, timeout_s: float) -> BenchResult:
    command = [
        sys.executable,
        str(HERE / "udf_recipe.py"),
        "--model",
        str(model),
        "--images",
        str(images),
        "--out",
        str(work / f"udf-{precision}"),
        "--precision",
        precision,
        "--master",
        "local[2]",
    ]
    log = logs / f"spark_udf-{precision}.log"
    code, stdout, peaks, _ = run_measured(command, log, timeout_s)
    result = last_json(stdout) if code == 0 else None
    if result is None:
        return failure("spark_udf", precision, code, log, peaks)
    return BenchResult(
        "spark_udf",
        precision,
        "ok",
        images=result["images"],
        images_per_s=result["images_per_s"],
        seconds=result["seconds"],
        settings={**result["settings"], "partitions": result["partitions"]},
        memory=peaks.as_row(),
        note="session start excluded",
    )


def spark_job(
    row: str, engine: str, precision: str, model: Path, images: Path, work: Path, timeout_s: float, bigdl_python: Path
) -> BenchResult:
    """The real job (native or bigdl engine) in local[2] with its default settings."""
    python, extra_env = python_for(engine, sys.executable, str(bigdl_python))
    point = GridPoint(
        partitions=0,
        executors=1,
        executor_cores=2,
        task_cpus=1,
        batch_size=8,
        openvino_streams=0,
        openvino_threads=0,
        precision=precision,
        engine=engine,
    )
    from pipelines.job_config import load_config, merge

    overlay = {"input": {"uri": str(images)}, "model": {"dir": str(model)}, "run": {"progress_interval_s": 0}}
    if engine == "bigdl":  # at Spark's default 1g the BigDL engine's JVM ran out of heap (24 R50 images, local[2])
        overlay["spark"] = {"conf": {"spark.driver.memory": BIGDL_DRIVER_MEMORY}}
    job = merge(load_config(), overlay)
    env = PointEnv(mode="local", master="local[2]", python=python, extra_env=extra_env, timeout_s=timeout_s)
    result = from_point_row(row, precision, run_point(point, job, env, work / f"{row}-{precision}"))
    if engine == "bigdl":
        result.settings["spark.driver.memory"] = BIGDL_DRIVER_MEMORY
        result.note += (
            f"; spark.driver.memory {BIGDL_DRIVER_MEMORY} (at 1g its JVM ran out of heap); its "
            "infer time is not split per image (Orca predicts whole partitions)"
        )
    return result


def from_point_row(row: str, precision: str, point_row: dict) -> BenchResult:
    """A sweep row (pipelines.sweeps.point_run) as a BenchResult."""
    memory = {key: point_row.get(key) for key in MemoryPeaks().as_row()}
    if point_row["status"] != "ok":
        status = "not available" if row == "bigdl" else point_row["status"]
        return BenchResult(row, precision, status, note=str(point_row["error"]), memory=memory)
    if point_row.get("failed_images"):
        return images_failed(row, precision, int(point_row["failed_images"]), int(point_row["images_in"]), None, memory)
    stages = {stage: point_row[f"stage_{stage}_s"] for stage in ("read", "preprocess", "infer", "postprocess", "write")}
    return BenchResult(
        row,
        precision,
        "ok",
        images=int(point_row["images_in"]),
        images_per_s=float(point_row["images_per_s"]),
        seconds=float(point_row["wall_s"]),
        settings={
            "master": "local[2]",
            "partitions": "default",
            "task_cpus": 1,
            "openvino": f"{point_row['runtime_streams']} stream(s) x {point_row['runtime_threads']} thread(s) per task",
        },
        stage_seconds=stages,
        memory=memory,
        note=f"job wall time (SparkContext start excluded); tasks {point_row['tasks']}, failed "
        f"{point_row['failed_tasks']}, retried {point_row['retried_tasks']}",
        extra=point_row,
    )
