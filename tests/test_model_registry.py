"""Models from an MLflow registry: the bundled YOLACT export registered in a local sqlite registry (the export's own
--register-as is in test_detector_export.py), run by the job as models:/NAME/VERSION and models:/NAME@ALIAS with the
same detections as the directory itself; URIs that do not resolve stop the job before any work, exit 2, one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import mlflow
import mlflow.tracking._model_registry.utils as registry_state
import mlflow.tracking._tracking_service.utils as tracking_state
import mlflow.tracking.fluent as fluent_state
import pytest

from model_export.cli import main as export_main
from pipelines.inference.inference_job import run
from pipelines.io.model_registry import register_model_dir
from pipelines.job_cli import main as job_main
from tests.conftest import REPO
from tests.job_helpers import DEFAULT_MODEL_DIR, job_config, read_rows, sample_copies

MODEL_NAME = "yolact-roads"
IMAGES = ("synthetic_road_1.jpg", "synthetic_road_2.jpg", "chelsea.jpg")
# The JVM-less client env (make client-env): an inference-only install, without mlflow.
CLIENT_PYTHON = Path(os.environ.get("SPARKSEG_CLIENT_VENV", REPO / ".venv-client")) / "bin" / "python"


def read_the_environment(patch: pytest.MonkeyPatch) -> None:
    """MLflow's process-wide URIs and active experiment unset, so that it reads the environment's: other tests in
    the same process (training: pipelines.training.tracking; other registrations) set them process-wide, and MLflow
    prefers those to the env's."""
    patch.setattr(tracking_state, "_tracking_uri", None)
    patch.setattr(registry_state, "_registry_uri", None)
    patch.setattr(fluent_state, "_active_experiment_id", None)
    patch.delenv("MLFLOW_EXPERIMENT_ID", raising=False)


@pytest.fixture(autouse=True)
def mlflow_reads_the_environment(monkeypatch):
    read_the_environment(monkeypatch)


@pytest.fixture(scope="module")
def registry(tmp_path_factory) -> str:
    """A sqlite tracking and registry store with the bundled YOLACT export as version 1 of MODEL_NAME, alias
    `champion`; the environment names it (as MLflow reads it) for the module's tests."""
    root = tmp_path_factory.mktemp("registry")
    uri = f"sqlite:///{root / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as env:
        read_the_environment(env)
        env.setenv("MLFLOW_TRACKING_URI", uri)
        env.setenv("MLFLOW_EXPERIMENT_NAME", "sparkseg-exports")
        # the run's artifacts under the test's directory (MLflow's default is ./mlruns, wherever the tests run)
        mlflow.MlflowClient().create_experiment("sparkseg-exports", artifact_location=(root / "artifacts").as_uri())
        assert register_model_dir(DEFAULT_MODEL_DIR, MODEL_NAME) == f"models:/{MODEL_NAME}/1"
        mlflow.MlflowClient().set_registered_model_alias(MODEL_NAME, "champion", "1")
        yield uri


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return sample_copies(tmp_path_factory.mktemp("images"), IMAGES)


@pytest.fixture(scope="module")
def directory_run(spark, images, tmp_path_factory) -> tuple[dict, dict]:
    output = tmp_path_factory.mktemp("from_directory")
    summary = run(spark, job_config(images, output))
    return summary, detections(spark, output)


def detections(spark, output: Path) -> dict:
    """path -> the image's instances (class, score, box), as the detections table holds them."""
    return {
        Path(row.path).name: [(i.class_id, i.score, tuple(i.box)) for i in row.instances]
        for row in read_rows(spark, output, "detections")
    }


@pytest.mark.parametrize("uri", [f"models:/{MODEL_NAME}/1", f"models:/{MODEL_NAME}@champion"])
def test_a_registered_model_gives_the_directorys_detections(spark, registry, images, directory_run, tmp_path, uri):
    reference_summary, reference = directory_run
    summary = run(spark, job_config(images, tmp_path / "out", model_dir=uri))
    assert summary["counts"]["done"] == len(IMAGES) and summary["counts"]["failed"] == 0
    assert summary["model"]["sha256"] == reference_summary["model"]["sha256"]
    assert summary["model"]["given"] == uri
    found = detections(spark, tmp_path / "out")
    assert found == reference and sum(map(len, found.values())) > 0  # same IR, same settings: exactly equal


@pytest.mark.parametrize(
    "uri, problem",
    [
        ("models:/no-such-model/1", "(name=no-such-model, version=1) not found"),
        ("models:/no-such-model@champion", "no-such-model"),
        (f"models:/{MODEL_NAME}/7", "version=7) not found"),
        (f"models:/{MODEL_NAME}@staging", "alias staging not found"),
    ],
)
def test_a_uri_that_does_not_resolve_stops_the_job_with_one_line(registry, images, tmp_path, capsys, uri, problem):
    output = tmp_path / "out"
    assert job_main(["--input", str(images), "--output", str(output), "--model", uri]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith(f"error: {uri}: ") and problem in err, err
    assert "MLFLOW_REGISTRY_URI" in err and not output.exists()


def test_no_registry_at_the_uri_mlflow_reads_stops_the_job(images, tmp_path, capsys, monkeypatch):
    missing = tmp_path / "nowhere" / "mlflow.db"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{missing}")
    output = tmp_path / "out"
    assert job_main(["--input", str(images), "--output", str(output), "--model", f"models:/{MODEL_NAME}/1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no MLflow registry at sqlite:///" in err and "MLFLOW_TRACKING_URI" in err, err
    assert not output.exists() and not missing.parent.exists()


def test_a_malformed_models_uri_is_a_usage_error(images, tmp_path, capsys):
    assert job_main(["--input", str(images), "--output", str(tmp_path / "out"), "--model", "models:/yolact"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "error: models:/yolact: not a registered model's URI: give models:/NAME/VERSION or models:/NAME@ALIAS"


def test_an_install_without_mlflow_says_what_to_do(images, tmp_path):
    """The inference-only client env has no mlflow: a directory model never imports it, a models:/ URI is exit 2."""
    output = tmp_path / "out"
    command = [str(CLIENT_PYTHON), str(REPO / "jobs" / "infer_yolact.py"), "--input", str(images)]
    done = subprocess.run(
        [*command, "--output", str(output), "--model", f"models:/{MODEL_NAME}/1"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"error: models:/{MODEL_NAME}/1: a models:/ URI needs mlflow, which this Python lacks: pip install mlflow "
        "(or sparkseg[mlflow])"
    ]
    assert not output.exists()
    probe = "import sys, pipelines.job_cli; print('mlflow' in sys.modules)"
    imported = subprocess.run([str(CLIENT_PYTHON), "-c", probe], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert imported.stdout.strip() == "False", imported.stderr


def test_register_as_checks_the_registry_before_exporting(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # the discard port: nothing answers
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    out = tmp_path / "export"
    args = ["detector", "--config", "factornet_small", "--random-init", "--out", str(out), "--register-as", "roads"]
    assert export_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and err.startswith("error: --register-as roads: the model registry http://127.0.0.1:9")
    assert not out.exists()
