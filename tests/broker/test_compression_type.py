"""compression.type end to end: a real broker process recompresses what clients produce.

A topic created with ``compression.type=zstd`` receives uncompressed batches from
confluent-kafka; the segment file on disk must hold zstd batches (codec bits of each batch's
attributes), and a consumer must get back exactly the records that were produced.
"""

from __future__ import annotations

import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from headrace.protocol.batch import COMPRESSION_MASK
from headrace.protocol.compression import ZSTD
from headrace.protocol.records import decode_batch
from tests.record_reading import iter_headers

CLIENT_TIMEOUT_S = 30
RECORD_COUNT = 200


def _records() -> list[tuple[bytes | None, bytes | None, list]]:
    records = []
    for i in range(RECORD_COUNT):
        key = None if i % 9 == 4 else f"key-{i}".encode()
        value = None if i % 13 == 6 else f"value-{i}-".encode() * (i % 17 + 1)
        headers = [("trace", f"{i}".encode())] if i % 3 else []
        records.append((key, value, headers))
    return records


def _produce(bootstrap: str, topic: str, records) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "none",
                         "linger.ms": 20, "batch.num.messages": 50})
    for key, value, headers in records:
        producer.produce(topic, value=value, key=key, headers=headers, partition=0)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0


def _consume(bootstrap: str, topic: str, count: int) -> list[tuple]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])  # no group join: fetch from offset 0
    received = []
    try:
        for _ in range(CLIENT_TIMEOUT_S * 10):
            if len(received) >= count:
                break
            for message in consumer.consume(count - len(received), timeout=0.1):
                assert message.error() is None, message.error()
                received.append((message.key(), message.value(), message.headers() or []))
    finally:
        consumer.close()
    return received


def test_zstd_topic_stores_zstd_batches_and_serves_identical_records(broker):
    topic = f"zstd-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": "zstd"})]
                        )[topic].result(CLIENT_TIMEOUT_S)
    records = _records()
    _produce(broker.bootstrap, topic, records)

    segment = broker.data_dir / f"{topic}-0" / f"{0:020d}.log"
    data = segment.read_bytes()
    headers = list(iter_headers(data, verify_crc=True))
    assert headers and {h.attributes & COMPRESSION_MASK for _, h in headers} == {ZSTD}
    stored = [record for position, _ in headers for record in decode_batch(data, position).records]
    assert [r.offset for r in stored] == list(range(RECORD_COUNT))
    assert [(r.key, r.value, [(h.key, h.value) for h in r.headers]) for r in stored] == \
        [(k, v, h) for k, v, h in records]

    assert _consume(broker.bootstrap, topic, RECORD_COUNT) == [
        (k, v, [tuple(h) for h in hs]) for k, v, hs in records]
