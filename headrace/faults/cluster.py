"""The cluster under fault: three ZooKeeper nodes and three brokers in one network namespace.

``FaultCluster`` owns the nodes of a run's cluster target: ZooKeeper servers 1..3 on
``ZOOKEEPER_HOSTS`` (127.0.0.11-13) and brokers 1..3 on ``BROKER_HOSTS`` (127.0.0.2-4), all
started inside the run's ``Namespace`` with the source-address shim
(``source_address_shim.c``) preloaded, so every packet a node sends carries its own address
and ``Namespace.cut(a, b)`` drops exactly what node a sends node b. The harness's clients stay
on 127.0.0.1 (unbound sockets leave from lo's primary address), so no node cut touches them.

Brokers run with ``BROKER_OVERRIDES`` (RF=3 and min.insync.replicas=2 defaults, a session
timeout of ``SESSION_TIMEOUT_MS``) plus the run's own. The harness watches ZooKeeper with its
own kazoo client (created inside the namespace): broker registrations (a killed broker is
started again only once ZooKeeper dropped its old registration, as a broker refuses to
register over a live one; a restart that cannot happen yet, or exits for want of a ZooKeeper
quorum, is retried at the run's later actions and after healing) and partition states (which broker leads a partition).

Every wait is bounded (``WAIT_TIMEOUT_S``) and polls an observed state. ``close`` kills every
node by pid and stops the kazoo client; the namespace is the runner's to remove.

Thread-safety: one thread (the runner's) drives a cluster.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.cluster.zookeeper_ensemble import SERVING_MODES, server_mode
from headrace.faults.namespace import Namespace
from headrace.faults.node import (
    ZOOKEEPER_CLIENT_PORT,
    BrokerNode,
    Node,
    ZooKeeperNode,
)
from headrace.faults.power_cut import compile_preload_library

BROKER_HOSTS = {1: "127.0.0.2", 2: "127.0.0.3", 3: "127.0.0.4"}
ZOOKEEPER_HOSTS = {1: "127.0.0.11", 2: "127.0.0.12", 3: "127.0.0.13"}
CLIENT_HOST = "127.0.0.1"
BROKER_PORT = 9092
SESSION_TIMEOUT_MS = 6_000
WAIT_TIMEOUT_S = 60.0
RESTART_TIMEOUT_S = 120.0
REGISTRATION_EXPIRY_WAIT_S = 2.5 * SESSION_TIMEOUT_MS / 1000
POLL_INTERVAL_S = 0.1
KAZOO_TIMEOUT_S = 10.0
SOURCE_ADDRESS_SHIM = Path(__file__).with_name("source_address_shim.c")
BROKER_OVERRIDES = {
    "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
    "offsets.topic.replication.factor": "3",
    "offsets.topic.num.partitions": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "group.initial.rebalance.delay.ms": "0",
    "replica.lag.time.max.ms": "6000",
}


def wait_until(observe: Callable[[], object], what: str, timeout_s: float = WAIT_TIMEOUT_S):
    """``observe()``'s first truthy answer, polled every ``POLL_INTERVAL_S``; a TimeoutError
    after ``timeout_s``. ZooKeeper errors while observing count as not yet."""
    deadline = time.monotonic() + timeout_s
    pause = threading.Event()  # never set: a bounded wait between observations
    while True:
        try:
            answer = observe()
        except KazooException:
            answer = None
        if answer:
            return answer
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout_s} s")
        pause.wait(POLL_INTERVAL_S)


class FaultCluster:
    """Three ZooKeeper nodes and three brokers (ids 1..3) inside ``namespace``."""

    def __init__(self, work_dir: Path, namespace: Namespace,
                 overrides: dict[str, str] | None = None, power_shim: Path | None = None,
                 drop_fsync_suffix: str = "") -> None:
        self.namespace = namespace
        shim = compile_preload_library(SOURCE_ADDRESS_SHIM, work_dir / "shim")
        self.zookeepers = {node_id: ZooKeeperNode(node_id, ZOOKEEPER_HOSTS, work_dir, namespace,
                                                  shim) for node_id in ZOOKEEPER_HOSTS}
        connect = ",".join(f"{host}:{ZOOKEEPER_CLIENT_PORT}" for host in ZOOKEEPER_HOSTS.values())
        self.zookeeper_connect = connect
        self.brokers = {
            broker_id: BrokerNode(
                f"broker-{broker_id}", host, BROKER_PORT, work_dir / f"broker-{broker_id}",
                {"broker.id": str(broker_id), "zookeeper.connect": connect,
                 **BROKER_OVERRIDES, **(overrides or {})},
                namespace, power_shim, drop_fsync_suffix=drop_fsync_suffix,
                source_address_shim=shim)
            for broker_id, host in BROKER_HOSTS.items()}
        self.zk: KazooClient | None = None
        self.pending_restarts: set[int] = set()

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.bootstrap for broker in self.brokers.values())

    def nodes(self) -> list[Node]:
        return [*self.zookeepers.values(), *self.brokers.values()]

    def start(self) -> None:
        for node in self.zookeepers.values():
            node.start()
        self.wait_for_zookeeper_quorum()
        self.zk = self.namespace.run_inside(self._started_kazoo, WAIT_TIMEOUT_S)
        for broker in self.brokers.values():
            broker.start()
        wait_until(lambda: self.registered() == set(self.brokers), "every broker to register")

    def _started_kazoo(self) -> KazooClient:
        client = KazooClient(hosts=self.zookeeper_connect, timeout=KAZOO_TIMEOUT_S)
        client.start(timeout=WAIT_TIMEOUT_S)
        return client

    def close(self) -> None:
        """Stop the kazoo client, then kill every node by pid (whatever state it is in)."""
        try:
            if self.zk is not None:
                self.zk.stop()
                self.zk.close()
        finally:
            for node in self.nodes():
                if node.running:
                    node.resume()
                node.kill()

    # --- ZooKeeper's view ----------------------------------------------------------------

    def zookeeper_mode(self, node_id: int) -> str | None:
        return self.namespace.run_inside(
            lambda: server_mode(ZOOKEEPER_HOSTS[node_id], ZOOKEEPER_CLIENT_PORT), 10)

    def wait_for_zookeeper_quorum(self) -> None:
        running = [n for n, node in self.zookeepers.items() if node.running]
        majority = len(self.zookeepers) // 2 + 1
        wait_until(lambda: sum(self.zookeeper_mode(n) in SERVING_MODES for n in running)
                   >= majority, "a ZooKeeper quorum")

    def registered(self) -> set[int]:
        self.zk.sync(paths.BROKER_IDS)
        return {int(child) for child in self.zk.get_children(paths.BROKER_IDS)}

    def leader_of(self, topic: str, partition: int) -> int | None:
        """The partition's leader in ZooKeeper's state znode (None without one)."""
        path = paths.partition_state_path(topic, partition)
        try:
            self.zk.sync(path)
            data, _ = self.zk.get(path)
        except KazooException:
            return None
        state = records.decode_partition_state(data)
        return state.leader if state.has_leader else None

    def restart_broker(self, broker_id: int, expiry_wait_s: float = 0.0) -> bool:
        """Start a killed broker if its old registration expired and it starts (it exits at
        start-up without a ZooKeeper quorum within zookeeper.connection.timeout.ms, which
        other faults may prevent for now); otherwise it is left to ``restart_pending``, as a
        supervisor would retry. Waits up to ``expiry_wait_s`` for the registration to expire.
        True when it started."""
        broker = self.brokers[broker_id]
        self.pending_restarts.add(broker_id)
        try:
            wait_until(lambda: broker_id not in self.registered(),
                       f"broker {broker_id}'s old registration to expire", expiry_wait_s)
            broker.start()
        except (TimeoutError, RuntimeError):  # RuntimeError: exited at start-up (see its log)
            return False
        self.pending_restarts.discard(broker_id)
        return True

    def restart_pending(self, timeout_s: float = RESTART_TIMEOUT_S) -> None:
        """Start again, bounded, every broker whose restart was put off."""
        for broker_id in sorted(self.pending_restarts):
            wait_until(lambda b=broker_id: self.restart_broker(b), f"broker {broker_id} to start",
                       timeout_s)

    def restart_zookeeper(self, node_id: int) -> None:
        """Start a killed ZooKeeper node; it serves once it reaches a quorum, which other
        faults may prevent for now (``wait_until_whole`` waits for it after healing)."""
        self.zookeepers[node_id].start()

    def wait_until_whole(self) -> None:
        """Every ZooKeeper node serves, every broker runs and is registered (after healing)."""
        self.restart_pending()
        wait_until(lambda: all(self.zookeeper_mode(n) in SERVING_MODES for n in self.zookeepers),
                   "every ZooKeeper node to serve")
        wait_until(lambda: self.registered() == set(self.brokers), "every broker to register")
