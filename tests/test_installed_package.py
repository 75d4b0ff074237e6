"""sparkseg installed as a wheel (not editable) in a fresh venv runs the job from any directory, with the packaged
default config and with a config of the user's: nothing may depend on a checkout beside the package."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, SAMPLES
from tests.job_helpers import DEFAULT_MODEL_DIR

SITE = f"lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages"


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with the sparkseg wheel built from this checkout's sources (pip install, not editable). Its
    dependencies come from the test venv through a .pth line (installing pyspark and openvino again would only
    take minutes; the env archive's test installs them from the wheel's metadata)."""
    base = tmp_path_factory.mktemp("installed")
    source = base / "src"
    source.mkdir()
    for name in ("setup.py", "README.md", "pipelines", "model_export", "conf"):
        copy = shutil.copytree if (REPO / name).is_dir() else shutil.copy
        copy(REPO / name, source / name)
    wheels = base / "wheels"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(wheels),
            str(source),
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    venv = base / "venv"
    subprocess.run([sys._base_executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    clean = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}  # a checkout on PYTHONPATH
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(venv / "bin" / "python"),
            "install",
            "--quiet",
            "--no-deps",
            str(next(wheels.glob("sparkseg-*.whl"))),
        ],
        check=True,
        capture_output=True,
        timeout=600,
        env=clean,
    )  # would make pip find sparkseg "already installed" (its egg-info)
    assert list((venv / SITE).glob("pipelines")), "the wheel did not install"
    test_site = Path(sys.prefix) / SITE
    (venv / SITE / "zz_test_venv_dependencies.pth").write_text(f"{test_site}\n")
    shutil.rmtree(source)  # nothing may read the sources the wheel was built from
    return venv


def run_installed(venv: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    python = venv / "bin" / "python"
    code = (
        "import sys, pipelines; from pipelines import job_cli; print('PACKAGE', pipelines.__file__); "
        "sys.exit(job_cli.main(sys.argv[1:]))"
    )
    env = {key: value for key, value in os.environ.items() if key not in ("PYTHONPATH",)}
    env["PYSPARK_PYTHON"] = str(python)
    return subprocess.run(
        [str(python), "-c", code, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=900
    )


def test_the_wheel_runs_the_job_from_another_directory_with_and_without_a_config(installed, tmp_path):
    images = tmp_path / "images"
    images.mkdir()
    for name in ("synthetic_road_1.jpg", "coffee.jpg"):
        shutil.copy(SAMPLES / "images" / name, images / name)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    common = ["--input", str(images), "--model", str(DEFAULT_MODEL_DIR), "--precision", "f32"]

    done = run_installed(installed, elsewhere, *common, "--output", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    package = Path(done.stdout.split("PACKAGE ", 1)[1].split()[0])
    assert package.resolve().is_relative_to(installed.resolve()), package
    assert "done 2, failed 0" in done.stdout
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["config"]["inference"]["batch_size"] == 8  # conf/local.yaml's default, from the wheel

    config = elsewhere / "mine.yaml"
    config.write_text("spark:\n  master: local[1]\ninference:\n  batch_size: 2\n")
    done = run_installed(installed, elsewhere, *common, "--output", str(tmp_path / "out2"), "--config", "mine.yaml")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    summary = json.loads((tmp_path / "out2" / "summary.json").read_text())
    assert summary["config"]["inference"]["batch_size"] == 2 and summary["config"]["spark"]["master"] == "local[1]"
    assert summary["counts"]["done"] == 2

    script = subprocess.run(
        [str(installed / "bin" / "sparkseg-infer-yolact"), "--help"],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert script.returncode == 0 and "--input" in script.stdout


def test_the_wheel_without_a_model_or_an_input_says_what_to_pass(installed, tmp_path):
    """The bundled models ship with the checkout, not the wheel; `python -m pipelines.job_cli` exits with the
    job's code."""
    done = run_installed(installed, tmp_path, "--input", str(SAMPLES / "images"), "--output", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "the bundled yolact model is not here" in done.stderr and "pass --model" in done.stderr, done.stderr
    module = subprocess.run(
        [
            str(installed / "bin" / "python"),
            "-m",
            "pipelines.job_cli",
            "--input",
            str(tmp_path / "missing"),
            "--output",
            str(tmp_path / "out"),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert module.returncode == 2 and str(tmp_path / "missing") in module.stderr, module.stderr[-3000:]
