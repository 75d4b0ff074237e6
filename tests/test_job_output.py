"""What a user sees: a normal run of the job script prints a few dozen lines (our progress, warnings that matter,
the summary), not Spark's INFO log, and no Java stack trace for expected states such as a new output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import REPO, SAMPLES

MAX_LINES = 40


def run_job(images: Path, output: Path) -> str:
    done = subprocess.run(
        [
            sys.executable,
            "jobs/infer_yolact.py",
            "--input",
            str(images),
            "--output",
            str(output),
            "--precision",
            "f32",
            "--master",
            "local[2]",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PYSPARK_PYTHON": sys.executable},
    )
    printed = done.stdout + done.stderr
    assert done.returncode == 0, printed[-5000:]
    return printed


def test_a_run_on_a_new_output_and_its_rerun_print_few_lines_and_no_exception(tmp_path):
    images, output = tmp_path / "images", tmp_path / "out"
    images.mkdir()
    for number in (1, 2):
        shutil.copy(SAMPLES / "images" / f"synthetic_road_{number}.jpg", images / f"road_{number}.jpg")
    for expected, progress in (
        ("done 2, failed 0", True),  # a new output
        ("done 0, failed 0 (see errors/), skipped 2", False),
    ):  # then nothing new
        printed = run_job(images, output)
        lines = printed.splitlines()
        assert expected in printed, printed[-3000:]
        assert len(lines) <= MAX_LINES, f"{len(lines)} lines:\n" + printed[-5000:]
        assert "Exception" not in printed and "INFO" not in printed, printed[-5000:]
        assert progress == any(line.startswith("[sparkseg] 2/2 images") for line in lines), printed[-3000:]
