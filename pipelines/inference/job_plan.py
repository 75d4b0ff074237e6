"""Planning: what the driver resolves in pure Python before any JVM or Spark task (URIs, the model, the engine,
credentials, the runtime settings), and the plan's derived choices (tasks per wave, how executors read bytes)."""

from __future__ import annotations

import datetime as dt
import importlib.util
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.inference import image_sources as src
from pipelines.inference.engine import Engine
from pipelines.inference.model_manifest import ModelManifest, load_manifest
from pipelines.inference.native_engine import NativeEngine
from pipelines.inference.openvino_runtime import RuntimeSettings
from pipelines.io.azure_credentials import AzureCredentials
from pipelines.io.azure_storage import AzureBlobStore
from pipelines.io.local_paths import local_path, resolve_local, resolve_output
from pipelines.io.model_registry import download_model, is_registry_uri
from pipelines.io.storage import Location
from pipelines.job_config import ConfigError, InferenceSettings, JobConfig
from pipelines.results.results_writer import choose_writer
from pipelines.spark.session_kind import session_kind


@dataclass
class JobPlan:
    """What the driver resolved before any Spark task: where from, where to, which model, how."""

    config: JobConfig
    family: str
    input_uri: str
    output: Location  # the output URI and the job's Azure credentials: every write goes through it
    manifest: ModelManifest
    engine: Engine
    reader: str
    run_id: str = field(
        default_factory=lambda: f"{dt.datetime.now(dt.timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:8]}"
    )
    started: float = field(default_factory=time.time)  # the summary's wall time counts from here

    @property
    def output_uri(self) -> str:
        return self.output.uri

    @property
    def credentials(self) -> AzureCredentials | None:
        """The job's Azure credentials (AzureCredentials; None where nothing is on Azure), for input and output."""
        return self.output.credentials


def plan_job(
    config: JobConfig | dict,
    family: str,
    azure_credentials: AzureCredentials | None = None,
    engine: Engine | None = None,
) -> JobPlan:
    """Resolve URIs, check the settings (a dict of the YAML layer is typed here), the local input and output, fetch
    (a models:/ URI) and verify the model and the engine, find credentials: everything that can fail on bad input, in
    pure Python, before any JVM or Spark task. `engine`: the backend the config's inference.engine names
    (pipelines.job_cli.choose_engine); None: the native engine, which a config naming another refuses."""
    config = JobConfig.of(config)
    engine = engine or NativeEngine()
    if engine.name != config.inference.engine:
        raise ConfigError(
            f"inference.engine is {config.inference.engine!r} but the job was given the {engine.name} engine: "
            "pass the engine the config names (pipelines.job_cli.choose_engine), or run the job's command"
        )
    bundled = config.model.dir is None
    config = replace(config, model=replace(config.model, dir=config.model.dir_for(family)))  # as the summary says
    input_uri, output_uri = resolve_local(config.input.uri), resolve_output(config.output.uri)
    check_local_paths(input_uri, output_uri, config.input.uri)
    # a models:/ URI: downloaded here, once, then loaded and shipped as the export directory it names
    model_dir = (
        str(download_model(config.model.dir)) if is_registry_uri(config.model.dir) else resolve_local(config.model.dir)
    )
    if bundled and not Path(model_dir).is_dir():
        raise src.InputError(
            f"no --model (model.dir) given, and the bundled {family} model is not here "
            f"({config.model.dir}): the bundled models ship with the source checkout "
            "(samples/models), not with an installed package; pass --model an export directory "
            f"(python -m model_export {family} ..., or a copy of the checkout's {config.model.dir})"
        )
    manifest = load_manifest(model_dir, verify=True)
    if manifest.model != family:
        raise src.InputError(
            f"{manifest.root}: a '{manifest.model}' model; this job needs a {family} export "
            f"(python -m model_export {family} ...)"
        )
    engine.require()
    reader = src.choose_reader(input_uri, config.input.reader)
    credentials = azure_credentials
    if reader == "azure_sdk" or choose_writer(output_uri) == "azure_sdk":
        require_azure_sdk(engine)
        if credentials is None:
            credentials = AzureCredentials.from_env()
    return JobPlan(config, family, input_uri, Location(output_uri, credentials), manifest, engine, reader)


def require_azure_sdk(engine: Engine) -> None:
    """az:// and abfs:// are read and written with the Azure SDK (setup.py's `azure` extra): an env without it
    (the bigdl engine's pinned env has none) stops here, saying what to do (the engine's azure_sdk_fix)."""
    try:
        found = importlib.util.find_spec("azure.storage.blob") is not None
    except ModuleNotFoundError:  # no azure (or azure.storage) package at all
        found = False
    if not found:
        raise src.InputError(f"az:// and abfs:// inputs and outputs need the Azure SDK; {engine.azure_sdk_fix}")


def check_local_paths(input_uri: str, output_uri: str, given_input: str | None = None) -> None:
    """A local --input must exist (the error names it as `given_input`, the user's spelling); a local --output must
    be a directory or not exist yet (other schemes are checked by their store when the job lists and locks them)."""
    source, target = local_path(input_uri), local_path(output_uri)
    if source is not None and not source.exists():
        raise src.missing_input(given_input or input_uri)
    if source is not None and target is not None and source.resolve() == target.resolve():
        raise src.output_is_input(output_uri)  # before Spark starts (other stores: when the input is listed)
    if target is not None and target.exists() and not target.is_dir():
        raise src.InputError(
            f"{output_uri}: --output names an existing file; give a directory (new or a previous run's output)"
        )
    if target is not None and not target.exists():
        parent = next(folder for folder in target.absolute().parents if folder.exists())
        if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
            raise src.InputError(
                f"{output_uri}: --output cannot be created: {parent} is "
                f"{'a file' if not parent.is_dir() else 'not writable for this user'}; give a "
                "directory that can be"
            )


def runtime_settings(spark: SparkSession, inference: InferenceSettings) -> RuntimeSettings:
    task_cpus = session_kind(spark).task_cpus()
    return RuntimeSettings.for_task_cpus(
        task_cpus,
        precision=inference.precision,
        threads=inference.openvino_threads or None,
        streams=inference.openvino_streams or None,
        pin_cores=inference.pin_cores,
    )


MAX_ROUNDS_PER_WAVE = 64  # the driver keeps a few KB per task of a stage: a huge wave (run.commit_every 0) gets
# larger tasks, not more than 64 per core


def tasks_per_wave(inference: InferenceSettings, parallelism: int, wave_images: int) -> int:
    """Tasks a wave of `wave_images` images is split into: inference.partitions where set; else `parallelism` (every
    core busy), times the rounds it takes for no task to hold more than inference.max_images_per_task images, up to
    MAX_ROUNDS_PER_WAVE (equal tasks end together, round after round: the progress line, fed as tasks end, moves at
    each round). Never more tasks than images."""
    wanted = inference.partitions
    if not wanted:
        per_round = parallelism * inference.max_images_per_task
        rounds = min(max(1, -(-wave_images // per_round)), MAX_ROUNDS_PER_WAVE) if per_round else 1
        wanted = parallelism * rounds
    return max(1, min(wanted, wave_images))


def bytes_fetcher(plan: JobPlan) -> Callable[[str], bytes] | None:
    """What the executors call to read an image's bytes by path, or None where Spark ships them (`content`)."""
    if plan.reader != "spark":
        return _azure_fetcher(plan.credentials)
    return src.read_local_file if src.reads_on_executors(plan.input_uri) else None


def _azure_fetcher(credentials: AzureCredentials | None) -> Callable[[str], bytes]:
    """One AzureBlobStore per task (it travels with the task function; only the credentials are pickled): its SDK
    client, made on the executor at the first read, serves every image of the task."""
    return AzureBlobStore(credentials).read
