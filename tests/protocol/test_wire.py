"""The sans-I/O wire codec: framing, headers, kio bodies and the known client traps."""

import datetime
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import UnsupportedVersion
from headrace.protocol import wire

EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _epoch_milliseconds(value: datetime.datetime | int | None) -> int:
    """A kio timestamp as milliseconds since the epoch (-1 for None)."""
    if value is None:
        return -1
    if isinstance(value, int):
        return value
    return (value - EPOCH) // datetime.timedelta(milliseconds=1)


def _api_versions_request_frame(version: int, correlation_id: int, client_id: str | None) -> bytes:
    body = wire.build(
        wire.request_class(18, version),
        {"client_software_name": "librdkafka", "client_software_version": "2.16.1"},
    )
    return wire.encode_request(18, version, correlation_id, client_id, body)


def test_golden_request_header_v2_bytes():
    frame = _api_versions_request_frame(3, correlation_id=7, client_id="rdkafka")
    expected_payload = (
        struct.pack(">hhi", 18, 3, 7)  # api key, version, correlation id
        + struct.pack(">h", 7)
        + b"rdkafka"  # client_id: always a legacy int16 string
        + b"\x00"  # header tagged fields (header v2)
        + b"\x0blibrdkafka"  # compact string: length + 1
        + b"\x072.16.1"
        + b"\x00"  # body tagged fields
    )
    assert frame == struct.pack(">i", len(expected_payload)) + expected_payload


def test_frame_reader_reassembles_byte_by_byte_and_pipelined():
    frames = [_api_versions_request_frame(3, n, "c") for n in range(3)]
    reader = wire.FrameReader()
    seen = []
    for byte in b"".join(frames):
        reader.receive_data(bytes([byte]))
        frame = reader.next_frame()
        if frame is not None:
            seen.append(wire.decode_request(frame).header.correlation_id)
    assert seen == [0, 1, 2]
    assert reader.buffered_bytes == 0


def test_frame_reader_enforces_the_size_limit():
    reader = wire.FrameReader(max_frame_bytes=100)
    reader.receive_data(struct.pack(">i", 101))
    with pytest.raises(wire.FrameTooLarge):
        reader.next_frame()
    negative = wire.FrameReader()
    negative.receive_data(struct.pack(">i", -1))
    with pytest.raises(wire.MalformedFrame):
        negative.next_frame()


def test_unknown_tagged_fields_are_skipped_in_header_and_body():
    frame = _api_versions_request_frame(3, 9, "c")[4:]
    header_end = 2 + 2 + 4 + 2 + 1
    unknown_tag = bytes([1, 42, 3]) + b"xyz"  # one field: tag 42, 3 bytes
    with_header_tag = frame[:header_end] + unknown_tag + frame[header_end + 1 :]
    with_body_tag = frame[:-1] + unknown_tag
    for variant in (with_header_tag, with_body_tag):
        request = wire.decode_request(variant)
        assert request.body.client_software_name == "librdkafka"
        assert request.body.client_software_version == "2.16.1"


def test_trailing_bytes_after_a_body_are_ignored():
    frame = _api_versions_request_frame(3, 9, "c")[4:] + b"\x00\x00trailing"
    assert wire.decode_request(frame).body.client_software_version == "2.16.1"


def test_null_client_id_and_unknown_api_key():
    request = wire.decode_request(_api_versions_request_frame(2, 1, None)[4:])
    assert request.header.client_id is None
    unknown = struct.pack(">hhih", 999, 0, 1, -1)
    with pytest.raises(UnsupportedVersion):
        wire.decode_request(unknown)


def test_api_versions_response_uses_header_v0_even_when_flexible():
    header = wire.RequestHeader(18, 3, 5, "c")
    body = wire.build(wire.response_class(18, 3), {"error_code": 0, "api_keys": []})
    frame = wire.encode_response(header, body)
    assert frame[4:8] == struct.pack(">i", 5)
    assert frame[8:10] == b"\x00\x00"  # error code right after the correlation id: no tag byte
    produce_header = wire.RequestHeader(0, 9, 6, "c")
    produce = wire.build(wire.response_class(0, 9), {"responses": []})
    assert wire.encode_response(produce_header, produce)[8] == 0  # header v1 tag byte


def test_build_adapts_one_description_to_every_version():
    description = {
        "responses": [
            {
                "name": "orders",
                "partition_responses": [
                    {"index": 0, "error_code": 10, "base_offset": -1, "log_append_time": 1234}
                ],
            }
        ],
        "throttle_time": 0,
    }
    for version in (3, 7, 9):
        body = wire.build(wire.response_class(0, version), description)
        frame = wire.encode_response(wire.RequestHeader(0, version, 1, None), body)
        correlation_id, decoded = wire.decode_response(0, version, frame[4:])
        partition = decoded.responses[0].partition_responses[0]
        assert correlation_id == 1
        assert partition.error_code == 10
        assert _epoch_milliseconds(partition.log_append_time) == 1234


@given(st.binary(max_size=200))
def test_garbage_never_escapes_as_anything_but_protocol_errors(garbage):
    reader = wire.FrameReader(max_frame_bytes=1 << 16)
    reader.receive_data(struct.pack(">i", len(garbage)) + garbage)
    try:
        frame = reader.next_frame()
        assert frame == garbage
        wire.decode_request(frame)
    except (wire.MalformedFrame, UnsupportedVersion):
        pass


@given(
    version=st.integers(min_value=0, max_value=4),
    correlation_id=st.integers(min_value=-(2**31), max_value=2**31 - 1),
    client_id=st.one_of(st.none(), st.text(max_size=30)),
)
def test_api_versions_request_round_trip(version, correlation_id, client_id):
    frame = _api_versions_request_frame(version, correlation_id, client_id)
    request = wire.decode_request(frame[4:])
    assert request.header == wire.RequestHeader(18, version, correlation_id, client_id)


# --- FrameReceiver: frames read with recv_into ------------------------------------------

def _receive(receiver: wire.FrameReceiver, stream: bytes, read_sizes: list[int]) -> list:
    """Feed ``stream`` as a socket read with recv_into would, at most ``read_sizes`` bytes
    per read (cycled); the frames in the order they came out."""
    frames, position, reads = [], 0, 0
    while position < len(stream):
        buffer = receiver.get_buffer(-1)
        assert len(buffer) > 0
        count = min(len(buffer), read_sizes[reads % len(read_sizes)], len(stream) - position)
        buffer[:count] = stream[position:position + count]
        position += count
        reads += 1
        receiver.buffer_updated(count)
        while (frame := receiver.next_frame()) is not None:
            frames.append(frame)
    return frames


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from([0, 1, 3, 4000, wire.LARGE_FRAME_MIN_BYTES,
                                 wire.LARGE_FRAME_MIN_BYTES + 1, 300_000, 1_000_000]),
                min_size=1, max_size=6),
       st.lists(st.integers(1000, 600_000), min_size=1, max_size=4))
def test_frame_receiver_returns_every_frame_whole_and_in_order(sizes, read_sizes):
    bodies = [bytes([n % 251]) * size for n, size in enumerate(sizes)]
    stream = b"".join(struct.pack(">i", len(body)) + body for body in bodies)
    frames = _receive(wire.FrameReceiver(), stream, read_sizes)
    assert [bytes(frame) for frame in frames] == bodies


def test_frame_receiver_reassembles_byte_by_byte_and_pipelined():
    bodies = [b"", b"abc", bytes(wire.LARGE_FRAME_MIN_BYTES + 1), b"z"]
    stream = b"".join(struct.pack(">i", len(body)) + body for body in bodies)
    assert _receive(wire.FrameReceiver(), stream, [1]) == bodies


def test_a_large_frame_is_received_into_a_buffer_of_its_own():
    body = bytes(range(256)) * 1000
    receiver = wire.FrameReceiver()
    (frame,) = _receive(receiver, struct.pack(">i", len(body)) + body, [100_000])
    assert type(frame) is memoryview and frame == body
    assert len(receiver.get_buffer(-1)) == wire.RECEIVE_BUFFER_BYTES  # back to the shared one


def test_frame_receiver_enforces_the_size_limit():
    with pytest.raises(wire.FrameTooLarge):
        _receive(wire.FrameReceiver(max_frame_bytes=100), struct.pack(">i", 101), [10])
    with pytest.raises(wire.MalformedFrame):
        _receive(wire.FrameReceiver(), struct.pack(">i", -1), [10])


# --- Produce requests: decoded by hand, records as views of the frame --------------------

def _produce_values(records: list) -> dict:
    return {"transactional_id": "tx-1", "acks": -1, "timeout": 1500, "topic_data": [
        {"name": "orders", "partition_data": [
            {"index": index, "records": value} for index, value in enumerate(records)]},
        {"name": "ünïcode", "partition_data": [{"index": 7, "records": b"\x01\x02"}]},
    ]}


@pytest.mark.parametrize("version", range(3, 13))
def test_produce_requests_decode_as_kio_decodes_them_with_records_as_frame_views(version):
    body = wire.build(wire.request_class(0, version), _produce_values([b"x" * 300, None, b""]))
    frame = bytearray(wire.encode_request(0, version, 9, "p", body)[4:])
    ours = wire.decode_request(frame).body
    theirs = wire.read_entity(wire.request_class(0, version), bytes(frame),
                              len(frame) - len(wire.encode_body(body)))[0]
    assert (ours.transactional_id, ours.acks, ours.timeout_ms) == (
        theirs.transactional_id, theirs.acks, wire.milliseconds(theirs.timeout))
    assert [(t.name, [(p.index, None if p.records is None else bytes(p.records))
                      for p in t.partition_data]) for t in ours.topic_data] == [
        (t.name, [(p.index, p.records) for p in t.partition_data]) for t in theirs.topic_data]
    records = ours.topic_data[0].partition_data[0].records
    assert records.readonly and records.obj is frame  # a view of the frame, not a copy


@pytest.mark.parametrize("version", [8, 9])
def test_a_truncated_produce_request_is_a_malformed_frame(version):
    body = wire.build(wire.request_class(0, version), _produce_values([b"x" * 40]))
    frame = wire.encode_request(0, version, 9, "p", body)[4:]
    header_bytes = len(frame) - len(wire.encode_body(body))
    for end in range(header_bytes, len(frame) - (1 if version >= 9 else 0)):
        with pytest.raises(wire.MalformedFrame):
            wire.decode_request(frame[:end])


def test_unknown_tagged_fields_in_a_produce_request_are_skipped():
    body = wire.build(wire.request_class(0, 9), _produce_values([b"abc"]))
    encoded = bytearray(wire.encode_body(body))
    assert encoded[-1] == 0  # the request's own (empty) tagged-field section
    encoded[-1:] = b"\x01\x05\x02hi"  # one field: tag 5, two bytes
    header = struct.pack(">hhih", 0, 9, 3, -1) + b"\x00"
    request = wire.decode_request(header + bytes(encoded)).body
    assert bytes(request.topic_data[0].partition_data[0].records) == b"abc"


def test_a_large_frame_buffer_is_reused_only_once_nothing_references_it():
    receiver = wire.FrameReceiver()
    first_body, second_body = b"a" * 200_000, b"b" * 190_000

    def frame_of(body: bytes) -> memoryview:
        (frame,) = _receive(receiver, struct.pack(">i", len(body)) + body, [50_000])
        return frame

    first = frame_of(first_body)
    first_id = id(first.obj)  # kept alive by the receiver's pool, so the id stays its own
    held = first[10:20]  # a request still holding a view of its records
    del first
    second = frame_of(second_body)
    assert id(second.obj) != first_id and second == second_body
    assert bytes(held) == b"a" * 10  # not overwritten while referenced
    del held
    third = frame_of(second_body)  # the first buffer is free now; the second is held
    assert id(third.obj) == first_id and third == second_body and second == second_body


# --- hand-coded old versions (Produce v0-2, Fetch v0-3, ListOffsets v0, OffsetCommit v0-1) ----


def _old_request(api_key: int, version: int, body: bytes) -> bytes:
    return struct.pack(">hhih", api_key, version, 5, 3) + b"old" + body


_OLD_BODIES = {
    (0, 2): struct.pack(">hiih", 1, 1000, 1, 1) + b"t" + struct.pack(">iii", 1, 4, 3) + b"abc",
    (1, 1): struct.pack(">iiiih", -1, 100, 1, 1, 1) + b"t" + struct.pack(">iiqi", 1, 2, 7, 512),
    (1, 3): struct.pack(">iiiiih", -1, 100, 1, 900, 1, 1) + b"t"
    + struct.pack(">iiqi", 1, 2, 7, 512),
    (2, 0): struct.pack(">iih", -1, 1, 1) + b"t" + struct.pack(">iiqi", 1, 0, -2, 1),
    (8, 0): struct.pack(">h", 1) + b"g" + struct.pack(">ih", 1, 1) + b"t"
    + struct.pack(">iiqh", 1, 3, 42, 2) + b"md",
    (8, 1): struct.pack(">h", 1) + b"g" + struct.pack(">ih", 5, 1) + b"m"
    + struct.pack(">ih", 1, 1) + b"t" + struct.pack(">iiqqh", 1, 3, 42, 1234, -1),
    (19, 0): struct.pack(">ih", 1, 1) + b"t" + struct.pack(">ihiih", 3, 1, 0, 1, 2) + b"rm"
    + struct.pack(">h", 4) + b"1000" + struct.pack(">i", 5000),
    (32, 0): struct.pack(">ibh", 1, 2, 1) + b"t" + struct.pack(">ih", 1, 2) + b"rm",
}


def test_hand_coded_old_versions_decode_with_kios_field_names():
    produce = wire.decode_request(_old_request(0, 2, _OLD_BODIES[0, 2])).body
    assert (produce.transactional_id, produce.acks, produce.timeout_ms) == (None, 1, 1000)
    assert bytes(produce.topic_data[0].partition_data[0].records) == b"abc"
    fetch = wire.decode_request(_old_request(1, 3, _OLD_BODIES[1, 3])).body
    assert (fetch.max_wait, fetch.min_bytes, fetch.max_bytes) == (100, 1, 900)
    assert fetch.topics[0].partitions[0] == wire.LegacyFetchPartition(2, 7, 512)
    assert wire.decode_request(_old_request(1, 1, _OLD_BODIES[1, 1])).body.max_bytes is None
    offsets = wire.decode_request(_old_request(2, 0, _OLD_BODIES[2, 0])).body
    assert offsets.topics[0].partitions[0] == wire.LegacyListOffsetsPartition(0, -2, 1)
    commit_v0 = wire.decode_request(_old_request(8, 0, _OLD_BODIES[8, 0])).body
    assert commit_v0 == wire.LegacyOffsetCommitRequest("g", -1, "", (
        wire.LegacyOffsetCommitTopic("t", (wire.LegacyOffsetCommitPartition(3, 42, -1, "md"),)),))
    commit_v1 = wire.decode_request(_old_request(8, 1, _OLD_BODIES[8, 1])).body
    assert commit_v1 == wire.LegacyOffsetCommitRequest("g", 5, "m", (
        wire.LegacyOffsetCommitTopic("t", (wire.LegacyOffsetCommitPartition(3, 42, 1234, None),)),))
    create = wire.decode_request(_old_request(19, 0, _OLD_BODIES[19, 0])).body
    assert type(create) is wire.request_class(19, 2) and create.validate_only is False
    topic = create.topics[0]
    assert (topic.name, topic.num_partitions, topic.replication_factor) == ("t", 3, 1)
    assert [(c.name, c.value) for c in topic.configs] == [("rm", "1000")]
    assert wire.milliseconds(create.timeout) == 5000
    describe = wire.decode_request(_old_request(32, 0, _OLD_BODIES[32, 0])).body
    assert type(describe) is wire.request_class(32, 1) and describe.include_synonyms is False
    assert [(r.resource_type, r.resource_name, r.configuration_keys)
            for r in describe.resources] == [(2, "t", ("rm",))]


def test_old_versions_with_a_later_versions_format_use_its_kio_classes():
    assert wire.request_class(9, 0) is wire.request_class(9, 1)  # OffsetFetch
    assert wire.response_class(9, 0) is wire.response_class(9, 1)
    assert wire.request_class(20, 0) is wire.request_class(20, 1)  # DeleteTopics
    assert wire.request_class(35, 0) is wire.request_class(35, 1)  # DescribeLogDirs
    assert wire.response_class(35, 0) is wire.response_class(35, 1)
    assert wire.response_class(8, 0) is wire.response_class(8, 2)  # OffsetCommit
    assert wire.response_is_flexible(20, 0) is wire.response_is_flexible(8, 0) is False
    assert wire.response_is_flexible(19, 1) is wire.response_is_flexible(32, 0) is False


def test_legacy_string_is_an_int16_length_and_utf8_or_minus_one():
    assert wire.legacy_string("hé") == b"\x00\x03h\xc3\xa9"
    assert wire.legacy_string(None) == b"\xff\xff"


@pytest.mark.parametrize("key_version", sorted(_OLD_BODIES), ids=str)
def test_hand_coded_old_versions_truncated_or_with_huge_counts_are_malformed(key_version):
    frame = _old_request(*key_version, _OLD_BODIES[key_version])
    header_bytes = len(_old_request(*key_version, b""))
    for cut in range(header_bytes, len(frame)):
        with pytest.raises(wire.MalformedFrame):
            wire.decode_request(frame[:cut])
    for position in range(header_bytes, len(frame) - 3):
        mutated = frame[:position] + struct.pack(">i", 2**31 - 1) + frame[position + 4:]
        try:
            wire.decode_request(mutated)
        except wire.MalformedFrame:
            pass
