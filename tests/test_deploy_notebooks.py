"""The notebooks: the Databricks job notebook runs cell by cell (widgets and the secret scope from
tests/dbutils_standin.py) on a Spark Connect session against Azurite, as on serverless or standard access mode, and on
a classic session over volume-like local paths; its job definitions (serverless, and on a job cluster) match it; and
the Jupyter notebook draws overlays from an output."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pipelines.inference.inference_job import run
from pipelines.io.azure_credentials import AzureCredentials
from pipelines.io.run_lock import LOCK_NAME, LockHeld, RunLock
from pipelines.io.storage import Location
from pipelines.ops.image_decode import decode_image
from pipelines.ops.mask_outputs import decode_rle
from tests.conftest import REPO, SAMPLES
from tests.dbutils_standin import DbutilsStandIn, notebook_cells, run_notebook_source
from tests.fixtures_azurite import ACCOUNT_KEY
from tests.job_helpers import job_config
from tests.test_incremental import write_image

NOTEBOOKS = REPO / "notebooks"
DATABRICKS_NOTEBOOK = NOTEBOOKS / "databricks_infer_yolact.py"
JOB_DEFINITION = NOTEBOOKS / "databricks_job.json"  # serverless
CLASSIC_JOB_DEFINITION = NOTEBOOKS / "databricks_job_classic.json"  # on a job cluster
REQUIREMENTS = NOTEBOOKS / "databricks_requirements.txt"  # the notebook's %pip cell
EXPLORE_NOTEBOOK = NOTEBOOKS / "explore_results.ipynb"
MODEL_DIR = SAMPLES / "models" / "yolact_default"
AZURE_ENV = (
    "AZURE_STORAGE_CONNECTION_STRING",
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "AZURE_CLIENT_ID",
    "AZURE_CLIENT_SECRET",
    "AZURE_TENANT_ID",
)


def jpeg_bytes(seed: int, tmp_path: Path) -> bytes:
    path = tmp_path / f"seed{seed}.jpg"
    write_image(path, seed)
    return path.read_bytes()


def run_notebook_on_connect(remote: str, parameters: dict, secrets: dict, tmp_path: Path):
    """The Databricks notebook run by tests/notebook_on_connect.py on a Spark Connect session of `remote`, in its own
    process, in the notebook's folder (as Databricks runs it), without Azure credentials in its environment."""
    spec = tmp_path / f"spec-{len(list(tmp_path.glob('spec-*')))}.json"
    spec.write_text(
        json.dumps(
            {
                "remote": remote,
                "notebook": str(DATABRICKS_NOTEBOOK),
                "parameters": parameters,
                "secrets": [[scope, key, value] for (scope, key), value in secrets.items()],
            }
        ),
        encoding="utf-8",
    )
    env = {name: value for name, value in os.environ.items() if name not in AZURE_ENV}
    env["PYTHONPATH"] = str(REPO)  # the runner; the notebook finds pipelines/ above its folder itself
    command = [sys.executable, "-m", "tests.notebook_on_connect", str(spec)]
    return subprocess.run(command, cwd=NOTEBOOKS, env=env, capture_output=True, text=True, timeout=600)


def test_databricks_notebook_runs_cell_by_cell_on_spark_connect_against_azurite(connect_server, azurite, tmp_path):
    container = azurite.create_container()
    client = azurite.service_client().get_container_client(container)
    for seed in range(3):
        client.upload_blob(f"landing/day{seed % 2}/img{seed}.jpg", jpeg_bytes(seed, tmp_path))
    client.upload_blob("landing/broken.jpg", b"not a jpeg")
    parameters = {
        "input": f"az://{container}/landing",
        "output": f"az://{container}/out",
        "model": str(MODEL_DIR),
        "engine": "native",
        "precision": "f32",
        "partitions": "2",
        "secret_scope": "sparkseg-test",
        "connection_string_key": "storage-connection-string",
    }
    secrets = {("sparkseg-test", "storage-connection-string"): azurite.connection_string}

    done = run_notebook_on_connect(connect_server, parameters, secrets, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.splitlines()[-1])
    assert result["counts"]["done"] == 3 and result["counts"]["failed"] == 1 and result["counts"]["skipped"] == 0
    assert result["table"] == {"images": 3, "errors": 1, "superseded_rows": 0}
    blobs = [blob.name for blob in client.list_blobs(name_starts_with="out/")]
    assert any(name.startswith("out/detections/") for name in blobs)
    assert any(name.startswith("out/masks/day0/img0.jpg") for name in blobs)
    assert "out/summary.json" in blobs and f"out/{LOCK_NAME}" not in blobs  # the lock was released
    written = b"".join(client.download_blob(name).readall() for name in blobs)
    assert ACCOUNT_KEY.encode() not in written and azurite.connection_string.encode() not in written

    again = run_notebook_on_connect(connect_server, parameters, secrets, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    again = json.loads(again.stdout.splitlines()[-1])
    assert again["counts"]["skipped"] == 4 and again["counts"]["done"] == 0  # a scheduled re-run: nothing new

    credentials = AzureCredentials(connection_string=azurite.connection_string)
    with RunLock.acquire(Location(parameters["output"], credentials), "20990101T000000Z-other-job"):
        before = sorted((blob.name, blob.etag) for blob in client.list_blobs(name_starts_with="out/"))
        held = run_notebook_on_connect(connect_server, parameters, secrets, tmp_path)
        assert held.returncode == 1 and f"{LockHeld.__name__}: " in held.stderr, held.stderr[-3000:]
        assert "20990101T000000Z-other-job" in held.stderr
        assert sorted((blob.name, blob.etag) for blob in client.list_blobs(name_starts_with="out/")) == before


def test_databricks_notebook_runs_on_volume_paths_on_a_classic_session(spark, monkeypatch, tmp_path):
    """The defaults' layout: model, images and outputs in Unity Catalog volumes, local paths on the driver and the
    executors (here a /Volumes-like tree), no secret scope; a classic cluster's session."""
    monkeypatch.chdir(NOTEBOOKS)
    volumes = tmp_path / "Volumes" / "main" / "sparkseg"
    landing = volumes / "images" / "landing"
    for seed in range(2):
        write_image(landing / f"day{seed}" / f"img{seed}.jpg", seed)
    parameters = {
        "input": str(landing),
        "output": str(volumes / "results" / "yolact"),
        "model": str(MODEL_DIR),
        "precision": "f32",
        "partitions": "2",
    }
    result = json.loads(run_notebook_source(DATABRICKS_NOTEBOOK, spark=spark, dbutils=DbutilsStandIn(parameters)))
    assert result["counts"]["done"] == 2 and result["counts"]["failed"] == 0
    assert result["table"] == {"images": 2, "errors": 0, "superseded_rows": 0}
    assert (volumes / "results" / "yolact" / "summary.json").is_file()
    assert any((volumes / "results" / "yolact" / "masks").rglob("*.png"))

    write_image(landing / "day2" / "img2.jpg", 2)  # landed since: an available-now run does it, and only it
    parameters["mode"] = "available-now"
    result = json.loads(run_notebook_source(DATABRICKS_NOTEBOOK, spark=spark, dbutils=DbutilsStandIn(parameters)))
    assert result["counts"]["done"] == 1 and result["counts"]["skipped"] == 2 and result["table"]["images"] == 3
    result = json.loads(run_notebook_source(DATABRICKS_NOTEBOOK, spark=spark, dbutils=DbutilsStandIn(parameters)))
    assert result["counts"] is None, "a second available-now run found something new"


def test_notebook_names_a_missing_secret_clearly(spark, monkeypatch):
    monkeypatch.chdir(NOTEBOOKS)
    dbutils = DbutilsStandIn(
        {"secret_scope": "sparkseg", "connection_string_key": "no-such-key"},
        {("sparkseg", "storage-connection-string"): "AccountName=x;AccountKey=y"},
    )
    with pytest.raises(ValueError, match="cannot read secret 'no-such-key' from Databricks scope 'sparkseg'"):
        run_notebook_source(DATABRICKS_NOTEBOOK, spark=spark, dbutils=dbutils)
    dbutils = DbutilsStandIn({"partitions": "eight"}, {})
    with pytest.raises(ValueError, match=r"widget partitions is 'eight': give a whole number of tasks per wave"):
        run_notebook_source(DATABRICKS_NOTEBOOK, spark=spark, dbutils=dbutils)


def test_job_definitions_run_this_notebook_with_its_widgets_serverless_or_on_a_job_cluster():
    serverless, classic = (json.loads(path.read_text()) for path in (JOB_DEFINITION, CLASSIC_JOB_DEFINITION))
    widget_cell = next(cell for cell in notebook_cells(DATABRICKS_NOTEBOOK) if "dbutils.widgets." in cell)
    widgets = re.findall(r"dbutils\.widgets\.\w+\(\"(\w+)\"", widget_cell)
    for job in (serverless, classic):
        assert job["max_concurrent_runs"] == 1
        assert len(job["schedule"]["quartz_cron_expression"].split()) in (6, 7)
        (task,) = job["tasks"]
        notebook = task["notebook_task"]
        assert notebook["source"] == "GIT" and "git_url" in job["git_source"]
        assert (REPO / f"{notebook['notebook_path']}.py").resolve() == DATABRICKS_NOTEBOOK.resolve()
        assert sorted(notebook["base_parameters"]) == sorted(widgets)  # every widget set, nothing unknown
        dbutils = DbutilsStandIn(notebook["base_parameters"])
        exec(compile(widget_cell, "widgets", "exec"), {"dbutils": dbutils})  # dropdown values must be valid choices
        assert all(dbutils.widgets.get(name) == value for name, value in notebook["base_parameters"].items())
        assert "libraries" not in task  # the notebook installs its own (below), on every kind of compute
        assert notebook["base_parameters"]["model"].startswith("/Volumes/")
    # serverless: no cluster anywhere; on a job cluster: the current LTS Runtime
    assert "job_clusters" not in serverless and not {"job_cluster_key", "existing_cluster_id"} & set(
        serverless["tasks"][0]
    )
    (cluster,) = classic["job_clusters"]
    assert classic["tasks"][0]["job_cluster_key"] == cluster["job_cluster_key"]
    assert cluster["new_cluster"]["spark_version"].startswith("17.3.x-")
    assert {k: v for k, v in serverless.items() if k not in ("name", "description", "job_clusters", "tasks")} == {
        k: v for k, v in classic.items() if k not in ("name", "description", "job_clusters", "tasks")
    }


def test_the_notebook_installs_the_pinned_libraries_the_runtime_lacks():
    """Its first code cell is a %pip install of databricks_requirements.txt (beside it: a notebook runs in its own
    folder), which pins what the executors import beyond the Runtime at constraints.txt's versions."""
    first = notebook_cells(DATABRICKS_NOTEBOOK)[1].strip()  # after the markdown cell
    assert first == f"# MAGIC %pip install -r {REQUIREMENTS.name}"
    lines = [line for line in REQUIREMENTS.read_text().splitlines() if line.strip() and not line.startswith("#")]
    installed = dict(line.split("==") for line in lines)
    assert "openvino" in installed and "torch" not in installed and "pyspark" not in installed
    pins = dict(line.split("==") for line in (REPO / "constraints.txt").read_text().split() if "==" in line)
    for name in ("openvino", "PyYAML", "pycocotools", "numba", "zlib-ng", "av", "azure-storage-blob"):
        assert installed.get(name) == pins[name], name


def test_setup_py_lower_bounds_are_the_oldest_versions_the_databricks_and_bigdl_suites_run_on():
    # make test-databricks runs on scripts/make_databricks_env.sh's Runtime versions, make test-bigdl on
    # scripts/make_bigdl_env.sh's: the oldest of the two is the oldest sparkseg is tested with, so the lower bound
    # setup.py promises for that library
    def pins(script: str) -> dict[str, tuple[int, ...]]:
        text = (REPO / "scripts" / script).read_text()
        found = re.findall(r'"([\w-]+)==([\d.]+)"', text[text.index("RUNTIME_PINS=(") : text.index("if ! ")])
        return {name: tuple(int(part) for part in version.split(".")) for name, version in found}

    databricks, bigdl = pins("make_databricks_env.sh"), pins("make_bigdl_env.sh")
    floors = dict(re.findall(r'"([\w-]+)>=([\d.]+)', (REPO / "setup.py").read_text()))
    for name in (
        "numpy",
        "pillow",
        "pyarrow",
        "pandas",
        "matplotlib",
        "pyspark",
        "grpcio",
        "grpcio-status",
        "googleapis-common-protos",
    ):
        oldest = min(env[name] for env in (databricks, bigdl) if name in env)
        floor = tuple(int(part) for part in floors[name].split("."))
        assert oldest[: len(floor)] == floor, name  # 11.1 for 11.1.0


def test_explore_notebook_draws_overlays_and_sweep_plots(spark, monkeypatch, tmp_path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    notebook = json.loads(EXPLORE_NOTEBOOK.read_text())
    assert notebook["nbformat"] == 4 and EXPLORE_NOTEBOOK.stat().st_size < 20_000
    code_cells = [cell for cell in notebook["cells"] if cell["cell_type"] == "code"]
    assert all(cell["outputs"] == [] and cell["execution_count"] is None for cell in code_cells), "no saved outputs"

    images, output, reports = tmp_path / "images", tmp_path / "out", tmp_path / "reports"
    images.mkdir()
    for name in ("rocket.jpg", "coffee.jpg"):  # photos on which the bundled (random) model has non-empty masks
        (images / name).write_bytes((SAMPLES / "images" / name).read_bytes())
    with Image.open(SAMPLES / "images" / "coffee.jpg") as photo:  # a phone's portrait photo: stored on its side
        exif = photo.getexif()
        exif[0x0112] = 6  # EXIF orientation: rotate 90 degrees clockwise to view
        photo.save(images / "coffee portrait.jpg", exif=exif, quality=95)
    run(spark, job_config(images, output))
    plot = reports / "sweep" / "plots" / "images_per_s_vs_partitions.png"
    plot.parent.mkdir(parents=True)
    figure, ax = plt.subplots()
    ax.plot([1, 2], [3, 4])
    figure.savefig(plot)
    plt.close(figure)

    monkeypatch.chdir(REPO)
    namespace: dict = {"__name__": "__main__"}
    parameters = f"OUTPUT = {str(output)!r}\nREPORTS = {str(reports)!r}\nMIN_SCORE = 0.0\nMAX_INSTANCES = 100\n"
    try:
        for number, cell in enumerate(code_cells):
            exec(compile("".join(cell["source"]), f"explore_results#cell{number}", "exec"), namespace)
            if "parameters" in cell["metadata"].get("tags", []):
                exec(parameters, namespace)  # what papermill's -p does
        rows = namespace["rows"]
        assert len(rows) == 3 and namespace["plots"] == [plot]
        for row in rows:
            decoded = decode_image(Path(row.path.removeprefix("file:")).read_bytes(), row.path)  # EXIF applied
            overlay = namespace["overlay_image"](row)
            assert overlay.shape == decoded.shape == (row.height, row.width, 3)
            drawn = np.zeros(decoded.shape[:2], bool)
            for instance in namespace["drawn_instances"](row):
                drawn |= decode_rle(instance["mask"]).astype(bool)
            assert drawn.any(), "the drawn instances cover no pixel: nothing was tested"
            changed = np.any(overlay != decoded, axis=2)
            # tinted where the masks are: a pixel keeps its value only where it is the tint's colour within rounding
            assert changed[drawn].mean() > 0.99
        assert plt.get_fignums(), "the notebook drew no figure"
    finally:
        plt.close("all")
