"""Decompression bombs against a real broker process: refused with Kafka's error code in
bounded memory, and the broker keeps serving.

Each bomb is one v2 batch, a few MiB at most, whose records section inflates to 1 GiB
(``BOMB_INFLATED_BYTES``); it is built with a streaming compressor, so the test never holds
the inflated bytes. Two shapes:

* ``record`` -- one well-formed record whose value is 1 GiB of zeros: Kafka's record walk
  would read all of it; headrace stops at ``MAX_RECORDS_SECTION_BYTES`` (MESSAGE_TOO_LARGE);
* ``zeros`` -- 1 GiB of zeros, no valid record (the reported 181 KB zstd batch): the first
  record has length 0, INVALID_RECORD (Kafka's DefaultRecord reader), after one chunk.

Snappy's format cannot inflate more than ~21x, so its bomb is a raw snappy block whose
preamble declares 1 GiB: refused (MESSAGE_TOO_LARGE) before anything is allocated.

Each is produced with the raw wire client to a topic that keeps the producer's codec and to
one whose ``compression.type`` forces recompression, while a thread samples the broker's
VmRSS from /proc until the response arrives: the growth must stay within
``RSS_GROWTH_LIMIT_BYTES`` (a fresh broker each, whose heap holds no pages an earlier bomb
freed). Then a confluent-kafka producer and consumer still work.
``max.message.bytes`` is raised on these topics (``TOPIC_MAX_MESSAGE_BYTES``) because lz4's
format caps its ratio near 255:1: a 1 GiB lz4 bomb needs some 4.3 MB.
"""

from __future__ import annotations

import struct
import threading
import time
import uuid
from functools import cache
from pathlib import Path

import cramjam
import crc32c
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from headrace.errors import InvalidRecord, MessageTooLarge
from headrace.protocol import compression, wire
from headrace.protocol.compression import GZIP, LZ4, SNAPPY, ZSTD
from headrace.protocol.records import build_batch, write_varint
from tests.broker.raw_client import RawClient

PRODUCE = 0
PRODUCE_VERSION = 9
BOMB_INFLATED_BYTES = 1 << 30
ZERO_CHUNK = bytes(1 << 20)
RSS_GROWTH_LIMIT_BYTES = 64 << 20
TOPIC_MAX_MESSAGE_BYTES = 8 << 20
RSS_SAMPLE_INTERVAL_S = 0.002
CLIENT_TIMEOUT_S = 30
RECOMPRESS_TARGET = {GZIP: "zstd", SNAPPY: "zstd", LZ4: "zstd", ZSTD: "lz4"}
EXPECTED_ERROR = {
    (GZIP, "record"): MessageTooLarge.code, (GZIP, "zeros"): InvalidRecord.code,
    (LZ4, "record"): MessageTooLarge.code, (LZ4, "zeros"): InvalidRecord.code,
    (ZSTD, "record"): MessageTooLarge.code, (ZSTD, "zeros"): InvalidRecord.code,
    (SNAPPY, "record"): MessageTooLarge.code, (SNAPPY, "zeros"): MessageTooLarge.code,
}


def _record_prefix(value_bytes: int) -> bytes:
    """Length and fields of a record with key b"k" up to its value's first byte; the one
    header-count byte (0) follows the value."""
    body = bytearray(b"\x00")  # attributes
    write_varint(body, 0)  # timestamp delta
    write_varint(body, 0)  # offset delta
    write_varint(body, 1)
    body += b"k"
    write_varint(body, value_bytes)
    prefix = bytearray()
    write_varint(prefix, len(body) + value_bytes + 1)
    return bytes(prefix + body)


def _section_chunks(shape: str):
    """The inflated records section of a bomb, a chunk at a time."""
    if shape == "record":
        yield _record_prefix(BOMB_INFLATED_BYTES)
    yield from (ZERO_CHUNK for _ in range(BOMB_INFLATED_BYTES // len(ZERO_CHUNK)))
    if shape == "record":
        yield b"\x00"  # header count


def _uvarint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _lying_snappy_block(shape: str) -> bytes:
    """One raw snappy block of 1 MiB of the section whose preamble declares 1 GiB+."""
    head = _record_prefix(BOMB_INFLATED_BYTES) if shape == "record" else b""
    block = bytes(cramjam.snappy.compress_raw(head + ZERO_CHUNK))
    declared_bytes = cramjam.snappy.decompress_raw_len(block)
    return _uvarint(len(head) + BOMB_INFLATED_BYTES + 1) + block[len(_uvarint(declared_bytes)):]


@cache
def _bomb_batch(codec: int, shape: str) -> bytes:
    if codec == SNAPPY:
        payload = _lying_snappy_block(shape)
    else:
        compressor = compression.StreamCompressor(codec)
        payload = b"".join([*map(compressor.compress, _section_chunks(shape)),
                            compressor.finish()])
    now_ms = int(time.time() * 1000)
    covered = struct.pack(">hiqqqhii", codec, 0, now_ms, now_ms, -1, -1, -1, 1) + payload
    return struct.pack(">qiibI", 0, 9 + len(covered), -1, 2, crc32c.crc32c(covered)) + covered


def _vm_rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


class _RssSampler(threading.Thread):
    """Samples a process's VmRSS until stopped; ``peak_bytes`` is the largest seen."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_bytes = _vm_rss_bytes(pid)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            self.peak_bytes = max(self.peak_bytes, _vm_rss_bytes(self.pid))
            self.stopped.wait(RSS_SAMPLE_INTERVAL_S)


def _produce_raw(client: RawClient, topic: str, batch: bytes) -> int:
    body = client.request(PRODUCE, PRODUCE_VERSION, {"acks": -1, "timeout": 30000, "topic_data": [
        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
    return body.responses[0].partition_responses[0].error_code


def _produce_bomb_sampling_rss(broker, topic: str, batch: bytes) -> tuple[int, int, int]:
    """(error code, RSS before, peak RSS while the request was handled)."""
    with RawClient(broker.bootstrap) as client:
        frame = wire.encode_request(
            PRODUCE, PRODUCE_VERSION, 1, "bomb",
            wire.build(wire.request_class(PRODUCE, PRODUCE_VERSION), {
                "acks": -1, "timeout": 30000, "topic_data": [
                    {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}))
        sampler = _RssSampler(broker.pid)
        before_bytes = sampler.peak_bytes
        sampler.start()
        try:
            client.send_bytes(frame)
            _, body = wire.decode_response(PRODUCE, PRODUCE_VERSION, client.receive_frame())
        finally:
            sampler.stopped.set()
            sampler.join()
    return body.responses[0].partition_responses[0].error_code, before_bytes, sampler.peak_bytes


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


@pytest.mark.parametrize("shape", ["record", "zeros"])
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
    with RawClient(broker.bootstrap) as client:  # the log exists before RSS is measured
        assert _produce_raw(client, topic, warm_up) == 0
    batch = _bomb_batch(codec, shape)
    assert len(batch) <= TOPIC_MAX_MESSAGE_BYTES

    error_code, before_bytes, peak_bytes = _produce_bomb_sampling_rss(broker, topic, batch)

    assert error_code == EXPECTED_ERROR[codec, shape]
    assert peak_bytes - before_bytes <= RSS_GROWTH_LIMIT_BYTES, (
        f"RSS grew {(peak_bytes - before_bytes) >> 20} MiB")
    assert _client_round_trip(broker.bootstrap, topic, b"still serving") == [
        b"warm-up", b"still serving"]
