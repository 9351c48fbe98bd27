"""Cluster fixtures: a real ZooKeeper ensemble, kazoo clients, brokers in cluster mode.

``zookeeper_ensemble`` (module-scoped): a three-node ``ZooKeeperEnsemble`` under the module's
tmp dir (JVM start-ups cost seconds: one ensemble per test module). A test that kills or pauses
a node must bring it back (``restart``/``resume``) before it ends.
``zookeeper_chroot``: a chroot of this test's own (``/t<n>-<test name>``) so that tests sharing
the ensemble never see each other's znodes. ``zookeeper_client``: a kazoo client at the
ensemble's root (paths include the chroot), stopped after the test.
``cluster_brokers``: ``start(broker_id, **overrides) -> BrokerProcess`` of a broker registered
under the test's chroot (``zookeeper.connect`` = ensemble + chroot, a short session timeout);
every broker it started is stopped after the test.

``wait_for_znode(client, path, present, timeout_s)`` waits on a kazoo watch (no polling) until
``path`` exists (or no longer does); it fails the test after ``timeout_s``.
"""

from __future__ import annotations

import itertools
import re
import threading
import time

import pytest
from kazoo.client import KazooClient

from headrace.cluster.zookeeper_ensemble import ZooKeeperEnsemble
from tests.conftest import BrokerProcess

ZOOKEEPER_CONNECT_TIMEOUT_S = 30.0
ZNODE_TIMEOUT_S = 30.0
# ZooKeeper grants sessions between 2 and 20 ticks (tickTime=500 ms): 2 s expires a killed
# broker's registration quickly.
BROKER_SESSION_TIMEOUT_MS = 2000
_chroot_numbers = itertools.count(1)


@pytest.fixture(scope="module")
def zookeeper_ensemble(tmp_path_factory):
    ensemble = ZooKeeperEnsemble(tmp_path_factory.mktemp("zookeeper"), size=3)
    ensemble.start()
    yield ensemble
    ensemble.stop()


@pytest.fixture
def zookeeper_chroot(request) -> str:
    name = re.sub(r"[^A-Za-z0-9_-]", "_", request.node.name)[:60]
    return f"/t{next(_chroot_numbers)}-{name}"


@pytest.fixture
def zookeeper_client(zookeeper_ensemble):
    client = KazooClient(hosts=zookeeper_ensemble.connect_string)
    client.start(timeout=ZOOKEEPER_CONNECT_TIMEOUT_S)
    yield client
    client.stop()
    client.close()


def wait_for_znode(client: KazooClient, path: str, present: bool = True,
                   timeout_s: float = ZNODE_TIMEOUT_S) -> None:
    """Until ``path`` exists (``present``) or is gone, woken by an exists-watch."""
    deadline = time.monotonic() + timeout_s
    changed = threading.Event()
    while (client.exists(path, watch=lambda _event: changed.set()) is not None) != present:
        remaining_s = deadline - time.monotonic()
        if remaining_s <= 0 or not changed.wait(remaining_s):
            pytest.fail(f"{path} {'did not appear' if present else 'did not go'} "
                        f"within {timeout_s} s")
        changed.clear()


class ClusterBrokers:
    """Brokers in cluster mode under one chroot; stopped by the fixture."""

    def __init__(self, tmp_path, ensemble: ZooKeeperEnsemble, chroot: str) -> None:
        self.tmp_path = tmp_path
        self.zookeeper_connect = ensemble.connect_string + chroot
        self.started: list[BrokerProcess] = []

    def process(self, broker_id: int, **overrides: str) -> BrokerProcess:
        """A broker not started yet (``.start()`` waits until its port accepts)."""
        data_dir = self.tmp_path / f"broker-{broker_id}-{len(self.started)}"
        data_dir.mkdir(parents=True)
        settings = {"broker.id": str(broker_id), "zookeeper.connect": self.zookeeper_connect,
                    "zookeeper.session.timeout.ms": str(BROKER_SESSION_TIMEOUT_MS)}
        broker = BrokerProcess(data_dir, {**settings, **overrides})
        self.started.append(broker)
        return broker

    def start(self, broker_id: int, **overrides: str) -> BrokerProcess:
        broker = self.process(broker_id, **overrides)
        broker.start()
        return broker

    def stop_all(self) -> None:
        for broker in self.started:
            broker.stop()


@pytest.fixture
def cluster_brokers(tmp_path, zookeeper_ensemble, zookeeper_chroot):
    brokers = ClusterBrokers(tmp_path, zookeeper_ensemble, zookeeper_chroot)
    yield brokers
    brokers.stop_all()
