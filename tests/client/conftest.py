"""Fixtures for client tests: one broker per session, topics, producing, committed offsets.

``bootstrap`` is the only place that starts a broker: by default a headrace broker process
(tests/conftest.py's BrokerProcess) that allows the short session timeouts these tests use;
HEADRACE_TEST_PEER=tansu runs the Tansu peer (see ../shared/bench/README.md) instead, a
broker we did not write. Scratch files live under /tmp/parallel-consumer/.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import BrokerProcess, tansu_peer

SCRATCH_DIR = Path("/tmp/parallel-consumer")
# Group session timeout the client tests use: short so a SIGKILLed member leaves quickly.
GROUP_SESSION_TIMEOUT_MS = 1_000


@pytest.fixture(scope="session")
def bootstrap(tmp_path_factory):
    """A running broker for the session: yields "127.0.0.1:PORT"."""
    if os.environ.get("HEADRACE_TEST_PEER") != "tansu":
        data_dir = tmp_path_factory.mktemp("client-broker") / "data"
        data_dir.mkdir()
        broker = BrokerProcess(data_dir, {
            "group.min.session.timeout.ms": str(GROUP_SESSION_TIMEOUT_MS // 2),
            "group.initial.rebalance.delay.ms": "0",
        })
        broker.start()
        try:
            yield broker.bootstrap
        finally:
            broker.stop()
        return
    with tansu_peer(SCRATCH_DIR) as peer_bootstrap:
        yield peer_bootstrap


def create_topic(bootstrap: str, partitions: int, prefix: str = "pc") -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})  # must outlive its futures
    futures = admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    for future in futures.values():
        future.result(30)
    return name


def produce_records(bootstrap: str, topic: str, count: int, partitions: int,
                    keys: int | None = None) -> None:
    """``count`` records spread round-robin over ``partitions``; value = b"<index>"."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for index in range(count):
        key = f"k{index % keys}".encode() if keys else None
        producer.produce(topic, key=key, value=str(index).encode(), partition=index % partitions)
    assert producer.flush(30) == 0


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    """The group's committed offset per partition (negative: none)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        result = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], 30)
        return {tp.partition: tp.offset for tp in result}
    finally:
        consumer.close()


def consumer_config(bootstrap: str, group: str, **overrides) -> dict:
    return {"bootstrap.servers": bootstrap, "group.id": group,
            "auto.offset.reset": "earliest",
            "session.timeout.ms": GROUP_SESSION_TIMEOUT_MS,
            "heartbeat.interval.ms": GROUP_SESSION_TIMEOUT_MS // 3, **overrides}


READ_COMMITTED_TIMEOUT_S = 60.0
READ_COMMITTED_POLL_S = 0.5


def read_committed_messages(bootstrap: str, topic: str, partitions: int) -> list:
    """Every message of ``topic`` a read_committed consumer sees, read until each partition's
    position reaches its last stable offset (bounded by READ_COMMITTED_TIMEOUT_S)."""
    import time

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "read-committed-checker",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    try:
        assigned = [TopicPartition(topic, partition, 0) for partition in range(partitions)]
        consumer.assign(assigned)
        ends = {tp.partition: consumer.get_watermark_offsets(tp, timeout=10)[1]
                for tp in assigned}
        messages = []
        deadline = time.monotonic() + READ_COMMITTED_TIMEOUT_S
        while time.monotonic() < deadline:
            positions = {tp.partition: tp.offset for tp in consumer.position(assigned)}
            if all(end == 0 or positions[p] >= end for p, end in ends.items()):
                return messages
            message = consumer.poll(READ_COMMITTED_POLL_S)
            if message is not None and message.error() is None:
                messages.append(message)
        raise AssertionError(f"read_committed did not reach {ends} in "
                             f"{READ_COMMITTED_TIMEOUT_S} s")
    finally:
        consumer.close()
