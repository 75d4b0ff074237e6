"""Models in an MLflow model registry: `models:/NAME/VERSION` and `models:/NAME@ALIAS` wherever a job takes an export
directory (model.dir, --model), and the export stage's `--register-as NAME`.

The registry is the one MLflow itself reads: MLFLOW_REGISTRY_URI, else MLFLOW_TRACKING_URI (on Databricks, Unity
Catalog's or the workspace's). A URI is downloaded once, on the driver, into a directory under the temp dir named by
the registry and the model version, and the job ships that directory like any export directory. mlflow is optional
(setup.py's `mlflow` extra): only these paths import it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from pipelines.errors import UsageError

SCHEME = "models:/"
MANIFEST_NAME = "manifest.json"  # the export directory's contract (pipelines.inference.model_manifest)
ARTIFACT_PATH = "model"  # where a registered export's files sit among its run's artifacts
INSTALL_HINT = "pip install mlflow (or sparkseg[mlflow])"
FORMS = "models:/NAME/VERSION or models:/NAME@ALIAS"
# The driver resolves the URI before any work: a registry that does not answer fails within seconds (mlflow's
# default, 7 retries with exponential backoff, waits about four minutes). A user's own setting wins.
QUICK_RETRIES = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR": "false"}


class RegistryError(UsageError):
    """A models:/ URI that cannot be used, or a registration that failed: nothing ran (exit 2)."""


@dataclass(frozen=True)
class RegistryModel:
    """A parsed models:/ URI: a version or an alias of the registered model `name`."""

    uri: str
    name: str
    version: str | None
    alias: str | None


def is_registry_uri(value: str | None) -> bool:
    return bool(value) and str(value).startswith(SCHEME)


def parse_model_uri(uri: str) -> RegistryModel:
    """`models:/NAME/VERSION` (VERSION a number) or `models:/NAME@ALIAS`; NAME may be Unity Catalog's
    catalog.schema.model. Anything else raises RegistryError naming the forms."""
    rest = uri[len(SCHEME) :] if uri.startswith(SCHEME) else ""
    by_alias = re.fullmatch(r"([^/@]+)@([A-Za-z0-9_-]+)", rest)
    if by_alias:
        return RegistryModel(uri, by_alias.group(1), None, by_alias.group(2))
    by_version = re.fullmatch(r"([^/@]+)/([0-9]+)", rest)
    if by_version:
        return RegistryModel(uri, by_version.group(1), by_version.group(2), None)
    raise RegistryError(f"{uri}: not a registered model's URI: give {FORMS}")


def _mlflow(what: str):
    """The mlflow module (optional: only models:/ URIs and --register-as need it), or RegistryError naming `what`."""
    try:
        import mlflow
    except ImportError:
        raise RegistryError(f"{what} needs mlflow, which this Python lacks: {INSTALL_HINT}") from None
    for key, value in QUICK_RETRIES.items():
        os.environ.setdefault(key, value)
    return mlflow


def _one_line(error: BaseException) -> str:
    """An MLflow error's message on one line, credentials in URIs left out."""
    text = " ".join(str(getattr(error, "message", None) or error).split())
    return _redacted(text[:400])


def _redacted(uri: str) -> str:
    return re.sub(r"//[^/@\s]+@", "//***@", uri)


def _check_local_store(uri: str, registry: str) -> None:
    """A sqlite or file registry must exist already: MLflow would create an empty one (files written where the job
    runs) and then not find the model in it."""
    parsed = urllib.parse.urlparse(registry)
    if parsed.scheme == "sqlite":
        path = Path(registry[len("sqlite:///") :])
    elif parsed.scheme == "file" or (not parsed.scheme and not registry.startswith("databricks")):
        path = Path(urllib.request.url2pathname(parsed.path) if parsed.scheme else registry)
    else:
        return  # a server, a database or Databricks: asked in the request, which fails naming the problem
    if str(path) != ":memory:" and not path.exists():
        raise RegistryError(
            f"{uri}: no MLflow registry at {registry} (MLflow's default where none is set): set MLFLOW_REGISTRY_URI "
            "or MLFLOW_TRACKING_URI to the registry that holds the model"
        )


def download_model(uri: str) -> Path:
    """The export directory a models:/ URI names, downloaded once per model version into the temp dir (a later job
    on this machine reuses it; the manifest's hashes are verified by whoever loads it). Raises RegistryError for a URI
    that does not resolve (unknown name, version or alias, no registry), naming the URI and what to do."""
    model = parse_model_uri(uri)
    mlflow = _mlflow(f"{uri}: a models:/ URI")
    from mlflow.exceptions import MlflowException  # mlflow's own error type, importable once mlflow is

    registry = mlflow.get_registry_uri()
    _check_local_store(uri, registry)
    client = mlflow.MlflowClient(registry_uri=registry)
    try:
        if model.alias is not None:
            found = client.get_model_version_by_alias(model.name, model.alias)
        else:
            found = client.get_model_version(model.name, model.version)
    except MlflowException as error:
        raise RegistryError(
            f"{uri}: {_one_line(error)} (registry {_redacted(registry)}): check the name, version or alias, or set "
            "MLFLOW_REGISTRY_URI / MLFLOW_TRACKING_URI to the registry that holds it"
        ) from None
    key = "\0".join(map(str, (registry, model.name, found.version, found.creation_timestamp, found.source)))
    target = Path(tempfile.gettempdir()) / f"sparkseg-registry-{hashlib.sha256(key.encode()).hexdigest()[:16]}"
    if not (target / MANIFEST_NAME).is_file():
        _download(mlflow, MlflowException, f"{SCHEME}{model.name}/{found.version}", uri, target)
    return target


def _download(mlflow, mlflow_error: type[Exception], version_uri: str, uri: str, target: Path) -> None:
    """Download `version_uri` into a fresh directory, then move it to `target` in one step (a job that stops halfway
    leaves no partial copy to be reused; another job that got there first keeps its copy)."""
    tmp = Path(tempfile.mkdtemp(prefix=target.name + "."))
    try:
        mlflow.artifacts.download_artifacts(artifact_uri=version_uri, dst_path=str(tmp))
        if not (tmp / MANIFEST_NAME).is_file():
            raise RegistryError(
                f"{uri}: {version_uri} holds no {MANIFEST_NAME}: register an export directory "
                "(python -m model_export FAMILY ... --register-as NAME)"
            )
        if target.exists():
            shutil.rmtree(target, ignore_errors=True)  # an incomplete copy (a complete one has its manifest)
        try:
            os.replace(tmp, target)
        except OSError:
            pass  # another job placed it first
    except (mlflow_error, OSError) as error:
        raise RegistryError(f"{uri}: downloading {version_uri} failed: {_one_line(error)}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def check_registry(name: str) -> None:
    """Before an export that ends with `--register-as name`: mlflow is here and the registry answers (minutes of
    export are not spent for a registration that cannot happen)."""
    mlflow = _mlflow("--register-as")
    from mlflow.exceptions import MlflowException

    registry = mlflow.get_registry_uri()
    try:
        mlflow.MlflowClient(registry_uri=registry).search_registered_models(max_results=1)
    except MlflowException as error:
        raise RegistryError(
            f"--register-as {name}: the model registry {_redacted(registry)} does not answer ({_one_line(error)}): "
            "set MLFLOW_REGISTRY_URI / MLFLOW_TRACKING_URI to a reachable registry"
        ) from None


def register_model_dir(model_dir: str | Path, name: str) -> str:
    """Log the export directory `model_dir` (manifest.json and the files it lists) as the artifacts of an MLflow run
    (the experiment MLflow picks: MLFLOW_EXPERIMENT_NAME / MLFLOW_EXPERIMENT_ID, else its default) and register them
    as a new version of `name`. Returns the version's URI, models:/NAME/VERSION."""
    root = Path(model_dir)
    if not (root / MANIFEST_NAME).is_file():
        raise RegistryError(f"{root}: no {MANIFEST_NAME}: register an export directory (python -m model_export ...)")
    mlflow = _mlflow("--register-as")
    from mlflow.exceptions import MlflowException

    try:
        with mlflow.start_run(run_name=f"export {name}", nested=mlflow.active_run() is not None) as run:
            mlflow.set_tag("sparkseg.manifest_sha256", hashlib.sha256((root / MANIFEST_NAME).read_bytes()).hexdigest())
            mlflow.log_artifacts(str(root), artifact_path=ARTIFACT_PATH)
        version = mlflow.register_model(f"{run.info.artifact_uri}/{ARTIFACT_PATH}", name)
    except MlflowException as error:
        raise RegistryError(f"--register-as {name}: registering {root} failed: {_one_line(error)}") from None
    return f"{SCHEME}{name}/{version.version}"
