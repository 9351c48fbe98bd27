"""The sink's idempotent Produce client against a real broker, and its request encoding."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import USE_TANSU, new_topic, unique_name

from headrace.client.broker_connection import request_header_bytes
from headrace.errors import InvalidRecord, UnknownTopicOrPartition
from headrace.protocol import wire
from headrace.protocol.compression import LZ4, NONE
from headrace.protocol.kernel import decode_columns
from headrace.spark.encoder import BinaryColumn, ProducerFields, encode_batches
from headrace.spark.wire_fetch import (
    LATEST_TIMESTAMP,
    FetchClientConfig,
    PartitionFetchClient,
)
from headrace.spark.wire_produce import (
    PRODUCE_KEY,
    IdempotentProducer,
    ProduceClientConfig,
    UnsupportedProducerConfig,
    _Batch,
    encode_produce_request,
)
from headrace.storage.clock import SystemClock


def _column(values: list[bytes | None]) -> BinaryColumn:
    lengths = [len(value or b"") for value in values]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    valid = np.array([value is not None for value in values])
    return BinaryColumn(offsets, b"".join(value or b"" for value in values), valid)


def _send(producer: IdempotentProducer, topic: str, partition: int, values: list,
          keys: list | None = None, codec: int = NONE, batch_bytes: int = 1 << 20) -> list:
    """Encode ``values`` for one partition with the producer's fields and queue them."""
    base = producer.reserve_sequences(topic, partition, len(values))
    encoded = encode_batches(
        len(values), None if keys is None else _column(keys), _column(values), None, None,
        np.arange(len(values), dtype=np.int32), SystemClock().now_ms(),
        ProducerFields(producer.producer_id, producer.producer_epoch, base), codec, batch_bytes)
    batches = encoded.batches()
    producer.send(topic, partition, batches)
    return batches


def _stored_values(bootstrap: str, topic: str, partition: int) -> list[bytes]:
    client = PartitionFetchClient(
        FetchClientConfig.from_client_options({"bootstrap.servers": bootstrap}), topic,
        partition)
    try:
        end = client.list_offset(LATEST_TIMESTAMP)
        values, offset = [], 0
        while offset < end:
            client.send_fetch(offset)
            fetched = client.receive_fetch()
            assert fetched.error_code == 0
            columns = decode_columns(fetched.records)
            assert columns.next_offset > offset
            values += [bytes(columns.value_data[columns.value_offsets[i]:
                                                columns.value_offsets[i + 1]])
                       for i in range(columns.count)]
            offset = columns.next_offset
        return values
    finally:
        client.close()


def _producer(bootstrap: str, **options: str) -> IdempotentProducer:
    return IdempotentProducer(ProduceClientConfig.from_client_options(
        {"bootstrap.servers": bootstrap, **options}))


def test_a_multi_partition_write_lands_in_order(bootstrap):
    topic = new_topic(bootstrap, 3)
    producer = _producer(bootstrap, **{"compression.type": "lz4"})
    try:
        expected = {}
        for partition in range(3):
            expected[partition] = [b"p%d-%03d" % (partition, i) for i in range(200)]
            _send(producer, topic, partition, expected[partition], codec=LZ4, batch_bytes=500)
        assert producer.flush() == 600
    finally:
        producer.close()
    for partition in range(3):
        assert _stored_values(bootstrap, topic, partition) == expected[partition]


def test_the_same_batches_sent_twice_are_stored_once(bootstrap):
    topic = new_topic(bootstrap, 1)
    producer = _producer(bootstrap)
    try:
        batches = _send(producer, topic, 0, [b"a", b"b", b"c"], batch_bytes=80)
        assert len(batches) > 1
        producer.send(topic, 0, batches)  # a retry: the same bytes, the same sequences
        producer.flush()
        _send(producer, topic, 0, [b"d"])
        producer.flush()
    finally:
        producer.close()
    assert _stored_values(bootstrap, topic, 0) == [b"a", b"b", b"c", b"d"]


@pytest.mark.skipif(USE_TANSU, reason="Tansu accepts keyless records on compacted topics")
def test_keyless_records_on_a_compacted_topic_fail_with_invalid_record(bootstrap):
    topic = unique_name()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1, config={
            "cleanup.policy": "compact"})]).values():
        future.result(timeout=30)
    producer = _producer(bootstrap)
    try:
        _send(producer, topic, 0, [b"v"], keys=[None])
        with pytest.raises(InvalidRecord, match=f"{topic}-0"):
            producer.flush()
    finally:
        producer.close()


def test_a_partition_the_topic_lacks_is_refused(bootstrap):
    topic = new_topic(bootstrap, 2)
    producer = _producer(bootstrap)
    try:
        with pytest.raises(UnknownTopicOrPartition, match="unknown partition"):
            _send(producer, topic, 2, [b"v"])
    finally:
        producer.close()


@pytest.mark.parametrize("version", range(3, 13))
def test_produce_requests_decode_as_kafka_encodes_them(version):
    batches = [_Batch(("t1", 0), memoryview(b"batch-one"), 1, 0),
               _Batch(("t1", 4), memoryview(b"batch-four"), 1, 0),
               _Batch(("t2", 1), memoryview(b"other"), 1, 0)]
    header = request_header_bytes(PRODUCE_KEY, version, 7, "me", version >= 9)
    frame = b"".join(bytes(piece) for piece in
                     encode_produce_request(header, version, 1500, batches))
    header_entity, position = wire.parse_request_header(frame)
    assert (header_entity.api_version, header_entity.correlation_id) == (version, 7)
    body_class = wire.request_class(PRODUCE_KEY, version)
    if body_class.__flexible__:
        position = wire.skip_tagged_fields(frame, position)
    kio_body = wire.read_entity(body_class, frame, position)[0]
    broker_body = wire.decode_request(frame).body
    expected = [("t1", [(0, b"batch-one"), (4, b"batch-four")]), ("t2", [(1, b"other")])]
    assert (kio_body.transactional_id, kio_body.acks,
            wire.milliseconds(kio_body.timeout)) == (None, -1, 1500)
    assert (broker_body.transactional_id, broker_body.acks, broker_body.timeout_ms) == (
        None, -1, 1500)
    for body in (kio_body, broker_body):
        assert [(topic.name, [(p.index, bytes(p.records)) for p in topic.partition_data])
                for topic in body.topic_data] == expected


def test_options_it_cannot_honour_are_named():
    config = ProduceClientConfig.from_client_options({
        "bootstrap.servers": "a:1", "compression.codec": "lz4", "message.max.bytes": "2048",
        "message.timeout.ms": "900", "max.in.flight": "2", "acks": "-1", "linger.ms": "5"})
    assert (config.codec, config.max_request_bytes) == (LZ4, 2048)
    assert (config.delivery_timeout_ms, config.max_in_flight_requests) == (900, 2)
    for options in ({"acks": "1"}, {"enable.idempotence": "false"},
                    {"security.protocol": "SSL"}, {"sasl.mechanism": "PLAIN"},
                    {"max.in.flight.requests.per.connection": "6"}):
        with pytest.raises(UnsupportedProducerConfig):
            ProduceClientConfig.from_client_options({"bootstrap.servers": "a:1", **options})


def test_a_lost_connection_resends_the_same_batches_and_one_copy_is_kept(bootstrap):
    topic = new_topic(bootstrap, 1)
    producer = _producer(bootstrap, **{"retry.backoff.ms": "10"})
    try:
        assert len(_send(producer, topic, 0, [b"a", b"b", b"c"], batch_bytes=80)) > 1
        broken = [leader.connection for leader in producer._leaders.values()]
        for connection in broken:  # fault injection: the answers become unreadable
            connection._socket.shutdown(socket.SHUT_RD)
        assert producer.flush() == 3
        assert not {id(leader.connection) for leader in producer._leaders.values()} & {
            id(connection) for connection in broken}  # it reconnected and resent
    finally:
        producer.close()
    assert _stored_values(bootstrap, topic, 0) == [b"a", b"b", b"c"]
