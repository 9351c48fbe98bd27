"""The hand-written Fetch response encoder: kio decodes what it writes, on every version; the
follower's v12 decoder reads what kio and the encoder write, records as views of the frame,
and refuses every truncation of a frame."""

from __future__ import annotations

import os
import struct
import uuid

import pytest

from headrace.broker.fetch_response import (
    PartitionData,
    TopicData,
    decode_fetch_response,
    encode_fetch_body,
)
from headrace.protocol import wire
from headrace.storage.segment import FileSlice

FETCH = 1
FOLLOWER_FETCH_VERSION = 12
RECORDS = b"batch-bytes-" * 50


@pytest.fixture
def records_file(tmp_path):
    path = tmp_path / "records"
    path.write_bytes(b"\xff" * 7 + RECORDS)
    fd = os.open(path, os.O_RDONLY)
    yield FileSlice(fd, 7, len(RECORDS))
    os.close(fd)


def _topics(records: FileSlice) -> list[TopicData]:
    with_data = PartitionData(2, 0, 1_000_000_000_123, 1_000_000_000_123, 17,
                              (records,), records.length)
    failed = PartitionData(5, 1, 40, 40, 3)  # OFFSET_OUT_OF_RANGE, no records
    empty = PartitionData(0, 0, 9, 9, 0)
    return [TopicData("orders", uuid.UUID(int=0x1234), [with_data, failed]),
            TopicData("ünïcode", uuid.UUID(int=0x5678), [empty])]


@pytest.mark.parametrize("version", range(4, 17))
def test_every_version_decodes_with_kio_to_what_was_encoded(version, records_file):
    topics = _topics(records_file)
    parts, size = encode_fetch_body(version, 0, 0, topics)
    body = b"".join(part if isinstance(part, bytes) else part.read_bytes() for part in parts)
    assert len(body) == size
    assert records_file in parts  # the records go out as the slice, not as copied bytes
    decoded = wire.read_entity(wire.response_class(FETCH, version), body, 0)[0]
    assert [getattr(t, "topic_id", None) if version >= 13 else t.topic
            for t in decoded.responses] == [
        t.topic_id if version >= 13 else t.name for t in topics]
    for kio_topic, topic in zip(decoded.responses, topics, strict=True):
        for kio_partition, partition in zip(kio_topic.partitions, topic.partitions, strict=True):
            assert (kio_partition.partition_index, kio_partition.error_code,
                    kio_partition.high_watermark, kio_partition.last_stable_offset) == (
                partition.partition_index, partition.error_code, partition.high_watermark,
                partition.last_stable_offset)
            if version >= 5:
                assert kio_partition.log_start_offset == partition.log_start_offset
            if version >= 11:
                assert kio_partition.preferred_read_replica == -1
            assert not kio_partition.aborted_transactions
            assert (kio_partition.records or b"") == (RECORDS if partition.slices else b"")


@pytest.mark.parametrize("version", [7, 12, 16])
def test_a_session_error_answer_carries_the_code_and_no_topics(version):
    parts, size = encode_fetch_body(version, 70, 0, [])  # FETCH_SESSION_ID_NOT_FOUND
    body = b"".join(parts)
    decoded = wire.read_entity(wire.response_class(FETCH, version), body, 0)[0]
    assert len(body) == size
    assert (decoded.error_code, decoded.session_id, decoded.responses) == (70, 0, ())


@pytest.mark.parametrize("version", range(4, 17))
def test_aborted_transactions_decode_with_kio_on_every_version(version, records_file):
    aborted = ((4_000, 17), (4_001, 1_000_000_000_000))
    partition = PartitionData(3, 0, 50, 12, 0, (records_file,), records_file.length, aborted)
    parts, _ = encode_fetch_body(version, 0, 0, [TopicData("t", uuid.UUID(int=1), [partition])])
    body = b"".join(part if isinstance(part, bytes) else part.read_bytes() for part in parts)
    decoded = wire.read_entity(wire.response_class(FETCH, version), body, 0)[0]
    [kio_partition] = decoded.responses[0].partitions
    assert [(t.producer_id, t.first_offset) for t in kio_partition.aborted_transactions] == \
        list(aborted)
    assert (kio_partition.last_stable_offset, kio_partition.records) == (12, RECORDS)
    if version >= 11:
        assert kio_partition.preferred_read_replica == -1


def _kio_v12_frame(correlation_id: int = 7) -> bytes:
    """A Fetch v12 response frame (no length prefix) written by kio: two topics, aborted
    transactions, null records."""
    body = wire.build(wire.response_class(FETCH, FOLLOWER_FETCH_VERSION), {
        "error_code": 0, "session_id": 0, "responses": [
            {"topic": "orders", "partitions": [
                {"partition_index": 2, "high_watermark": 1_000_000_000_123,
                 "log_start_offset": 17, "records": RECORDS,
                 "aborted_transactions": [{"producer_id": 4_000, "first_offset": 3}]},
                {"partition_index": 5, "error_code": 1, "high_watermark": 40,
                 "log_start_offset": 3, "records": None}]},
            {"topic": "ünïcode", "partitions": [{"partition_index": 0, "records": b""}]}]})
    header = wire.RequestHeader(FETCH, FOLLOWER_FETCH_VERSION, correlation_id, None)
    return wire.encode_response(header, body)[4:]


def test_the_follower_decoder_reads_kio_frames_with_records_as_views_of_the_frame():
    frame = bytearray(_kio_v12_frame())
    response = decode_fetch_response(frame)
    assert response.error_code == 0
    assert [(p.topic, p.partition_index, p.error_code, p.high_watermark, p.log_start_offset,
             bytes(p.records)) for p in response.partitions] == [
        ("orders", 2, 0, 1_000_000_000_123, 17, RECORDS), ("orders", 5, 1, 40, 3, b""),
        ("ünïcode", 0, 0, 0, -1, b"")]
    assert response.partitions[0].records.obj is frame  # not copied


def test_the_follower_decoder_reads_the_encoders_frames(records_file):
    parts, _ = encode_fetch_body(FOLLOWER_FETCH_VERSION, 0, 0, _topics(records_file))
    body = b"".join(part if isinstance(part, bytes) else part.read_bytes() for part in parts)
    frame = struct.pack(">i", 9) + b"\x00" + body  # correlation id, header tagged fields
    response = decode_fetch_response(frame)
    assert [(p.topic, p.partition_index, p.error_code, p.high_watermark, p.log_start_offset,
             bytes(p.records)) for p in response.partitions] == [
        ("orders", 2, 0, 1_000_000_000_123, 17, RECORDS), ("orders", 5, 1, 40, 3, b""),
        ("ünïcode", 0, 0, 9, 0, b"")]


def test_the_follower_decoder_refuses_every_truncated_frame():
    frame = _kio_v12_frame()
    for size in range(len(frame)):
        with pytest.raises(wire.MalformedFrame):
            decode_fetch_response(frame[:size])
