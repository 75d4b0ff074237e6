"""Session-scoped Spark standalone cluster: 2 workers x 1 core, 1g each, on 127.0.0.1 (free ports)."""

from __future__ import annotations

import shutil

import pytest

from pipelines.sweeps.standalone_cluster import ClusterConfig, StandaloneCluster

__all__ = ["standalone_cluster"]


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory) -> StandaloneCluster:
    base = tmp_path_factory.mktemp("standalone")
    with StandaloneCluster(ClusterConfig(workers=2, cores=1, memory="1g"), base_dir=base) as cluster:
        yield cluster
    # The executors' directories hold each application's unpacked env archive (~700 MB per worker); the daemons'
    # logs stay.
    shutil.rmtree(base / "work", ignore_errors=True)
