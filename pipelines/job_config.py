"""Job configuration: a YAML file (conf/*.yaml, documented in place) plus command-line overrides."""
from __future__ import annotations

import copy
from pathlib import Path

import yaml

from pipelines.errors import UsageError

PACKAGE_DIR = Path(__file__).resolve().parent
REPO_ROOT = PACKAGE_DIR.parent   # the checkout when running from one (samples/, conf/, jobs/ beside pipelines/)
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
    raise ConfigError(f"the default config is missing (looked in {', '.join(map(str, DEFAULT_CONFIG_CANDIDATES))}): "
                      "reinstall sparkseg (pip install sparkseg) or run from a checkout")


def load_config(path: str | Path | None = None) -> dict:
    """The YAML at `path` layered over the embedded default (conf/local.yaml): missing keys keep their defaults."""
    base = yaml.safe_load(default_config_path().read_text(encoding="utf-8"))
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
    """Plain relative paths: relative to the working directory, or else to the checkout this package runs from (so
    the embedded default's samples/ work from anywhere); URIs with a scheme are returned as they are."""
    if "://" in uri or uri.startswith("file:"):
        return uri
    path = Path(uri).expanduser()
    if path.is_absolute() or (Path.cwd() / path).exists() or not (REPO_ROOT / path).exists():
        return str(path.resolve())
    return str((REPO_ROOT / path).resolve())


def local_path(uri: str) -> Path | None:
    """The local filesystem path a URI names (plain paths and file: URIs), or None for other schemes."""
    if uri.startswith("file:"):
        from urllib.parse import unquote, urlparse

        return Path(unquote(urlparse(uri).path))
    return None if "://" in uri else Path(uri).expanduser()


def check_job_settings(config: dict) -> None:
    """Values the YAML's types allow but the job cannot run with; raises ConfigError naming the key and the fix."""
    inference = config["inference"]
    rules = [("inference.partitions", inference["partitions"], 0, "0 means spark.default.parallelism"),
             ("inference.batch_size", inference["batch_size"], 1, "images per Arrow batch"),
             ("inference.max_image_pixels", inference["max_image_pixels"], 1, "the decompression-bomb guard"),
             ("run.commit_every", config["run"]["commit_every"], 0, "0 commits once at the end")]
    for key, value, low, meaning in rules:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            flag = {"inference.partitions": " (--partitions)", "inference.batch_size": " (--batch-size)"}.get(key, "")
            raise ConfigError(f"{key}{flag} is {value!r}: it must be an integer >= {low} ({meaning})")
