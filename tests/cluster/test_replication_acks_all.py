"""acks=all end to end on three real brokers replicating through their replica fetchers:
librdkafka's idempotent producer writes to a replication factor 3, min.insync.replicas 2
topic, and each record is on the disk files of every ISR replica when its acknowledgement
arrives; a consumer then reads every record in order.

One ZooKeeper ensemble and the three-broker cluster of ``test_cluster_clients`` serve the
module. Waits are on observed states, bounded in time.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from headrace.errors import CorruptMessage
from tests.cluster import test_cluster_clients as clients
from tests.record_reading import iter_headers

RECORDS = 200
BROKER_IDS, WAIT_TIMEOUT_S, wait_until = clients.BROKER_IDS, clients.WAIT_TIMEOUT_S, clients.wait_until
cluster = clients.cluster  # the fixture: three brokers under a chroot of their own


def create_replicated_topic(cluster) -> str:
    name = f"acks-all-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topic = NewTopic(name, 1, 3, config={"min.insync.replicas": "2"})
    for future in admin.create_topics([topic]).values():
        future.result(timeout=WAIT_TIMEOUT_S)
    cluster.wait_for_leaders(name)
    return name


def isr(cluster, topic: str) -> set[int]:
    partition = cluster.metadata(BROKER_IDS[0], [topic]).topics[0].partitions[0]
    return set(partition.isr_nodes)


def local_log_end_offset(partition_dir: Path) -> int:
    """The offset past the last whole batch in a replica's segment files, read from disk (a
    batch being written at the end is not counted)."""
    end = 0
    for segment in sorted(partition_dir.glob("*.log")):
        try:
            for _, header in iter_headers(segment.read_bytes()):
                end = max(end, header.base_offset + header.last_offset_delta + 1)
        except CorruptMessage:  # a partial batch at the end
            pass
    return end


def test_each_acknowledged_record_is_on_every_isr_replica_and_consumed_in_order(cluster):
    topic = create_replicated_topic(cluster)
    wait_until(lambda: isr(cluster, topic) == set(BROKER_IDS), f"a full ISR for {topic}")
    partition_dirs = [cluster.brokers[b].data_dir / f"{topic}-0" for b in BROKER_IDS]
    missing: list[tuple[int, list[int]]] = []

    def on_delivery(error, message) -> None:
        assert error is None, error
        ends = [local_log_end_offset(d) for d in partition_dirs]
        if min(ends) <= message.offset():
            missing.append((message.offset(), ends))

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 0})
    for index in range(RECORDS):
        producer.produce(topic, value=b"v%d" % index, on_delivery=on_delivery)
        producer.poll(0)
    assert producer.flush(WAIT_TIMEOUT_S) == 0
    assert missing == []  # (offset, every replica's log end when it was acknowledged)

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    values: list[bytes] = []
    try:
        wait_until(lambda: _poll_into(consumer, values) >= RECORDS, "every record consumed")
    finally:
        consumer.close()
    assert values == [b"v%d" % index for index in range(RECORDS)]


def _poll_into(consumer, values: list[bytes]) -> int:
    message = consumer.poll(0.5)
    if message is not None and message.error() is None:
        values.append(message.value())
    return len(values)
