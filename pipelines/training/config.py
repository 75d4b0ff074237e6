"""The training configuration: conf/train_yolact.yaml (documented in place) as plain dataclasses.

    cfg = load_train_config("conf/train_yolact.yaml", overrides={"distributed.strategy": "ddp"})

The config travels to every rank as a dict (``asdict``) and is rebuilt there with ``TrainConfig.from_dict``.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from pathlib import Path

from model_export.models.yolact import get_config
from pipelines.errors import UsageError
from pipelines.job_config import conform_value, read_yaml, set_path
from pipelines.training.augment import AugmentConfig
from pipelines.training.devices import parse_use_gpu
from pipelines.training.yolact_loss import LossConfig

STRATEGIES = ("local", "ddp", "pipeline", "hybrid")
PRECISIONS = ("f32", "bf16")
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "conf" / "train_yolact.yaml"


class TrainConfigError(UsageError):
    pass


@dataclass(frozen=True)
class SparkSection:
    master: str = "local[2]"
    app_name: str = "sparkseg-train-yolact"
    conf: dict = field(default_factory=dict)


@dataclass(frozen=True)
class DataSection:
    images: str = "output/training/roads/images"
    annotations: str = "output/training/roads/annotations.json"
    prepared: str = "output/training/prepared"
    num_shards: int = 4
    val_fraction: float = 0.1
    split_seed: int = 0
    reprepare: bool = False
    loader_workers: int = 0  # processes decoding + augmenting micro-batches (0: in the rank itself)
    loader_prefetch: int = 2  # micro-batches each loader worker prepares ahead


@dataclass(frozen=True)
class ModelSection:
    config: str = "yolact_r18_small"
    max_size: int | None = None
    init: str | None = None
    batch_norm: str = "train"  # train | frozen
    class_names: list | None = None  # the classes to train (None: the config's); fine-tuning from model.init
    #                                    re-initializes the class layers when their number differs

    def yolact_config(self):
        """The model_export YolactConfig this section names, with its input side and classes."""
        overrides = {"max_size": int(self.max_size)} if self.max_size else {}
        if self.class_names:
            overrides["class_names"] = tuple(str(name) for name in self.class_names)
        try:
            return get_config(self.config, **overrides)
        except (KeyError, ValueError) as err:
            raise TrainConfigError(f"model: {err}") from None


@dataclass(frozen=True)
class DistributedSection:
    strategy: str = "local"
    num_processes: int = 1
    threads_per_process: int = 2
    local_mode: bool = True
    pipeline_stages: int = 2
    pipeline_split: list | None = None  # first block of each stage after the first; None: balance FLOPs
    omp_wait_policy: str | None = "passive"  # OMP_WAIT_POLICY of the ranks (None: leave the environment's)
    use_gpu: str | bool = "auto"  # auto | true | false: one GPU per rank, NCCL (pipelines.training.devices)


@dataclass(frozen=True)
class TrainSection:
    epochs: int = 30
    max_steps: int = 0
    global_batch: int = 8
    micro_batch: int = 4
    optimizer: str = "adamw"  # adamw | sgd
    lr: float = 1e-3
    momentum: float = 0.9
    weight_decay: float = 5e-4
    warmup_steps: int = 100
    warmup_init_lr: float = 1e-4
    lr_milestones: list = field(default_factory=list)  # fractions of the total steps where lr *= lr_gamma
    lr_gamma: float = 0.1
    seed: int = 0
    channels_last: bool = True
    precision: str = "f32"  # f32 | bf16 (torch.autocast for the forward pass; the loss in float32)
    cuda_graphs: bool = True  # CUDA, strategy local: the model's forward/backward replayed as CUDA graphs


@dataclass(frozen=True)
class CheckpointSection:
    every_steps: int = 200
    keep_last: int = 2
    resume: bool = True


@dataclass(frozen=True)
class EvalSection:
    every_epochs: int = 1
    max_images: int = 0
    early_stopping_patience: int = 0  # evaluations without a better val mask AP before stopping; 0: never
    min_delta: float = 0.001
    blob_classes: list = field(default_factory=lambda: ["pothole", "patch", "puddle"])


@dataclass(frozen=True)
class TrackingSection:
    mlflow_uri: str | None = "mlruns"  # None (empty in the YAML): no MLflow
    experiment: str = "sparkseg-train-yolact"
    run_name: str | None = None
    plots: bool = True
    baseline: str | None = None  # summary.json of a `local` run: speedup and efficiency against it
    progress_bar: bool = True


@dataclass(frozen=True)
class TrainConfig:
    run_dir: str = "output/training/run"
    spark: SparkSection = field(default_factory=SparkSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)
    train: TrainSection = field(default_factory=TrainSection)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    eval: EvalSection = field(default_factory=EvalSection)
    tracking: TrackingSection = field(default_factory=TrackingSection)

    def __post_init__(self):
        d, t = self.distributed, self.train
        if d.strategy not in STRATEGIES:
            raise TrainConfigError(f"distributed.strategy {d.strategy!r}: choose one of {', '.join(STRATEGIES)}")
        if d.num_processes < 1 or d.threads_per_process < 1:
            raise TrainConfigError("distributed.num_processes and threads_per_process must be >= 1")
        if d.strategy == "local" and d.num_processes != 1:
            raise TrainConfigError("strategy local runs 1 process (use threads_per_process for more threads)")
        if d.strategy in ("pipeline", "hybrid") and d.pipeline_stages < 2:
            raise TrainConfigError("distributed.pipeline_stages must be >= 2 for pipeline/hybrid")
        if d.strategy == "pipeline" and d.num_processes != d.pipeline_stages:
            raise TrainConfigError(f"strategy pipeline needs num_processes == pipeline_stages ({d.pipeline_stages})")
        if d.strategy == "hybrid" and (d.num_processes % d.pipeline_stages or d.num_processes < 2 * d.pipeline_stages):
            raise TrainConfigError(
                "strategy hybrid needs num_processes = data-parallel groups (>= 2) x pipeline_stages"
            )
        try:
            parse_use_gpu(d.use_gpu)
        except ValueError as err:
            raise TrainConfigError(str(err)) from None
        if t.precision not in PRECISIONS:
            raise TrainConfigError(f"train.precision {t.precision!r}: choose one of {', '.join(PRECISIONS)}")
        if self.data.loader_workers < 0 or self.data.loader_prefetch < 1:
            raise TrainConfigError("data.loader_workers must be >= 0 and data.loader_prefetch >= 1")
        if t.optimizer not in ("adamw", "sgd"):
            raise TrainConfigError(f"train.optimizer {t.optimizer!r}: choose adamw or sgd")
        if self.model.batch_norm not in ("train", "frozen"):
            raise TrainConfigError(f"model.batch_norm {self.model.batch_norm!r}: choose train or frozen")
        if t.global_batch % t.micro_batch:
            raise TrainConfigError(
                f"train.global_batch {t.global_batch} must be a multiple of micro_batch {t.micro_batch}"
            )
        micro_per_step = t.global_batch // t.micro_batch
        if micro_per_step % self.data_parallel_size:
            raise TrainConfigError(
                f"{micro_per_step} micro-batches per step cannot be split over "
                f"{self.data_parallel_size} data-parallel replicas: adjust global/micro batch"
            )

    @property
    def pipeline_stages(self) -> int:
        return self.distributed.pipeline_stages if self.distributed.strategy in ("pipeline", "hybrid") else 1

    @property
    def data_parallel_size(self) -> int:
        return self.distributed.num_processes // self.pipeline_stages

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> TrainConfig:
        return _build(cls, data, "")


def _build(kind, data: dict, where: str, see: str = "conf/train_yolact.yaml"):
    if not isinstance(data, dict):
        raise TrainConfigError(f"{where or 'config'} must be a mapping, got {type(data).__name__}")
    known = {f.name: f for f in fields(kind)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise TrainConfigError(
            f"unknown key(s) {', '.join(where + k for k in unknown)} "
            f"(known under {where or 'top level'}: {', '.join(sorted(known))})"
        )
    values = {}
    defaults, hints = kind(), typing.get_type_hints(kind)
    for name, value in data.items():
        default = getattr(defaults, name)
        if is_dataclass(default) and (value is None or isinstance(value, dict)):  # None: a section left empty
            values[name] = _build(type(default), value or {}, f"{where}{name}.", see)
        elif is_dataclass(default):
            raise TrainConfigError(f"{where}{name} is {value!r}: it must be a section of keys (see {see})")
        else:  # typed as the field declares: `--set train.lr=abc` is an error now, not a crash in a rank
            values[name] = conform_value(value, hints[name], where + name, see, TrainConfigError)
    try:
        return kind(**values)
    except TypeError as err:
        raise TrainConfigError(f"{where or 'config'}: {err}") from None


def read_config_data(
    path: str | Path | None, overrides: dict | None, default: Path, error: type[Exception] = TrainConfigError
) -> dict:
    """The YAML at `path` (default: `default`) as a dict with dotted `overrides` applied ({"train.epochs": 2});
    a missing file or bad YAML raises `error`."""
    data = read_yaml(path or default, f"training config (see conf/{default.name})", error)
    for dotted, value in (overrides or {}).items():
        set_path(data, dotted, value)
    return data


def load_train_config(path: str | Path | None = None, overrides: dict | None = None) -> TrainConfig:
    """conf/train_yolact.yaml (or `path`) with dotted `overrides` applied ({"train.epochs": 2})."""
    return TrainConfig.from_dict(read_config_data(path, overrides, DEFAULT_CONFIG))
