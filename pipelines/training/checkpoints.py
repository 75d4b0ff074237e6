"""Training checkpoints: ``torch.save`` of a dict of plain data (model state_dict, optimizer state keyed by
parameter name, step/epoch counters, best AP); always read back with ``weights_only=True``.

Optimizer state is keyed by parameter *name*, so a run can resume with another strategy (a pipeline stage
holds only its own parameters). Files: ``RUN/checkpoints/step_00001200.pt`` (the last ``keep_last`` kept) and
``RUN/checkpoints/best.pt`` (best val mask AP). Writes are atomic (temporary file, then rename).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

STEP_FILE = re.compile(r"^step_(\d{8})\.pt$")
BEST_NAME = "best.pt"


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / "checkpoints"


def optimizer_state_by_name(optimizer: torch.optim.Optimizer, names: dict[int, str]) -> dict[str, dict]:
    """{parameter name: its optimizer state (tensors cloned)}; names maps id(parameter) -> name."""
    out = {}
    for param, state in optimizer.state.items():
        if id(param) in names:
            out[names[id(param)]] = {k: v.detach().clone() if torch.is_tensor(v) else v for k, v in state.items()}
    return out


def load_optimizer_state(
    optimizer: torch.optim.Optimizer, params: dict[str, torch.nn.Parameter], state: dict[str, dict]
) -> int:
    """Put name-keyed state back into the optimizer for the parameters it holds; returns how many were set."""
    loaded = 0
    fused = bool(optimizer.defaults.get("fused"))
    for name, param in params.items():
        if name in state:
            # moments follow the parameter's device; scalar counters (Adam's step) stay where torch keeps them:
            # on the CPU, except for a fused optimizer, which reads them on the parameters' device
            optimizer.state[param] = {
                k: (v.to(param.device, copy=True) if v.dim() or fused else v.clone()) if torch.is_tensor(v) else v
                for k, v in state[name].items()
            }
            loaded += 1
    return loaded


def save_checkpoint(path: Path, payload: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    torch.save(payload, temp)
    os.replace(temp, path)
    return path


def save_step_checkpoint(run_dir: str | Path, payload: dict, keep_last: int) -> Path:
    directory = checkpoint_dir(run_dir)
    path = save_checkpoint(directory / f"step_{int(payload['state']['step']):08d}.pt", payload)
    for old in step_checkpoints(run_dir)[: -max(keep_last, 1)]:
        old.unlink(missing_ok=True)
    return path


def step_checkpoints(run_dir: str | Path) -> list[Path]:
    directory = checkpoint_dir(run_dir)
    if not directory.is_dir():
        return []
    return sorted(p for p in directory.iterdir() if STEP_FILE.match(p.name))


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    found = step_checkpoints(run_dir)
    return found[-1] if found else None


def load_checkpoint(path: str | Path) -> dict:
    """The checkpoint dict; refuses pickled code (weights_only=True)."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:
        raise ValueError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {str(err).splitlines()[0][:200]}): "
            "delete it to resume from the one before, or start a new run directory"
        ) from None
