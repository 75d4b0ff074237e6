"""Load YOLACT checkpoints (the official dbolya/yolact .pth files or ours) into a `Yolact` model, safely.

Files are always read with `torch.load(..., map_location="cpu", weights_only=True)`: a pickle that would run code
is refused, never executed. Known extras of the released files are dropped (legacy `backbone.layer*` names,
`fpn.downsample_layers.{i}` for i >= num_downsample), absent `*.num_batches_tracked` buffers keep the model's
values; anything else that does not fit raises `CheckpointError` listing the keys.
"""

from __future__ import annotations

import pickle
import pickletools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from model_export.models.yolact import CLASS_DEPENDENT_PREFIXES, CONFIGS, Yolact, reset_class_layers
from pipelines.errors import UsageError

MAX_LISTED_KEYS = 20
CODE_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "REDUCE"}  # pickle opcodes that import or call
_DOWNSAMPLE_KEY = re.compile(r"^fpn\.downsample_layers\.(\d+)\.")


class CheckpointError(UsageError):
    """A checkpoint file cannot be read safely or does not fit the model."""


@dataclass(frozen=True)
class LoadReport:
    """What load_yolact_checkpoint did. loaded: tensors copied into the model; dropped: known extra keys
    ignored; kept_num_batches_tracked: BN counters absent from the file (the model's values were kept)."""

    path: str
    loaded: int
    dropped: tuple[str, ...] = ()
    kept_num_batches_tracked: tuple[str, ...] = ()

    def __str__(self) -> str:
        text = f"loaded {self.loaded} tensors from {Path(self.path).name}"
        if self.dropped:
            text += f"; ignored {len(self.dropped)} known extra key(s): {', '.join(self.dropped)}"
        if self.kept_num_batches_tracked:
            text += f"; {len(self.kept_num_batches_tracked)} num_batches_tracked buffer(s) absent (model values kept)"
        return text


# --------------------------------------------------------------------------------------------------- reading
def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The tensors of a checkpoint file: a raw state_dict, or a dict holding one under "state_dict" or "model"."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist (or is not a file); pass the path of a .pth file")
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if _refused_code(path, err):
            raise CheckpointError(
                f"checkpoint {path} was refused as unsafe: it holds Python objects other than tensors and plain "
                f"containers, which could run code when unpickled ({_refusal_detail(err)}). Only load files from a "
                "trusted source; re-save such a model as a plain state_dict (torch.save(model.state_dict(), ...))"
            ) from None
        raise _unreadable(path, err) from None
    except Exception as err:  # truncated zip, EOF, garbage bytes, directory...: torch raises many types
        raise _unreadable(path, err) from None
    if isinstance(obj, Mapping):
        for wrapper in ("state_dict", "model"):
            if isinstance(obj.get(wrapper), Mapping):
                obj = obj[wrapper]
                break
    if not isinstance(obj, Mapping):
        raise CheckpointError(
            f"checkpoint {path} holds a {type(obj).__name__}, not a state_dict (a dict of "
            "tensors, possibly under a 'state_dict' or 'model' entry)"
        )
    bad = [k for k, v in obj.items() if not isinstance(k, str) or not isinstance(v, torch.Tensor)]
    if bad:
        raise CheckpointError(
            f"checkpoint {path} is not a state_dict: entry {bad[0]!r} is a "
            f"{type(obj[bad[0]]).__name__}, not a tensor ({len(bad)} such entries)"
        )
    return dict(obj)


def _unreadable(path: Path, err: Exception) -> CheckpointError:
    if "weights only load failed" in str(err).lower():
        reason = _refusal_detail(err)  # skip torch's boilerplate about the weights_only default
    else:
        reason = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
    return CheckpointError(
        f"checkpoint {path} is not a readable PyTorch checkpoint (truncated or corrupt file? "
        f"{type(err).__name__}: {reason}); copy the file again or re-save it with torch.save"
    )


def _refused_code(path: Path, err: pickle.UnpicklingError) -> bool:
    """Did the weights_only unpickler refuse `path` because it would import code (rather than because the bytes
    are not a pickle at all)? Decided from torch's message, else by scanning the opcodes (nothing is executed)."""
    message = str(err)
    if "weights only load failed" not in message.lower():
        return False
    if "GLOBAL" in message:
        return True
    try:
        with path.open("rb") as f:
            return any(op.name in CODE_OPCODES for op, _, _ in pickletools.genops(f))
    except Exception:  # not a pickle stream: garbage bytes
        return False


def _refusal_detail(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    hits = [line for line in lines if "GLOBAL" in line or "Unsupported" in line]
    return (hits[0] if hits else lines[-1] if lines else type(err).__name__)[:200]


# ------------------------------------------------------------------------------------------------- comparing
def drop_known_extras(state: Mapping[str, torch.Tensor], num_downsample: int) -> tuple[dict, list[str]]:
    """Remove what the official loader ignores: legacy `backbone.layer*` (not `backbone.layers.*`) keys and
    `fpn.downsample_layers.{i}.*` with i >= num_downsample. Returns (kept, dropped keys)."""
    kept, dropped = {}, []
    for key, value in state.items():
        legacy = key.startswith("backbone.layer") and not key.startswith("backbone.layers")
        match = _DOWNSAMPLE_KEY.match(key)
        if legacy or (match is not None and int(match.group(1)) >= num_downsample):
            dropped.append(key)
        else:
            kept[key] = value
    return kept, dropped


def _shape(t: torch.Tensor) -> str:
    return "x".join(str(d) for d in t.shape) if t.dim() else "scalar"


@dataclass
class _Differences:
    mismatched: list[tuple[str, str, str]]  # key, checkpoint shape, model shape
    missing: list[str]
    unexpected: list[str]
    absent_counters: list[str]  # missing *.num_batches_tracked (tolerated)


def _compare(expected: Mapping[str, torch.Tensor], state: Mapping[str, torch.Tensor]) -> _Differences:
    diff = _Differences([], [], [], [])
    for key, value in expected.items():
        if key not in state:
            (diff.absent_counters if key.endswith(".num_batches_tracked") else diff.missing).append(key)
        elif state[key].shape != value.shape:
            diff.mismatched.append((key, _shape(state[key]), _shape(value)))
    diff.unexpected = [key for key in state if key not in expected]
    return diff


def _mismatch_error(path, model: Yolact, diff: _Differences, expected, state, hint: str) -> CheckpointError:
    lines = [f"{k}: checkpoint {c}, model {m}" for k, c, m in diff.mismatched]
    lines += [f"{k}: missing from checkpoint (model {_shape(expected[k])})" for k in diff.missing]
    lines += [f"{k}: unexpected in checkpoint ({_shape(state[k])})" for k in diff.unexpected]
    listed = "\n  ".join(lines[:MAX_LISTED_KEYS])
    more = f"\n  ... and {len(lines) - MAX_LISTED_KEYS} more" if len(lines) > MAX_LISTED_KEYS else ""
    counts = (
        f"{len(diff.mismatched)} shape mismatch(es), {len(diff.missing)} missing, "
        f"{len(diff.unexpected)} unexpected key(s)"
    )
    guess = _guess_config(state)
    guess_text = f"The checkpoint looks like config {guess}. " if guess else ""
    return CheckpointError(
        f"checkpoint {path} does not fit model {model.cfg.name} ({counts}):\n  {listed}{more}\n{guess_text}{hint}"
    )


def _guess_config(state: Mapping[str, torch.Tensor]) -> str | None:
    """Name of the registered config whose keys and shapes (class-dependent layers aside) equal the checkpoint's."""
    state, _ = drop_known_extras(state, 2)
    for name, cfg in CONFIGS.items():
        with torch.device("meta"):
            shapes = {k: v.shape for k, v in Yolact(cfg).state_dict().items()}
        keys_fit = {k for k in shapes if not k.endswith(".num_batches_tracked")} <= set(state) <= set(shapes)
        if keys_fit and all(state[k].shape == shapes[k] for k in state if not k.startswith(CLASS_DEPENDENT_PREFIXES)):
            num_classes = state["prediction_layers.0.conf_layer.bias"].shape[0] // cfg.num_anchors
            return f"{name!r} with num_classes {num_classes}"
    return None


def _fill_counters(state: dict, expected: Mapping[str, torch.Tensor], keys: list[str]) -> None:
    for key in keys:
        state[key] = expected[key].clone()


# -------------------------------------------------------------------------------------------------- loading
def training_record(path: str | Path) -> dict:
    """What a sparkseg training checkpoint says of the model it trained: `max_size` (the square input side) and
    `class_names`, where recorded ({} for an official checkpoint, or a file read_state_dict will refuse, naming
    why)."""
    try:
        obj = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - read_state_dict reports what is wrong with the file
        return {}
    if not isinstance(obj, Mapping):
        return {}
    record = {}
    if isinstance(obj.get("max_size"), int) and obj["max_size"] > 0:
        record["max_size"] = int(obj["max_size"])
    names = obj.get("class_names")
    if isinstance(names, (list, tuple)) and names and all(isinstance(name, str) for name in names):
        record["class_names"] = tuple(names)
    return record


def load_yolact_checkpoint(model: Yolact, path: str | Path) -> LoadReport:
    """Load every tensor of `path` into `model` (strict: same keys and shapes after dropping the known extras).
    Raises CheckpointError naming the file and, key by key, what does not fit."""
    state = read_state_dict(path)
    state, dropped = drop_known_extras(state, model.cfg.num_downsample)
    expected = model.state_dict()
    diff = _compare(expected, state)
    if diff.mismatched or diff.missing or diff.unexpected:
        raise _mismatch_error(
            path,
            model,
            diff,
            expected,
            state,
            "Build the model with the config the checkpoint was trained with; to start from it "
            "with other classes use load_for_finetune().",
        )
    loaded = len(state)
    _fill_counters(state, expected, diff.absent_counters)
    model.load_state_dict(state, strict=True)
    return LoadReport(str(path), loaded, tuple(dropped), tuple(diff.absent_counters))


def load_for_finetune(model: Yolact, path: str | Path) -> list[str]:
    """Start fine-tuning from a checkpoint trained with other classes: load every tensor whose shape fits and
    re-initialize the class-dependent layers (conf_layer, semantic_seg_conv) when their shapes differ. Returns
    the re-initialized keys ([] if num_classes matched). Any other difference raises CheckpointError."""
    state = read_state_dict(path)
    state, _ = drop_known_extras(state, model.cfg.num_downsample)
    expected = model.state_dict()
    diff = _compare(expected, state)
    class_mismatch = [k for k, _, _ in diff.mismatched if k.startswith(CLASS_DEPENDENT_PREFIXES)]
    diff.mismatched = [m for m in diff.mismatched if m[0] not in class_mismatch]
    if diff.mismatched or diff.missing or diff.unexpected:
        raise _mismatch_error(
            path,
            model,
            diff,
            expected,
            state,
            "Fine-tuning keeps the backbone, FPN, proto net and box/mask heads: build the model "
            "with the checkpoint's config, changing only num_classes/class_names.",
        )
    if class_mismatch:
        for key in expected:
            if key.startswith(CLASS_DEPENDENT_PREFIXES):
                state[key] = expected[key]
    _fill_counters(state, expected, diff.absent_counters)
    model.load_state_dict(state, strict=True)
    return reset_class_layers(model) if class_mismatch else []
