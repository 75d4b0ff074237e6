"""The compiled pixel loops where executors import `pipelines` from the library zip the job ships
(spark_session.ship_library): numba caches machine code only beside a real file, so the kernels come from a copy of
their module in the temp directory: a machine's first Python worker compiles them, the next ones load that cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pipelines.spark.spark_session import library_archive
from tests.conftest import REPO

WORKER = """
import json
import numpy as np
from pipelines.ops import compiled_loops

compiled_loops.load()
mask = np.array([[True, False], [True, True]])
stats = compiled_loops.rle_counts.stats
print(json.dumps({"file": compiled_loops.__file__, "cache": stats.cache_path,
                  "hits": sum(stats.cache_hits.values()), "misses": sum(stats.cache_misses.values()),
                  "counts": compiled_loops.rle_counts(mask, 1, 0, 3, 2).tolist()}))
"""


def worker_from_zip(archive: Path, temp: Path) -> dict:
    done = subprocess.run(
        [sys.executable, "-c", WORKER],
        cwd=temp,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(archive), "TMPDIR": str(temp)},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernels_imported_from_the_library_zip_compile_once_per_machine(tmp_path):
    archive = library_archive(REPO / "pipelines", tmp_path / "sparkseg_pipelines.zip")
    temp = tmp_path / "tmp"
    temp.mkdir()
    first, second = worker_from_zip(archive, temp), worker_from_zip(archive, temp)
    for worker in (first, second):
        assert worker["file"].startswith(str(archive)), worker
        assert Path(worker["cache"]).parent.parent == temp, worker
        # the mask one row down in a 3x2 image, column-major: 0 | 1 1 | 0 0 (the column's top, then the next) | 1
        assert worker["counts"] == [1, 2, 2, 1], worker
    assert (first["hits"], first["misses"]) == (0, 1), first
    assert (second["hits"], second["misses"]) == (1, 0), second
