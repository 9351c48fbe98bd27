"""Decompression bombs against a real broker process: refused with Kafka's error code in
bounded memory, and the broker keeps serving.

Each bomb (``tests.decompression_bombs``) is one v2 batch, a few MiB at most, whose records
section inflates to 1 GiB (``BOMB_INFLATED_BYTES``), built with a streaming compressor so the
test never holds the inflated bytes:

* ``record`` -- one well-formed record whose value is 1 GiB of zeros: Kafka's record walk
  would read all of it; headrace stops at ``MAX_RECORDS_SECTION_BYTES`` (MESSAGE_TOO_LARGE);
* ``zeros`` -- 1 GiB of zeros, no valid record (the reported 181 KB zstd batch): the first
  record has length 0, INVALID_RECORD (Kafka's DefaultRecord reader), after one chunk;
* snappy (whose format cannot inflate more than ~21x): a raw block whose preamble declares
  1 GiB, refused (MESSAGE_TOO_LARGE) before anything is allocated.

Each is produced with the raw wire client to a topic that keeps the producer's codec and to
one whose ``compression.type`` forces recompression, while a thread samples the broker's
VmRSS from /proc until the response arrives: the growth must stay within
``RSS_GROWTH_LIMIT_BYTES`` (a fresh broker each, whose heap holds no pages an earlier bomb
freed). Then a confluent-kafka producer and consumer still work.
``max.message.bytes`` is raised on these topics (``TOPIC_MAX_MESSAGE_BYTES``) because lz4's
format caps its ratio near 255:1: a 1 GiB lz4 bomb needs some 4.3 MB.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from headrace.errors import CorruptMessage, InvalidRecord, MessageTooLarge
from headrace.protocol.compression import GZIP, LZ4, SNAPPY, ZSTD
from headrace.protocol.records import build_batch
from tests.broker.raw_client import RawClient
from tests.decompression_bombs import (
    LEGACY_PRODUCE_VERSION,
    PRODUCE_VERSION,
    SHAPES,
    RssSampler,
    bomb_batch,
    legacy_bomb,
    produce_error_code,
    produce_frame,
)

BOMB_INFLATED_BYTES = 1 << 30
RSS_GROWTH_LIMIT_BYTES = 64 << 20
TOPIC_MAX_MESSAGE_BYTES = 8 << 20
CLIENT_TIMEOUT_S = 30
BOMB_TIMESTAMP_MS = int(time.time() * 1000)
RECOMPRESS_TARGET = {GZIP: "zstd", SNAPPY: "zstd", LZ4: "zstd", ZSTD: "lz4"}
EXPECTED_ERROR = {
    (GZIP, "record"): MessageTooLarge.code, (GZIP, "zeros"): InvalidRecord.code,
    (LZ4, "record"): MessageTooLarge.code, (LZ4, "zeros"): InvalidRecord.code,
    (ZSTD, "record"): MessageTooLarge.code, (ZSTD, "zeros"): InvalidRecord.code,
    (SNAPPY, "record"): MessageTooLarge.code, (SNAPPY, "zeros"): MessageTooLarge.code,
}


def _produce_sampling_rss(broker, topic: str, batch: bytes,
                          version: int = PRODUCE_VERSION) -> tuple[int, int, int]:
    """(error code, RSS before, peak RSS while the request was handled)."""
    with RawClient(broker.bootstrap) as client:
        frame = produce_frame(topic, batch, version=version)
        sampler = RssSampler(broker.pid)
        sampler.start()
        try:
            client.send_bytes(frame)
            response = client.receive_frame()
        finally:
            sampler.stopped.set()
            sampler.join()
    return produce_error_code(response, version), sampler.start_bytes, sampler.peak_bytes


def _create_topic(bootstrap: str, topic: str, compression_type: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {"compression.type": compression_type,
              "max.message.bytes": str(TOPIC_MAX_MESSAGE_BYTES)}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(CLIENT_TIMEOUT_S)


def _client_round_trip(bootstrap: str, topic: str, value: bytes) -> list[bytes]:
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": "lz4"})
    producer.produce(topic, key=b"after", value=value, partition=0)
    assert producer.flush(CLIENT_TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    received: list[bytes] = []
    try:
        for _ in range(CLIENT_TIMEOUT_S * 10):
            if received and received[-1] == value:
                break
            for message in consumer.consume(10, timeout=0.1):
                assert message.error() is None, message.error()
                received.append(message.value())
    finally:
        consumer.close()
    return received


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4, ZSTD],
                         ids=["gzip", "snappy", "lz4", "zstd"])
@pytest.mark.parametrize("topic_codec", ["producer", "recompress"])
def test_bomb_is_refused_in_bounded_memory_and_the_broker_keeps_serving(
        fresh_broker, codec, shape, topic_codec):
    broker = fresh_broker  # its own process: no memory freed by an earlier bomb to reuse
    compression_type = RECOMPRESS_TARGET[codec] if topic_codec == "recompress" else "producer"
    topic = f"bomb-{uuid.uuid4().hex[:10]}"
    _create_topic(broker.bootstrap, topic, compression_type)
    warm_up = build_batch([(b"k", b"warm-up", [], int(time.time() * 1000))], compression=codec)
    error_code, _, _ = _produce_sampling_rss(broker, topic, warm_up)  # the log exists
    assert error_code == 0
    batch = bomb_batch(codec, shape, BOMB_INFLATED_BYTES, BOMB_TIMESTAMP_MS)
    assert len(batch) <= TOPIC_MAX_MESSAGE_BYTES

    error_code, before_bytes, peak_bytes = _produce_sampling_rss(broker, topic, batch)

    assert error_code == EXPECTED_ERROR[codec, shape]
    assert peak_bytes - before_bytes <= RSS_GROWTH_LIMIT_BYTES, (
        f"RSS grew {(peak_bytes - before_bytes) >> 20} MiB")
    assert _client_round_trip(broker.bootstrap, topic, b"still serving") == [
        b"warm-up", b"still serving"]


@pytest.mark.parametrize("codec", [GZIP, LZ4], ids=["gzip", "lz4"])
def test_legacy_wrapper_bomb_is_refused_in_bounded_memory(fresh_broker, codec):
    """A magic-1 wrapper in Produce v2 (up-converted by the produce handler: Produce v3+
    refuse magic 0/1 with INVALID_RECORD, as Kafka does) whose inner message set is followed
    by 1 GiB of zeros: CORRUPT_MESSAGE at the first bad inner entry."""
    broker = fresh_broker
    topic = f"legacy-bomb-{uuid.uuid4().hex[:10]}"
    _create_topic(broker.bootstrap, topic, "producer")
    warm_up = build_batch([(b"k", b"warm-up", [], int(time.time() * 1000))], compression=codec)
    assert _produce_sampling_rss(broker, topic, warm_up)[0] == 0
    bomb = legacy_bomb(codec, BOMB_INFLATED_BYTES, BOMB_TIMESTAMP_MS)

    error_code, before_bytes, peak_bytes = _produce_sampling_rss(broker, topic, bomb,
                                                                 LEGACY_PRODUCE_VERSION)

    assert error_code == CorruptMessage.code
    assert peak_bytes - before_bytes <= RSS_GROWTH_LIMIT_BYTES, (
        f"RSS grew {(peak_bytes - before_bytes) >> 20} MiB")
    assert _client_round_trip(broker.bootstrap, topic, b"still serving") == [
        b"warm-up", b"still serving"]
