"""Cluster fixtures: a real ZooKeeper ensemble, kazoo clients, brokers in cluster mode.

``zookeeper_ensemble`` (module-scoped): a three-node ``ZooKeeperEnsemble`` under the module's
tmp dir (JVM start-ups cost seconds: one ensemble per test module). A test that kills or pauses
a node must bring it back (``restart``/``resume``) before it ends.
``zookeeper_chroot``: a chroot of this test's own (``/t<n>-<test name>``) so that tests sharing
the ensemble never see each other's znodes. ``zookeeper_client``: a kazoo client at the
ensemble's root (paths include the chroot), stopped after the test.
``cluster_brokers``: ``start(broker_id, **overrides) -> BrokerProcess`` of a broker in the
test's chroot (``zookeeper.connect`` = ensemble + chroot, a short session timeout), serving
once its port accepts; ``start_registered(client, broker_id)`` also waits for its
``/brokers/ids/<id>``; every broker it started is stopped after the test.

``wait_for_znode(client, path, present, timeout_s)`` waits on a kazoo watch (no polling) until
``path`` exists (or no longer does); it fails the test after ``timeout_s``. ZooKeeper's reads
are sequentially consistent per client only: the node a test's client talks to may not have
applied another client's write yet, so a test reading what a broker wrote calls
``synced(client, path)`` first (ZooKeeper's ``sync``) or waits with a watch.
"""

from __future__ import annotations

import itertools
import re
import threading
import time

import pytest
from kazoo.client import KazooClient

from headrace.cluster.zookeeper_ensemble import ZooKeeperEnsemble
from tests.conftest import BrokerProcess, stop_brokers

ZOOKEEPER_CONNECT_TIMEOUT_S = 30.0
ZNODE_TIMEOUT_S = 30.0
# ZooKeeper grants sessions between 2 and 20 ticks (tickTime=500 ms): 2 s expires a killed
# broker's registration quickly.
BROKER_SESSION_TIMEOUT_MS = 2000
FIRST_GENERATED_ID = 1001  # /brokers/seqid's first version (1) + reserved.broker.max.id (1000)
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


def synced(client: KazooClient, path: str) -> str:
    """``path``, after the client's server caught up with the leader (``sync``)."""
    client.sync(path)
    return path


class ClusterBrokers:
    """Brokers in cluster mode under one chroot; stopped by the fixture."""

    def __init__(self, tmp_path, ensemble: ZooKeeperEnsemble, chroot: str) -> None:
        self.tmp_path = tmp_path
        self.chroot = chroot
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

    def registration_path(self, broker_id: int) -> str:
        """``/brokers/ids/<id>`` under the chroot, as a root client sees it."""
        return f"{self.chroot}/brokers/ids/{broker_id}"

    def start_registered(self, client: KazooClient, broker_id: int,
                         **overrides: str) -> tuple[BrokerProcess, str]:
        """Start a broker and wait (a watch on ``client``) until it is registered; returns it
        with its registration path. ``broker_id`` -1: the path of the first generated id."""
        broker = self.start(broker_id, **overrides)
        path = self.registration_path(broker_id if broker_id >= 0 else FIRST_GENERATED_ID)
        wait_for_znode(client, path)
        return broker, path

    def stop_all(self) -> None:
        stop_brokers(self.started)


@pytest.fixture
def cluster_brokers(tmp_path, zookeeper_ensemble, zookeeper_chroot):
    brokers = ClusterBrokers(tmp_path, zookeeper_ensemble, zookeeper_chroot)
    yield brokers
    brokers.stop_all()
