"""Fixtures of the replication tests: the power-cut shim built once per session, and
``replicated_cluster(overrides)``, a factory a test module's own module-scoped fixture calls
to run three brokers (each under the shim, so any of them can lose its unflushed writes) in a
chroot of their own of the module's ZooKeeper ensemble; every broker it started is stopped
when the module ends. A test that kills, pauses or power-cuts brokers calls
``cluster.restore()`` before it ends (the fixtures below do it after each test too).
"""

from __future__ import annotations

import uuid

import pytest

from headrace.faults.power_cut import build_shim
from tests.cluster.replication.replicated_cluster import ReplicatedCluster


@pytest.fixture(scope="session")
def power_shim(tmp_path_factory):
    return build_shim(tmp_path_factory.mktemp("power-cut-shim"))


@pytest.fixture(scope="module")
def replicated_cluster(tmp_path_factory, zookeeper_ensemble, power_shim):
    """``start(overrides) -> ReplicatedCluster`` (started, every broker registered)."""
    started: list[ReplicatedCluster] = []

    def start(overrides: dict[str, str] | None = None) -> ReplicatedCluster:
        connect = f"{zookeeper_ensemble.connect_string}/replication-{uuid.uuid4().hex[:8]}"
        cluster = ReplicatedCluster(tmp_path_factory.mktemp("replicated"), connect,
                                    overrides, power_shim=power_shim)
        started.append(cluster)
        cluster.start()
        return cluster

    yield start
    for cluster in started:
        cluster.stop()
