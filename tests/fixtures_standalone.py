"""Session-scoped Spark standalone cluster: 2 workers x 1 core, 1g each, on 127.0.0.1 (free ports)."""
from __future__ import annotations

import pytest

from pipelines.standalone_cluster import ClusterConfig, StandaloneCluster

__all__ = ["standalone_cluster"]


@pytest.fixture(scope="session")
def standalone_cluster(tmp_path_factory) -> StandaloneCluster:
    with StandaloneCluster(ClusterConfig(workers=2, cores=1, memory="1g"),
                           base_dir=tmp_path_factory.mktemp("standalone")) as cluster:
        yield cluster
