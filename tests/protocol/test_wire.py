"""The sans-I/O wire codec: framing, headers, kio bodies and the known client traps."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import UnsupportedVersion
from headrace.protocol import wire


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
        assert wire.epoch_milliseconds(partition.log_append_time) == 1234


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
