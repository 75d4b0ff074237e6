"""Job configuration, in two layers.

- The YAML layer: `load_config(path)` is conf/local.yaml (the packaged copy: the one place the defaults live) with the
  user's YAML layered over it, a plain dict that command-line flags (`set_path`), notebooks and sweeps edit.
- The typed layer: `JobConfig.from_dict(data)` checks every key's type and value (naming the key and the fix) and
  gives the job frozen sections; each stage gets the section it needs (`config.inference`, `config.run`, ...).
"""

from __future__ import annotations

import copy
import math
import re
import types
import typing
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import yaml

from pipelines.errors import UsageError
from pipelines.io.local_paths import REPO_ROOT
from pipelines.io.model_registry import is_registry_uri, parse_model_uri

PACKAGE_DIR = Path(__file__).resolve().parent
# conf/local.yaml ships inside the package as pipelines/conf/local.yaml (setup.py maps conf/ there), so an
# installed wheel or a packed env finds the same defaults as a checkout.
DEFAULT_CONFIG_CANDIDATES = (PACKAGE_DIR / "conf" / "local.yaml", REPO_ROOT / "conf" / "local.yaml")


class ConfigError(UsageError):
    pass


def default_config_path() -> Path:
    """conf/local.yaml: the installed package's copy, else the checkout's."""
    for candidate in DEFAULT_CONFIG_CANDIDATES:
        if candidate.is_file():
            return candidate
    raise ConfigError(
        f"the default config is missing (looked in {', '.join(map(str, DEFAULT_CONFIG_CANDIDATES))}): "
        "reinstall sparkseg (pip install sparkseg) or run from a checkout"
    )


def load_config(path: str | Path | None = None) -> dict:
    """The YAML at `path` layered over the embedded default (conf/local.yaml): missing keys keep their defaults."""
    base = yaml.safe_load(default_config_path().read_text(encoding="utf-8"))
    if path is None:
        return base
    return merge(base, read_yaml(path, "config file (see conf/ for examples)"), str(path))


class StrictKeysLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, except that a key given twice in one mapping is an error (the YAML spec says keys are
    unique; PyYAML keeps the last one silently, so a setting written twice loses its first value unseen)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if not isinstance(key, typing.Hashable):
                continue  # the base class refuses it, naming it
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"found the key {key!r} twice in one mapping", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep)


def read_yaml(path: str | Path, what: str, error: type[UsageError] | None = None) -> dict:
    """A YAML file's mapping ({} for an empty file); a missing file or bad YAML raises `error` (ConfigError) naming
    the path and `what` it should be."""
    error = error or ConfigError
    path = Path(path)
    if path.is_dir():
        raise error(f"{path}: a directory, not a {what}")
    if not path.is_file():
        raise error(f"{path}: no such {what}")
    try:
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=StrictKeysLoader) or {}
    except yaml.YAMLError as err:
        raise error(f"{path}: not valid YAML: {yaml_problem(err)}") from None
    if not isinstance(data, dict):
        raise error(f"{path}: holds a {type(data).__name__}, not a mapping of keys: not a {what}")
    return data


def yaml_problem(err: yaml.YAMLError) -> str:
    """One line: where the YAML parser stopped and why ("line 2, column 1: expected ',' or ']', but got ...")."""
    mark, problem = getattr(err, "problem_mark", None), getattr(err, "problem", None)
    if mark is None or not problem:
        return " ".join(str(err).split())
    context = getattr(err, "context", None)
    return f"line {mark.line + 1}, column {mark.column + 1}: {problem}" + (f" ({context})" if context else "")


def merge(base: dict, overlay: dict, source: str = "config", prefix: str = "") -> dict:
    """Deep-merge `overlay` into a copy of `base`; unknown keys are errors (typos must not pass silently),
    except under free-form sections (spark.conf)."""
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        dotted = f"{prefix}{key}"
        if key not in merged and dotted not in FREE_FORM:
            raise ConfigError(f"{source}: unknown key '{dotted}' (known: {', '.join(sorted(merged))})")
        if value is None and isinstance(merged.get(key), dict):
            continue  # a section left empty (`input:` and nothing under it) keeps its defaults
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and dotted not in FREE_FORM:
            merged[key] = merge(merged[key], value, source, f"{dotted}.")
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


FREE_FORM = {"spark.conf"}


def set_path(config: dict, dotted: str, value) -> None:
    """Apply one override (`inference.partitions`, 8), making the sections it names (typing refuses unknown keys)."""
    *parents, leaf = dotted.split(".")
    node = config
    for depth, key in enumerate(parents, 1):
        if node.get(key) is None:  # absent, or a section left empty
            node[key] = {}
        if not isinstance(node[key], dict):
            raise ConfigError(
                f"{'.'.join(parents[:depth])} is {node[key]!r}: it must be a section of keys (setting {dotted})"
            )
        node = node[key]
    node[leaf] = value


KIND_NAMES = {
    int: "an integer",
    float: "a number",
    bool: "true or false",
    str: "a string",
    dict: "a mapping",
    tuple: "a list of strings",
    list: "a list",
}


def conform_value(value, hint, key: str, see: str = "conf/local.yaml", error: type[UsageError] | None = None):
    """`value` as the field type `hint` asks (int, float, bool, str, dict, list, tuple[str, ...], unions such as
    X | None); else `error` (ConfigError) '<key> is <value>: it must be <kind> (see <see>)'."""
    error = error or ConfigError
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        options = typing.get_args(hint)
        if value is None and type(None) in options:
            return None
        kinds = [arg for arg in options if arg is not type(None)]
        for kind in kinds:
            try:
                return conform_value(value, kind, key, see, error)
            except error:
                pass
        names = " or ".join(KIND_NAMES[typing.get_origin(kind) or kind] for kind in kinds)
        raise error(f"{key} is {value!r}: it must be {names} (see {see})")
    kind = typing.get_origin(hint) or hint
    if kind is tuple and isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
        return tuple(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind is dict and value is None:
        return {}
    if kind is not tuple and isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise error(f"{key} is {value!r}: it must be {KIND_NAMES[kind]} (see {see})")


def build_section(kind, data, where: str = ""):
    """The dataclass `kind` from the dict `data`, nested sections included; unknown and missing keys and values of
    the wrong type raise ConfigError naming the dotted key."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where.rstrip('.') or 'config'} is {data!r}: it must be a mapping of keys")
    known = [f.name for f in fields(kind)]  # declaration order: the first bad key reported is always the same one
    unknown, missing = sorted(set(data) - set(known)), [name for name in known if name not in data]
    if unknown or missing:
        problem = f"unknown key '{where}{unknown[0]}'" if unknown else f"missing key '{where}{missing[0]}'"
        raise ConfigError(f"{problem} (known: {', '.join(sorted(known))})")
    hints = typing.get_type_hints(kind)
    values = {}
    for name in known:
        hint = hints[name]
        values[name] = (
            build_section(hint, data[name], f"{where}{name}.")
            if is_dataclass(hint)
            else conform_value(data[name], hint, where + name)
        )
    return kind(**values)


def require(key: str, ok: bool, value, rule: str) -> None:
    """A value rule: raise ConfigError '<key> is <value>: <rule>' unless `ok`."""
    if not ok:
        raise ConfigError(f"{key} is {value!r}: {rule}")


def _at_least(key: str, value: int, low: int, meaning: str) -> None:
    require(key, value >= low, value, f"it must be an integer >= {low} ({meaning})")


def _one_of(key: str, value: str, choices: tuple[str, ...]) -> None:
    require(key, value in choices, value, f"choose one of {', '.join(choices)}")


SPARK_LOG_LEVELS = ("ALL", "TRACE", "DEBUG", "INFO", "WARN", "ERROR", "FATAL", "OFF")  # SparkContext.setLogLevel's


@dataclass(frozen=True)
class SparkSettings:
    """spark: the session a plain `python jobs/...` run starts (spark-submit's own master and settings win)."""

    master: str
    app_name: str
    conf: dict  # extra Spark settings, free-form
    log_level: str
    remote: str | None  # sc://host:port of a Spark Connect server to run on instead of starting `master`

    def __post_init__(self) -> None:
        require(
            "spark.log_level",
            self.log_level.upper() in SPARK_LOG_LEVELS,
            self.log_level,
            f"give one of {', '.join(SPARK_LOG_LEVELS)}",
        )
        remote_ok = self.remote is None or str(self.remote).startswith("sc://")
        require("spark.remote", remote_ok, self.remote, "give sc://host:port, or null to start `master`")


@dataclass(frozen=True)
class VideoSettings:
    """input.video: which files are videos, how they are cut into units of work, which frames are processed."""

    extensions: tuple[str, ...]
    segment_frames: int
    frame_stride: int
    fps: float | None

    def __post_init__(self) -> None:
        object.__setattr__(self, "extensions", tuple(e.lower() for e in self.extensions))
        _at_least("input.video.segment_frames", self.segment_frames, 1, "frames per unit of work")
        _at_least("input.video.frame_stride (--frame-stride)", self.frame_stride, 1, "every N-th frame")
        require(
            "input.video.fps (--fps)",
            self.fps is None or self.fps > 0,
            self.fps,
            "give a number > 0, or null for every frame",
        )

    def keeps(self, frame_index: int, timestamp_s: float, previous_timestamp_s: float | None) -> bool:
        """Whether a frame is processed: every frame_stride-th, and with fps the first frame at or after each
        multiple of 1/fps seconds (stateless: decided from the frame's and its predecessor's timestamps)."""
        if frame_index % self.frame_stride:
            return False
        if self.fps is None or previous_timestamp_s is None:
            return True
        return _fps_slot(timestamp_s, self.fps) != _fps_slot(previous_timestamp_s, self.fps)


def _fps_slot(timestamp_s: float, fps: float) -> int:
    return math.floor(timestamp_s * fps + 1e-6)


@dataclass(frozen=True)
class InputSettings:
    uri: str
    reader: str  # auto | spark | azure_sdk
    recursive: bool
    extensions: tuple[str, ...]
    video: VideoSettings

    def __post_init__(self) -> None:
        _one_of("input.reader", self.reader, ("auto", "spark", "azure_sdk"))

    @property
    def listed_extensions(self) -> list[str]:
        """The file name extensions the job lists: images' and videos'."""
        return [*self.extensions, *self.video.extensions]


@dataclass(frozen=True)
class BundledModels:
    yolact: str
    detector: str


@dataclass(frozen=True)
class ModelSettings:
    dir: str | None  # an export directory with manifest.json, or models:/NAME/VERSION or models:/NAME@ALIAS of an
    # MLflow registry; None: bundled's model of the job's family
    bundled: BundledModels

    def __post_init__(self) -> None:
        require(
            "model.dir (--model)",
            self.dir is None or bool(self.dir.strip()),
            self.dir,
            "give an export directory or a models:/ URI, or null for the job's bundled model",
        )
        if is_registry_uri(self.dir):
            parse_model_uri(str(self.dir))  # its form, before anything else: the registry is asked when planning

    def dir_for(self, family: str) -> str:
        """The export directory the `family` job runs."""
        return self.dir or getattr(self.bundled, family)


@dataclass(frozen=True)
class OutputSettings:
    uri: str
    masks: str  # rle_and_png | rle | none
    score_threshold: float | None  # None: the manifest's conf_thresh
    coco_results: bool
    overlays: bool

    def __post_init__(self) -> None:
        check_output_options(self.masks, self.score_threshold)


MASK_OUTPUTS = ("rle_and_png", "rle", "none")  # output.masks: RLE + PNG label map | RLE only | boxes only


def check_output_options(masks: str, score_threshold: float | None) -> None:
    """output.masks and output.score_threshold (also checked where the executor task is built without a config)."""
    _one_of("output.masks (--masks)", masks, MASK_OUTPUTS)
    number = isinstance(score_threshold, (int, float)) and not isinstance(score_threshold, bool)
    require(
        "output.score_threshold (--score-threshold)",
        score_threshold is None or (number and 0 <= score_threshold <= 1),
        score_threshold,
        "give a number in [0, 1], or null for the model manifest's threshold",
    )


@dataclass(frozen=True)
class InferenceSettings:
    engine: str  # native | bigdl
    partitions: int  # tasks per wave; 0: a multiple of spark.default.parallelism (tasks_per_wave)
    max_images_per_task: int  # with partitions 0: more tasks where one would hold more images (0: no bound)
    batch_size: int
    precision: str  # f32 | bf16 | auto
    openvino_threads: int  # 0: spark.task.cpus
    openvino_streams: int  # 0: one per task
    pin_cores: bool  # each Python worker on cores of its own (pipelines.inference.core_pinning)
    max_image_pixels: int
    nms: str  # fast | per_class | cross_class
    jpeg_draft: bool

    def __post_init__(self) -> None:
        _one_of("inference.engine (--engine)", self.engine, ("native", "bigdl"))
        _at_least("inference.partitions (--partitions)", self.partitions, 0, "0 means spark.default.parallelism")
        _at_least("inference.max_images_per_task", self.max_images_per_task, 0, "0 means no bound")
        _at_least("inference.batch_size (--batch-size)", self.batch_size, 1, "images per Arrow batch")
        _one_of("inference.precision (--precision)", self.precision, ("f32", "bf16", "auto"))
        _at_least("inference.openvino_threads", self.openvino_threads, 0, "0 means spark.task.cpus")
        _at_least("inference.openvino_streams", self.openvino_streams, 0, "0 means one stream per task")
        _at_least("inference.max_image_pixels", self.max_image_pixels, 1, "the decompression-bomb guard")
        _one_of("inference.nms", self.nms, ("fast", "per_class", "cross_class"))


@dataclass(frozen=True)
class RunSettings:
    force: bool
    commit_every: int  # 0: one commit at the end
    max_error_fraction: float
    poison_attempts: int
    retries: int
    break_lock: bool
    lock_stale_after_s: float
    lock_heartbeat_s: float
    progress_interval_s: float
    broadcast_max_rows: int

    def __post_init__(self) -> None:
        _at_least("run.commit_every", self.commit_every, 0, "0 commits once at the end")
        require(
            "run.max_error_fraction",
            0 <= self.max_error_fraction <= 1,
            self.max_error_fraction,
            "give a fraction between 0 and 1",
        )
        _at_least("run.poison_attempts", self.poison_attempts, 1, "crashed attempts before an image is an error")
        _at_least("run.retries", self.retries, 0, "0: a failure that was not the image's is not tried again")
        require(
            "run.progress_interval_s",
            self.progress_interval_s >= 0,
            self.progress_interval_s,
            "give a number of seconds >= 0 (0: no progress line)",
        )
        _at_least("run.broadcast_max_rows", self.broadcast_max_rows, 0, "done keys broadcast up to this many rows")
        require(
            "run.lock_heartbeat_s",
            0 < self.lock_heartbeat_s < self.lock_stale_after_s,
            self.lock_heartbeat_s,
            f"give seconds > 0 and below run.lock_stale_after_s ({self.lock_stale_after_s}), else a live run "
            "looks dead",
        )


STREAM_SOURCES = ("file", "cloudFiles")  # stream.source: Spark's file source | Databricks Auto Loader
INTERVAL_UNITS = {"ms": 0.001, "s": 1.0, "min": 60.0, "h": 3600.0}


@dataclass(frozen=True)
class StreamSettings:
    source: str  # file | cloudFiles
    trigger_interval: str  # "30s": a micro-batch at most this often (--trigger-interval)
    available_now: bool  # process what is there, then stop (--available-now)
    max_files_per_trigger: int  # 0: no bound
    max_bytes_per_trigger: str | None  # "1g"; None: no bound

    def __post_init__(self) -> None:
        _one_of("stream.source", self.source, STREAM_SOURCES)
        self.interval_s()  # raises on a bad interval
        _at_least("stream.max_files_per_trigger", self.max_files_per_trigger, 0, "0: no bound")

    def interval_s(self) -> float:
        """stream.trigger_interval in seconds: a number and a unit (ms, s, min, h)."""
        found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-z]+)\s*", str(self.trigger_interval))
        ok = found is not None and found.group(2) in INTERVAL_UNITS
        require("stream.trigger_interval (--trigger-interval)", ok, self.trigger_interval, "e.g. 30s, 500ms, 2min")
        assert found is not None  # require raised otherwise
        return float(found.group(1)) * INTERVAL_UNITS[found.group(2)]


@dataclass(frozen=True)
class JobConfig:
    """The inference job's settings, typed (conf/local.yaml documents every key)."""

    spark: SparkSettings
    input: InputSettings
    model: ModelSettings
    output: OutputSettings
    inference: InferenceSettings
    run: RunSettings
    stream: StreamSettings

    @classmethod
    def from_dict(cls, data: dict) -> JobConfig:
        """From `load_config`'s dict (every key present: the defaults are layered under it)."""
        return build_section(cls, data)

    @classmethod
    def of(cls, config: JobConfig | dict) -> JobConfig:
        """`config` typed: a JobConfig as it is, a dict of the YAML layer built with from_dict."""
        return config if isinstance(config, JobConfig) else cls.from_dict(config)
