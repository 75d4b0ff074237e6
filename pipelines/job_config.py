"""Job configuration: a YAML file (conf/*.yaml, documented in place) plus command-line overrides."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = REPO_ROOT / "conf" / "local.yaml"


class ConfigError(ValueError):
    pass


def load_config(path: str | Path | None = None) -> dict:
    """The YAML at `path` layered over the embedded default (conf/local.yaml): missing keys keep their defaults."""
    base = yaml.safe_load(DEFAULT_CONFIG.read_text(encoding="utf-8"))
    if path is None:
        return base
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file (see conf/ for examples)")
    try:
        overlay = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return merge(base, overlay, str(path))


def merge(base: dict, overlay: dict, source: str = "config", prefix: str = "") -> dict:
    """Deep-merge `overlay` into a copy of `base`; unknown keys are errors (typos must not pass silently),
    except under free-form sections (spark.conf)."""
    merged = copy.deepcopy(base)
    for key, value in overlay.items():
        dotted = f"{prefix}{key}"
        if key not in merged and dotted not in FREE_FORM:
            raise ConfigError(f"{source}: unknown key '{dotted}' (known: {', '.join(sorted(merged))})")
        if isinstance(value, dict) and isinstance(merged.get(key), dict) and dotted not in FREE_FORM:
            merged[key] = merge(merged[key], value, source, f"{dotted}.")
        elif isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = {**merged[key], **value}
        else:
            merged[key] = value
    return merged


FREE_FORM = {"spark.conf"}


def set_path(config: dict, dotted: str, value) -> None:
    """Apply one override (`inference.partitions`, 8)."""
    *parents, leaf = dotted.split(".")
    node = config
    for key in parents:
        node = node[key]
    node[leaf] = value


def resolve_local(uri: str) -> str:
    """Plain relative paths are relative to the repository root (so the embedded default works from anywhere);
    URIs with a scheme are returned as they are."""
    if "://" in uri or uri.startswith("file:"):
        return uri
    path = Path(uri).expanduser()
    return str(path if path.is_absolute() else (Path.cwd() / path if (Path.cwd() / path).exists()
                                                else REPO_ROOT / path).resolve())
