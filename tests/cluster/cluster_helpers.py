"""Helpers of the controller tests: brokers registered by their own kazoo sessions, a bounded
wait on observed ZooKeeper state, and reading partition states and controller records (synced:
the clients of a test may be connected to different nodes of the ensemble)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from kazoo.client import KazooClient

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records

WAIT_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.02
SESSION_TIMEOUT_S = 4.0
T = TypeVar("T")


def wait_until(observe: Callable[[], T], what: str, timeout_s: float = WAIT_TIMEOUT_S) -> T:
    """Poll ``observe`` until it returns a truthy value (bounded in time); that value."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = observe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(POLL_INTERVAL_S)


def zookeeper_client(connect_string: str, session_timeout_s: float = SESSION_TIMEOUT_S) -> KazooClient:
    client = KazooClient(hosts=connect_string, timeout=session_timeout_s)
    client.start(timeout=WAIT_TIMEOUT_S)
    for path in paths.PERSISTENT_PATHS:
        client.ensure_path(path)
    return client


def register_broker(connect_string: str, broker_id: int) -> KazooClient:
    """A session holding ``/brokers/ids/<id>`` as a broker's would; stop it to kill the broker."""
    client = zookeeper_client(connect_string)
    registration = records.BrokerRegistration(
        broker_id=broker_id, host="127.0.0.1", port=1000 + broker_id,
        endpoints=(f"PLAINTEXT://127.0.0.1:{1000 + broker_id}",), timestamp_ms=0,
    )
    client.create(paths.broker_id_path(broker_id), records.encode_broker_registration(registration),
                  ephemeral=True)
    return client


def close(client: KazooClient) -> None:
    client.stop()
    client.close()


def partition_state(zk: KazooClient, topic: str, partition: int) -> records.PartitionState | None:
    """The state as ZooKeeper has it now: ``sync`` first, as ``zk`` may be connected to another
    ensemble node than the writer, which may not have applied the write yet."""
    zk.sync(paths.partition_state_path(topic, partition))
    if zk.exists(paths.partition_state_path(topic, partition)) is None:
        return None
    return records.decode_partition_state(zk.get(paths.partition_state_path(topic, partition))[0])


def topic_states(zk: KazooClient, topic: str, partitions: int) -> dict[int, records.PartitionState] | None:
    """Every partition's state, or None while one is missing."""
    states = {p: partition_state(zk, topic, p) for p in range(partitions)}
    return None if None in states.values() else states


def controller_epoch(zk: KazooClient) -> int:
    zk.sync(paths.CONTROLLER_EPOCH)
    return records.decode_controller_epoch(zk.get(paths.CONTROLLER_EPOCH)[0])


def controller_id(zk: KazooClient) -> int | None:
    zk.sync(paths.CONTROLLER)
    if zk.exists(paths.CONTROLLER) is None:
        return None
    return records.decode_controller_registration(zk.get(paths.CONTROLLER)[0]).broker_id
