"""The detector's training configuration: conf/train_detector.yaml (documented in place) as plain dataclasses.

    cfg = load_detector_train_config("conf/train_detector.yaml", overrides={"distributed.strategy": "ddp"})

Same sections as YOLACT's (`pipelines.training.config`: spark, data, distributed, train, checkpoint, eval,
tracking) except `model` (a FactorNet Faster R-CNN config) and `augment` (geometric only: the model gets 0-1 RGB,
torchvision normalizes). Strategies: local and ddp (the detector has no pipeline split). GPUs as for YOLACT:
`distributed.use_gpu` auto | true | false (`pipelines.training.devices`). The config travels to every rank as a dict
(``to_dict``) and is rebuilt with ``from_dict``.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from model_export.models.factornet_detector import get_detector_config
from pipelines.errors import UsageError
from pipelines.training.augment import AugmentConfig
from pipelines.training.config import (
    CheckpointSection,
    DataSection,
    DistributedSection,
    EvalSection,
    SparkSection,
    TrackingSection,
    TrainConfigError,
    TrainSection,
    _build,
    read_config_data,
)
from pipelines.training.devices import parse_use_gpu

DETECTOR_STRATEGIES = ("local", "ddp")
DEFAULT_DETECTOR_CONFIG = Path(__file__).resolve().parents[2] / "conf" / "train_detector.yaml"


class DetectorConfigError(TrainConfigError, UsageError):
    """A bad detector training config: the message names the key and what to do (exit 2)."""


@dataclass(frozen=True)
class DetectorModelSection:
    config: str = "factornet_small"  # model_export.models.factornet_detector.DETECTOR_CONFIGS
    init: str | None = None  # a detector checkpoint / state_dict to start from (all keys must fit)
    input_size: list | None = None  # [height, width] (multiples of 32) instead of the config's; export with
    #                                     the same --input-size

    def detector_config(self):
        """The model_export DetectorConfig this section names (with its input size override)."""
        overrides = {"input_size": tuple(int(v) for v in self.input_size)} if self.input_size else {}
        try:
            return get_detector_config(self.config, **overrides)
        except (KeyError, ValueError) as err:
            raise DetectorConfigError(f"model: {err}") from None


@dataclass(frozen=True)
class DetectorAugmentSection:
    """Geometric augmentation (`pipelines.training.augment`); boxes only."""

    expand: bool = False
    expand_max_ratio: float = 2.0
    sample_crop: bool = False
    mirror: bool = True
    min_box_px: float = 2.0

    def as_augment_config(self) -> AugmentConfig:
        return AugmentConfig(
            photometric=False,
            expand=self.expand,
            expand_max_ratio=self.expand_max_ratio,
            sample_crop=self.sample_crop,
            mirror=self.mirror,
            min_box_px=self.min_box_px,
        )


@dataclass(frozen=True)
class DetectorTrainConfig:
    run_dir: str = "output/training/detector_run"
    spark: SparkSection = field(default_factory=lambda: SparkSection(app_name="sparkseg-train-detector"))
    data: DataSection = field(default_factory=lambda: DataSection(prepared="output/training/detector_prepared"))
    model: DetectorModelSection = field(default_factory=DetectorModelSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)
    train: TrainSection = field(default_factory=lambda: TrainSection(channels_last=False))
    augment: DetectorAugmentSection = field(default_factory=DetectorAugmentSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    eval: EvalSection = field(default_factory=EvalSection)
    tracking: TrackingSection = field(default_factory=lambda: TrackingSection(experiment="sparkseg-train-detector"))

    def __post_init__(self):
        d, t = self.distributed, self.train
        if d.strategy not in DETECTOR_STRATEGIES:
            raise DetectorConfigError(
                f"distributed.strategy {d.strategy!r}: the detector trains with {' or '.join(DETECTOR_STRATEGIES)} "
                "(pipeline and hybrid split YOLACT only); pass --strategy local or --strategy ddp"
            )
        try:
            parse_use_gpu(d.use_gpu)
        except ValueError as err:
            raise DetectorConfigError(str(err)) from None
        if d.num_processes < 1 or d.threads_per_process < 1:
            raise DetectorConfigError("distributed.num_processes and threads_per_process must be >= 1")
        if d.strategy == "local" and d.num_processes != 1:
            raise DetectorConfigError(
                "strategy local runs 1 process (use threads_per_process for more threads, "
                "or --strategy ddp for more processes)"
            )
        if t.optimizer not in ("adamw", "sgd"):
            raise DetectorConfigError(f"train.optimizer {t.optimizer!r}: choose adamw or sgd")
        if t.global_batch % t.micro_batch:
            raise DetectorConfigError(
                f"train.global_batch {t.global_batch} must be a multiple of train.micro_batch {t.micro_batch}"
            )
        if (t.global_batch // t.micro_batch) % d.num_processes:
            raise DetectorConfigError(
                f"{t.global_batch // t.micro_batch} micro-batches per step cannot be split "
                f"over {d.num_processes} processes: adjust train.global_batch/micro_batch"
            )
        self.model.detector_config()  # the model exists (config name, input size)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> DetectorTrainConfig:
        try:
            return _build(cls, data, "", "conf/train_detector.yaml")
        except DetectorConfigError:
            raise
        except TrainConfigError as err:
            raise DetectorConfigError(str(err)) from None


def load_detector_train_config(path: str | Path | None = None, overrides: dict | None = None) -> DetectorTrainConfig:
    """conf/train_detector.yaml (or `path`) with dotted `overrides` applied ({"train.epochs": 2})."""
    return DetectorTrainConfig.from_dict(
        read_config_data(path, overrides, DEFAULT_DETECTOR_CONFIG, DetectorConfigError)
    )
