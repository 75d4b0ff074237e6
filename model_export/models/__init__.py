"""PyTorch model definitions (torch needed only for definition, export and training; never on executors)."""

from model_export.models.checkpoint import (
    CheckpointError,
    LoadReport,
    load_for_finetune,
    load_yolact_checkpoint,
    read_state_dict,
)
from model_export.models.yolact import (
    COCO_CLASSES,
    CONFIGS,
    Yolact,
    YolactConfig,
    bias_class_logits,
    get_config,
    reset_class_layers,
)

__all__ = [
    "CONFIGS",
    "COCO_CLASSES",
    "CheckpointError",
    "LoadReport",
    "Yolact",
    "YolactConfig",
    "bias_class_logits",
    "get_config",
    "load_for_finetune",
    "load_yolact_checkpoint",
    "read_state_dict",
    "reset_class_layers",
]
