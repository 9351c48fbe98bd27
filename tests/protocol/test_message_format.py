"""message_format.py and its compiled loops: up-conversion of magic 0/1 message sets and
down-conversion of v2 batches, checked against kafka-python's legacy encoders and decoders,
Kafka's validation errors, and LazyDownConversionRecords' sizing."""

import gzip
import struct
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.legacy_records import LegacyRecordBatch, LegacyRecordBatchBuilder

from headrace.errors import (
    CorruptMessage,
    InvalidRecord,
    KafkaError,
    UnsupportedCompressionType,
)
from headrace.protocol import compression, message_format
from headrace.protocol.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD
from headrace.protocol.records import Header, build_batch, decode_batch, decode_legacy

LEGACY_CODECS = [NONE, GZIP, SNAPPY, LZ4]
NOW_MS = 1_790_000_000_000


def _legacy_set(magic, codec, count=10, base_offset=0):
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for index in range(count):
        key = None if index % 4 == 3 else b"k%d" % index
        value = None if index % 5 == 4 else b"value-%d-" % index * (index + 1)
        builder.append(base_offset + index, timestamp=NOW_MS + index, key=key, value=value)
    return bytes(builder.build())


def _legacy_entry(offset, body_after_crc):
    message = struct.pack(">I", zlib.crc32(body_after_crc)) + body_after_crc
    return struct.pack(">qi", offset, len(message)) + message


def _v1_body(attributes, timestamp, key, value):
    key_field = struct.pack(">i", -1) if key is None else struct.pack(">i", len(key)) + key
    value_field = struct.pack(">i", -1) if value is None else struct.pack(">i", len(value)) + value
    return struct.pack(">bbq", 1, attributes, timestamp) + key_field + value_field


def _v0_body(attributes, key, value):
    return struct.pack(">bb", 0, attributes) + struct.pack(">i", len(key)) + key + \
        struct.pack(">i", len(value)) + value


# ---------------------------------------------------------------- CRC-32


@given(st.binary(max_size=300))
def test_crc32_is_zlibs(data):
    assert message_format.crc32(data) == zlib.crc32(data)


# ---------------------------------------------------------------- up-conversion


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS)
def test_upconvert_kafka_python_sets_keeps_every_record(magic, codec):
    legacy = _legacy_set(magic, codec)
    batch = decode_batch(message_format.upconvert(legacy))
    expected = decode_legacy(legacy)
    assert [(r.key, r.value, r.timestamp_ms, r.headers) for r in batch.records] == [
        (r.key, r.value, r.timestamp_ms, ()) for r in expected]
    header = batch.header
    assert header.compression == codec
    assert [r.offset for r in batch.records] == list(range(header.next_offset))
    assert (header.base_offset, header.producer_id, header.base_sequence) == (0, -1, -1)
    assert header.max_timestamp == (NOW_MS + 9 if magic == 1 else -1)
    assert not header.is_log_append_time


def test_upconvert_of_several_wrappers_makes_one_batch_with_the_last_codec():
    legacy = _legacy_set(1, GZIP, 3) + _legacy_set(1, NONE, 2, 3) + _legacy_set(1, SNAPPY, 4, 5)
    batch = decode_batch(message_format.upconvert(legacy))
    assert batch.header.compression == SNAPPY
    assert [r.offset for r in batch.records] == list(range(9))
    assert [r.value for r in batch.records] == [r.value for r in decode_legacy(legacy)]


@pytest.mark.parametrize("codec", [GZIP, SNAPPY, LZ4])
def test_a_wrapper_inflating_over_several_chunks_keeps_messages_across_chunk_ends(codec):
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=codec, batch_size=1 << 24)
    values = [b"%05d" % i * (i % 700 + 1) for i in range(1500)]  # ~2.6 MB inflated
    for index, value in enumerate(values):
        builder.append(index, timestamp=NOW_MS, key=None, value=value)
    batch = decode_batch(message_format.upconvert(bytes(builder.build())))
    assert [r.value for r in batch.records] == values


def test_a_wrapper_ending_inside_an_inner_message_is_corrupt():
    inner = _legacy_entry(0, _v1_body(0, 100, b"a", b"x" * 50))
    wrapper = _legacy_entry(0, _v1_body(GZIP, 100, None, gzip.compress(inner[:-7])))
    with pytest.raises(CorruptMessage, match="truncated"):
        message_format.upconvert(wrapper)


def test_upconvert_of_an_empty_set_is_empty():
    assert message_format.upconvert(b"") == b""


def test_magic_1_wrapper_with_log_append_time_gives_its_timestamp_to_every_record():
    inner = _legacy_entry(0, _v1_body(0, 100, b"a", b"x")) + \
        _legacy_entry(1, _v1_body(0, 200, None, b"y"))
    compressed = gzip.compress(inner)
    wrapper = _legacy_entry(1, _v1_body(GZIP | 0x08, 999, None, compressed))
    batch = decode_batch(message_format.upconvert(wrapper))
    assert [r.timestamp_ms for r in batch.records] == [999, 999]


def test_a_bad_crc_is_corrupt_message():
    entry = bytearray(_legacy_entry(7, _v0_body(0, b"k", b"value")))
    entry[-1] ^= 0x01
    with pytest.raises(CorruptMessage, match="CRC"):
        message_format.upconvert(bytes(entry))


def test_a_bad_crc_inside_a_compressed_wrapper_is_corrupt_message():
    inner = bytearray(_legacy_entry(0, _v1_body(0, 100, b"a", b"x")))
    inner[-1] ^= 0x01
    wrapper = _legacy_entry(0, _v1_body(GZIP, 100, None, gzip.compress(bytes(inner))))
    with pytest.raises(CorruptMessage, match="CRC"):
        message_format.upconvert(wrapper)


@pytest.mark.parametrize("inner_body", [
    _v0_body(0, b"k", b"magic 0 inside a magic 1 wrapper"),
    _v1_body(GZIP, 5, None, gzip.compress(b"")),  # compressed inside compressed
], ids=["magic-0-inside-magic-1", "compressed-inside-compressed"])
def test_inner_messages_must_match_their_wrapper(inner_body):
    wrapper = _legacy_entry(0, _v1_body(GZIP, 5, None, gzip.compress(_legacy_entry(0, inner_body))))
    with pytest.raises(InvalidRecord):
        message_format.upconvert(wrapper)


def test_a_wrapper_holding_no_messages_is_invalid():
    with pytest.raises(InvalidRecord):
        message_format.upconvert(_legacy_entry(0, _v1_body(GZIP, 5, None, gzip.compress(b""))))


def test_zstd_has_no_legacy_form():
    with pytest.raises(UnsupportedCompressionType):
        message_format.upconvert(_legacy_entry(0, _v1_body(ZSTD, 5, None, b"z")))


@settings(max_examples=300)
@given(st.binary(max_size=200), st.integers(0, 1))
def test_garbage_under_valid_crcs_raises_only_kafka_errors(body, magic):
    entry = _legacy_entry(0, bytes([magic]) + body)
    try:
        message_format.upconvert(entry + entry[: len(body) % 13])
    except KafkaError:
        pass


# ---------------------------------------------------------------- down-conversion


def _v2_records(count=10, headers=True):
    return [(None if i % 4 == 3 else b"k%d" % i, None if i % 5 == 4 else b"v%d" % i * (i + 1),
             [Header("h", b"%d" % i)] if headers else [], NOW_MS + i) for i in range(count)]


def _kafka_python_reads(messages, magic):
    """(offset, key, value, timestamp) of every record, read by kafka-python's decoder."""
    out, position = [], 0
    while position < len(messages):
        size = struct.unpack_from(">i", messages, position + 8)[0] + 12
        entry = LegacyRecordBatch(bytearray(messages[position:position + size]), magic)
        assert entry.validate_crc()
        out += [(r.offset, r.key, r.value, r.timestamp) for r in entry]
        position += size
    return out


@pytest.mark.parametrize("to_magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS)
def test_downconvert_drops_headers_and_kafka_python_reads_the_rest(to_magic, codec):
    records = _v2_records()
    batches = build_batch(records, base_offset=100, compression=codec)
    messages, first_batch_bytes = message_format.downconvert(batches, to_magic, 100)
    assert first_batch_bytes == len(messages)
    timestamps = [NOW_MS + i if to_magic == 1 else None for i in range(10)]
    assert _kafka_python_reads(messages, to_magic) == [
        (100 + i, key, value, timestamps[i]) for i, (key, value, _, _) in enumerate(records)]


def test_uncompressed_magic_1_messages_are_byte_for_byte_kafka_pythons():
    records = _v2_records(5, headers=False)
    messages, _ = message_format.downconvert(build_batch(records, base_offset=3), 1, 0)
    builder = LegacyRecordBatchBuilder(magic=1, compression_type=NONE, batch_size=1 << 20)
    for index, (key, value, _, timestamp) in enumerate(records):
        builder.append(3 + index, timestamp=timestamp, key=key, value=value)
    assert messages == bytes(builder.build())


def test_a_compressed_batch_becomes_one_wrapper_with_relative_magic_1_offsets():
    batch = build_batch(_v2_records(4), base_offset=50, compression=GZIP)
    messages, _ = message_format.downconvert(batch, 1, 52)
    wrapper_offset, size = struct.unpack_from(">qi", messages)
    assert (wrapper_offset, len(messages)) == (53, size + 12)  # the last inner offset
    inner = gzip.decompress(messages[12 + 22:])  # crc..timestamp, null key, value length
    assert [struct.unpack_from(">q", inner, at)[0] for at in _entry_starts(inner)] == [0, 1, 2, 3]
    # a wrapper keeps the records before the fetch offset: the client skips them
    assert [r.offset for r in decode_legacy(messages)] == [50, 51, 52, 53]


def _entry_starts(message_set):
    position, starts = 0, []
    while position < len(message_set):
        starts.append(position)
        position += struct.unpack_from(">i", message_set, position + 8)[0] + 12
    return starts


def test_uncompressed_records_before_the_fetch_offset_are_dropped():
    messages, _ = message_format.downconvert(build_batch(_v2_records(), base_offset=10), 0, 17)
    assert [r.offset for r in decode_legacy(messages)] == [17, 18, 19]


def test_magic_0_lz4_wrappers_carry_kafkas_legacy_header_checksum():
    messages, _ = message_format.downconvert(build_batch(_v2_records(), compression=LZ4), 0, 0)
    value = messages[12 + 14:]
    with pytest.raises(CorruptMessage):
        compression.decompress(LZ4, value)
    assert [r.value for r in decode_legacy(messages)] == [v for _, v, _, _ in _v2_records()]


def test_control_batches_are_dropped():
    control = build_batch([(None, b"\x00\x00\x00\x01\x00\x00\x00\x00", [], NOW_MS)],
                          base_offset=5, control=True, transactional=True, producer_id=7)
    data = build_batch(_v2_records(2), base_offset=6, transactional=True, producer_id=7)
    messages, _ = message_format.downconvert(control + data, 1, 5)
    assert [r.offset for r in decode_legacy(messages)] == [6, 7]


def test_log_append_time_batches_stamp_their_max_timestamp():
    batch = bytearray(build_batch(_v2_records(3), log_append_time=True))
    struct.pack_into(">q", batch, 35, NOW_MS + 500)  # max_timestamp: the append time
    messages, _ = message_format.downconvert(bytes(batch), 1, 0)
    entries = [messages[at:] for at in _entry_starts(messages)]
    assert [entry[17] & 0x08 for entry in entries] == [0x08] * 3
    assert [r.timestamp_ms for r in decode_legacy(messages)] == [NOW_MS + 500] * 3


def test_zstd_first_is_unsupported_and_zstd_later_ends_the_conversion():
    zstd = build_batch(_v2_records(2), base_offset=2, compression=ZSTD)
    plain = build_batch(_v2_records(2), base_offset=0)
    with pytest.raises(UnsupportedCompressionType):
        message_format.downconvert(zstd + plain, 1, 0)
    messages, _ = message_format.downconvert(plain + zstd, 1, 0)
    assert [r.offset for r in decode_legacy(messages)] == [0, 1]


def test_a_trailing_partial_batch_is_left_out():
    batches = build_batch(_v2_records(2)) + build_batch(_v2_records(2), base_offset=2)
    messages, _ = message_format.downconvert(batches[:-5], 0, 0)
    assert [r.offset for r in decode_legacy(messages)] == [0, 1]


# ---------------------------------------------------------------- response sizing


def test_a_converted_first_batch_larger_than_the_fetch_is_sent_whole():
    batch = build_batch([(b"k", b"v", [], NOW_MS)] * 20)
    records = message_format.down_converted_records(batch, 1, 0)
    assert len(records) > len(batch)
    assert len(decode_legacy(records)) == 20


def test_later_batches_are_cut_at_the_fetched_size():
    first = build_batch([(b"k", b"v" * 400, [], NOW_MS)] * 2)
    second = build_batch([(b"k", b"v", [], NOW_MS)] * 30, base_offset=2)
    records = message_format.down_converted_records(first + second, 1, 0)
    assert len(records) == len(first + second)


def test_a_shorter_conversion_is_padded_with_kafkas_overflow_entry():
    batch = build_batch(_v2_records(10), base_offset=0)
    records = message_format.down_converted_records(batch, 0, 9)
    single, _ = message_format.downconvert(batch, 0, 9)
    assert len(records) == len(batch) and records.startswith(single)
    overflow_offset, overflow_size = struct.unpack_from(">qi", records, len(single))
    assert overflow_offset == -1 and overflow_size == len(batch) - len(single) + 1
    assert records[len(single) + 12:] == bytes(len(batch) - len(single) - 12)


def test_nothing_converted_sends_one_overflow_entry_and_nothing_fetched_nothing():
    control = build_batch([(None, b"\x00\x00\x00\x00\x00\x00\x00\x00", [], NOW_MS)],
                          control=True, transactional=True, producer_id=7)
    assert message_format.down_converted_records(control, 1, 0) == \
        struct.pack(">qi", -1, 61)
    assert message_format.down_converted_records(b"", 1, 0) == b""


@settings(max_examples=500)
@given(st.sampled_from([NONE, GZIP]), st.integers(0, 1),
       st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
       st.integers(0, 60))
def test_damaged_batches_down_convert_or_raise_only_kafka_errors(codec, to_magic, flips, cut):
    damaged = bytearray(build_batch(_v2_records(5), compression=codec))
    for position, value in flips:
        damaged[position % len(damaged)] = value
    try:
        message_format.down_converted_records(bytes(damaged[: len(damaged) - cut]), to_magic, 0)
    except KafkaError:
        pass
