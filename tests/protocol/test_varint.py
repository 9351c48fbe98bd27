"""The varint codec: round trips, Kafka's length limits and its 32/64-bit truncation."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.errors import CorruptMessage
from headrace.protocol.varint import (
    VARINT_MAX_BYTES,
    VARLONG_MAX_BYTES,
    encode_signed,
    encode_unsigned,
    read_signed,
    read_unsigned,
    write_signed,
)
from headrace.protocol.wire import MalformedFrame, skip_tagged_fields


@given(st.integers(-(2**31), 2**31 - 1))
def test_varint_round_trips_int32(value):
    encoded = encode_signed(value)
    assert len(encoded) <= VARINT_MAX_BYTES
    assert read_signed(encoded, 0) == (value, len(encoded))


@given(st.integers(-(2**63), 2**63 - 1))
def test_varlong_round_trips_int64(value):
    encoded = bytearray(b"\x07")  # decoding starts mid-buffer
    write_signed(encoded, value)
    assert len(encoded) - 1 <= VARLONG_MAX_BYTES
    assert read_signed(encoded, 1, len(encoded), VARLONG_MAX_BYTES) == (value, len(encoded))


@given(st.integers(0, 2**32 - 1))
def test_unsigned_varint_round_trips_uint32(value):
    encoded = encode_unsigned(value)
    assert read_unsigned(encoded + b"\xff", 0) == (value, len(encoded))


def test_zigzag_examples_from_the_protocol_docs():
    for value, expected in [(0, b"\x00"), (-1, b"\x01"), (1, b"\x02"), (-2, b"\x03"),
                            (300, b"\xd8\x04")]:
        assert encode_signed(value) == expected


def test_negative_unsigned_value_is_refused():
    with pytest.raises(ValueError):
        encode_unsigned(-1)


@pytest.mark.parametrize(
    ("encoded", "max_bytes"),
    [(b"\x80" * 5 + b"\x00", VARINT_MAX_BYTES), (b"\x80" * 10 + b"\x00", VARLONG_MAX_BYTES)],
    ids=["varint-6-bytes", "varlong-11-bytes"],
)
def test_overlong_encodings_are_corrupt_even_when_they_end(encoded, max_bytes):
    with pytest.raises(CorruptMessage, match="longer than"):
        read_signed(encoded, 0, len(encoded), max_bytes)


@pytest.mark.parametrize("encoded", [b"", b"\x80", b"\xff\xff\xff\xff"])
def test_truncated_varints_are_corrupt(encoded):
    with pytest.raises(CorruptMessage, match="truncated"):
        read_signed(encoded, 0)


def test_end_bounds_the_read_before_the_buffer_does():
    with pytest.raises(CorruptMessage, match="truncated"):
        read_signed(b"\x80\x01", 0, end=1)


def test_bits_past_32_in_the_fifth_byte_are_dropped_as_kafka_does():
    # ByteUtils.readUnsignedVarint ORs the fifth byte in at << 28 in a Java int.
    assert read_unsigned(b"\xff\xff\xff\xff\x7f", 0) == (2**32 - 1, 5)
    assert read_unsigned(b"\x80\x80\x80\x80\x10", 0) == (0, 5)  # only bit 32 set
    assert read_signed(b"\xff\xff\xff\xff\x1f", 0) == (-(2**31), 5)
    assert read_signed(b"\xfe\xff\xff\xff\x1f", 0) == (2**31 - 1, 5)


def test_bits_past_64_in_the_tenth_byte_are_dropped_as_kafka_does():
    assert read_unsigned(b"\xff" * 9 + b"\x7f", 0, max_bytes=VARLONG_MAX_BYTES) == (2**64 - 1, 10)
    assert read_unsigned(b"\x80" * 9 + b"\x02", 0, max_bytes=VARLONG_MAX_BYTES) == (0, 10)
    assert read_signed(b"\xff" * 9 + b"\x01", 0, max_bytes=VARLONG_MAX_BYTES) == (-(2**63), 10)


def test_the_caller_chooses_the_error():
    with pytest.raises(MalformedFrame):
        read_unsigned(b"\x80", 0, error=MalformedFrame)
    with pytest.raises(MalformedFrame):
        skip_tagged_fields(b"\x01" + b"\xff" * 6, 0)  # a tag longer than 5 bytes
