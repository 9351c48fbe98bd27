"""records.py: golden vectors from the documented layouts, property round trips, corruption,
legacy message sets, and cross-checks against kafka-python's own encoders and decoders."""

import gzip
import random
import struct
import zlib

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from headrace.errors import (
    CorruptMessage,
    InvalidRecord,
    MessageTooLarge,
    UnsupportedCompressionType,
)
from headrace.protocol.batch import parse_header
from headrace.protocol.compression import GZIP, LZ4, NONE, SNAPPY, ZSTD, compress
from headrace.protocol.records import (
    Header,
    Record,
    RecordBatch,
    build_batch,
    decode_batch,
    decode_legacy,
    is_legacy,
    recompress_batch,
    section_chunks,
    walk_records_section,
)
from tests.record_reading import iter_records

ALL_CODECS = [NONE, GZIP, SNAPPY, LZ4, ZSTD]


def has_contiguous_offsets(batch: RecordBatch) -> bool:
    """The records fill base_offset..last_offset with no gap (a compacted batch need not)."""
    offsets = [record.offset for record in batch.records]
    return offsets == list(range(batch.header.base_offset, batch.header.next_offset))

LEGACY_CODECS = [NONE, GZIP, SNAPPY, LZ4]

# ---------------------------------------------------------------- golden v2 batch

GOLDEN_RECORDS_SECTION = bytes(
    [0x20]  # record 1 length: 16, zigzag -> 32
    + [0x00]  # attributes
    + [0x00]  # timestamp delta 0
    + [0x00]  # offset delta 0
    + [0x02] + list(b"k")  # key length 1 (zigzag 2), key
    + [0x0A] + list(b"hello")  # value length 5 (zigzag 10), value
    + [0x02]  # one header
    + [0x02] + list(b"h")  # header key length 1, "h"
    + [0x02] + list(b"1")  # header value length 1, "1"
    + [0x10]  # record 2 length: 8, zigzag -> 16
    + [0x00]  # attributes
    + [0xD8, 0x04]  # timestamp delta 300: zigzag 600 = 0b100_1011000 -> 0xD8 0x04
    + [0x02]  # offset delta 1
    + [0x01]  # key length -1 (null), zigzag -> 1
    + [0x02] + list(b"v")  # value length 1, "v"
    + [0x00]  # no headers
)
GOLDEN_CRC_COVERED = (
    struct.pack(">h", 0)  # attributes: no compression, CreateTime, not transactional
    + struct.pack(">i", 1)  # last offset delta
    + struct.pack(">q", 1_700_000_000_000)  # base timestamp
    + struct.pack(">q", 1_700_000_000_300)  # max timestamp
    + struct.pack(">q", 42)  # producer id
    + struct.pack(">h", 1)  # producer epoch
    + struct.pack(">i", 10)  # base sequence
    + struct.pack(">i", 2)  # records count
    + GOLDEN_RECORDS_SECTION
)
GOLDEN_V2_BATCH = (
    struct.pack(">q", 5)  # base offset
    + struct.pack(">i", 4 + 1 + 4 + len(GOLDEN_CRC_COVERED))  # batch length: after this field
    + struct.pack(">i", 3)  # partition leader epoch
    + struct.pack(">b", 2)  # magic
    + struct.pack(">I", crc32c.crc32c(GOLDEN_CRC_COVERED))  # CRC-32C
    + GOLDEN_CRC_COVERED
)
GOLDEN_V2_RECORDS = (
    Record(5, 1_700_000_000_000, b"k", b"hello", (Header("h", b"1"),)),
    Record(6, 1_700_000_000_300, None, b"v", ()),
)


def test_golden_v2_batch_encodes_byte_for_byte():
    built = build_batch(
        [(b"k", b"hello", [Header("h", b"1")], 1_700_000_000_000), (None, b"v", [], 1_700_000_000_300)],
        base_offset=5,
        producer_id=42,
        producer_epoch=1,
        base_sequence=10,
        partition_leader_epoch=3,
    )
    assert built == GOLDEN_V2_BATCH


def test_golden_v2_batch_decodes():
    batch = decode_batch(GOLDEN_V2_BATCH)
    assert batch.records == GOLDEN_V2_RECORDS
    assert batch.header.batch_length == len(GOLDEN_V2_BATCH) - 12
    assert (batch.header.producer_id, batch.header.base_sequence) == (42, 10)
    assert has_contiguous_offsets(batch)


# ---------------------------------------------------------------- golden legacy messages


def _legacy_entry(offset, body_after_crc):
    """offset int64, message_size int32, crc uint32 (CRC-32 of magic..end), message."""
    message = struct.pack(">I", zlib.crc32(body_after_crc)) + body_after_crc
    return struct.pack(">qi", offset, len(message)) + message


GOLDEN_V0_BODY = (
    struct.pack(">b", 0)  # magic 0
    + struct.pack(">b", 0)  # attributes: uncompressed
    + struct.pack(">i", 1) + b"k"  # key
    + struct.pack(">i", 3) + b"abc"  # value
)
GOLDEN_V1_BODY = (
    struct.pack(">b", 1)  # magic 1
    + struct.pack(">b", 0)  # attributes: uncompressed, CreateTime
    + struct.pack(">q", 1_600_000_000_123)  # timestamp
    + struct.pack(">i", -1)  # null key
    + struct.pack(">i", 3) + b"xyz"  # value
)


def test_golden_v0_message():
    entry = _legacy_entry(9, GOLDEN_V0_BODY)
    assert len(entry) == 8 + 4 + 4 + 1 + 1 + 4 + 1 + 4 + 3
    assert is_legacy(entry)
    assert decode_legacy(entry) == [Record(9, -1, b"k", b"abc", ())]


def test_golden_v1_message():
    entry = _legacy_entry(12, GOLDEN_V1_BODY)
    assert is_legacy(entry)
    assert decode_legacy(entry) == [Record(12, 1_600_000_000_123, None, b"xyz", ())]


def test_golden_v0_and_v1_in_one_set_and_through_kafka_python():
    entries = _legacy_entry(9, GOLDEN_V0_BODY) + _legacy_entry(12, GOLDEN_V1_BODY)
    assert [r.offset for r in decode_legacy(entries)] == [9, 12]
    builder = LegacyRecordBatchBuilder(magic=0, compression_type=0, batch_size=1 << 20)
    builder.append(9, timestamp=None, key=b"k", value=b"abc")
    assert bytes(builder.build()) == _legacy_entry(9, GOLDEN_V0_BODY)


def _v1_inner(relative_offset, timestamp_ms, key, value):
    key_field = struct.pack(">i", -1) if key is None else struct.pack(">i", len(key)) + key
    body = struct.pack(">bbq", 1, 0, timestamp_ms) + key_field + struct.pack(">i", len(value)) + value
    return _legacy_entry(relative_offset, body)


def _v1_gzip_wrapper(wrapper_offset, attributes, wrapper_timestamp_ms):
    inner = _v1_inner(0, 100, b"a", b"first") + _v1_inner(1, 200, None, b"second")
    compressed = gzip.compress(inner)
    body = struct.pack(">bbq", 1, attributes, wrapper_timestamp_ms) + struct.pack(">i", -1)
    return _legacy_entry(wrapper_offset, body + struct.pack(">i", len(compressed)) + compressed)


def test_v1_compressed_wrapper_uses_relative_inner_offsets():
    # The wrapper's offset is the absolute offset of the last inner message.
    records = decode_legacy(_v1_gzip_wrapper(11, attributes=GZIP, wrapper_timestamp_ms=200))
    assert records == [Record(10, 100, b"a", b"first", ()), Record(11, 200, None, b"second", ())]


def test_v1_wrapper_with_log_append_time_stamps_inner_records():
    wrapper = _v1_gzip_wrapper(11, attributes=GZIP | 0x08, wrapper_timestamp_ms=999)
    assert [record.timestamp_ms for record in decode_legacy(wrapper)] == [999, 999]


def test_legacy_crc_mismatch_is_corrupt():
    entry = bytearray(_legacy_entry(9, GOLDEN_V0_BODY))
    entry[-1] ^= 0x40
    with pytest.raises(CorruptMessage):
        decode_legacy(entry)


def test_legacy_zstd_is_unsupported():
    body = struct.pack(">bb", 1, ZSTD) + struct.pack(">q", 0) + struct.pack(">ii", -1, 1) + b"z"
    with pytest.raises(UnsupportedCompressionType):
        decode_legacy(_legacy_entry(0, body))


def test_legacy_wrapper_with_null_value_is_corrupt():
    body = struct.pack(">bb", 0, GZIP) + struct.pack(">ii", -1, -1)
    with pytest.raises(CorruptMessage):
        decode_legacy(_legacy_entry(0, body))


def test_legacy_nested_compression_is_corrupt():
    inner_wrapper = _v1_gzip_wrapper(1, attributes=GZIP, wrapper_timestamp_ms=0)
    compressed = gzip.compress(inner_wrapper)
    body = struct.pack(">bbq", 1, GZIP, 0) + struct.pack(">i", -1)
    entry = _legacy_entry(1, body + struct.pack(">i", len(compressed)) + compressed)
    with pytest.raises(CorruptMessage):
        decode_legacy(entry)


GOLDEN_V1_ENTRY = _legacy_entry(12, GOLDEN_V1_BODY)


@given(st.integers(min_value=1, max_value=len(GOLDEN_V1_ENTRY) - 1), st.booleans())
def test_truncated_legacy_message_is_corrupt(cut, after_a_whole_entry):
    partial = GOLDEN_V1_ENTRY[:cut]
    with pytest.raises(CorruptMessage):
        decode_legacy(GOLDEN_V1_ENTRY + partial if after_a_whole_entry else partial)


# ---------------------------------------------------------------- property round trips

header_strategy = st.builds(Header, st.text(max_size=8), st.none() | st.binary(max_size=16))
record_strategy = st.tuples(
    st.none() | st.binary(max_size=40),
    st.none() | st.binary(max_size=200),
    st.lists(header_strategy, max_size=3),
    st.integers(min_value=0, max_value=2**42),
)
batch_options = st.fixed_dictionaries(
    {
        "base_offset": st.integers(0, 2**62),
        "compression": st.sampled_from(ALL_CODECS),
        "producer_id": st.integers(-1, 2**63 - 1),
        "producer_epoch": st.integers(-1, 2**15 - 1),
        "base_sequence": st.integers(-1, 2**31 - 1),
        "transactional": st.booleans(),
        "control": st.booleans(),
        "log_append_time": st.booleans(),
        "partition_leader_epoch": st.integers(-1, 2**31 - 1),
    }
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(records=st.lists(record_strategy, min_size=1, max_size=12), options=batch_options)
def test_build_then_decode_round_trips(records, options):
    batch = decode_batch(build_batch(records, **options))
    header = batch.header
    assert (header.base_offset, header.compression) == (options["base_offset"], options["compression"])
    assert (header.producer_id, header.producer_epoch) == (options["producer_id"], options["producer_epoch"])
    assert header.base_sequence == options["base_sequence"]
    assert header.partition_leader_epoch == options["partition_leader_epoch"]
    assert header.is_transactional == options["transactional"]
    assert header.is_control == options["control"]
    assert header.max_timestamp == max(timestamp for *_, timestamp in records)
    expected = [
        Record(
            options["base_offset"] + index,
            header.max_timestamp if options["log_append_time"] else timestamp,
            key,
            value,
            tuple(headers),
        )
        for index, (key, value, headers, timestamp) in enumerate(records)
    ]
    assert list(batch.records) == expected
    assert has_contiguous_offsets(batch)


@settings(max_examples=60)
@given(records=st.lists(record_strategy, min_size=1, max_size=6), codec=st.sampled_from(ALL_CODECS))
def test_kafka_python_reads_what_we_build(records, codec):
    built = build_batch(records, base_offset=100, compression=codec)
    theirs = list(DefaultRecordBatch(bytearray(built)))
    assert [(r.offset, r.timestamp, r.key, r.value) for r in theirs] == [
        (100 + index, timestamp, key, value) for index, (key, value, _, timestamp) in enumerate(records)
    ]
    assert [list(r.headers) for r in theirs] == [
        [(header.key, header.value) for header in headers] for _, _, headers, _ in records
    ]


def test_records_with_offsets_keep_gaps_for_the_cleaner():
    survivors = [Record(103, 5, b"a", b"1", ()), Record(107, 9, b"b", None, ())]
    built = build_batch(survivors, base_offset=100, keep_offsets=True, last_offset_delta=9)
    batch = decode_batch(built)
    assert batch.records == tuple(survivors)
    assert batch.header.last_offset == 109 and batch.header.records_count == 2
    assert not has_contiguous_offsets(batch)


def test_empty_batch_keeps_its_last_offset():
    batch = decode_batch(build_batch([], base_offset=50, last_offset_delta=4, producer_id=8))
    assert batch.records == () and batch.header.next_offset == 55
    assert batch.header.base_timestamp == -1


def test_out_of_order_offsets_are_refused_when_building():
    with pytest.raises(ValueError):
        build_batch([Record(5, 0, b"a", b"", ()), Record(5, 0, b"b", b"", ())], keep_offsets=True)


# ---------------------------------------------------------------- corruption

RECORDS_FOR_DAMAGE = [(b"key-%d" % i, b"value " * i, [("h", b"v")], 1_000 + i) for i in range(6)]


@pytest.fixture(scope="module", params=ALL_CODECS)
def intact_batch(request):
    return build_batch(RECORDS_FOR_DAMAGE, base_offset=10, compression=request.param)


@settings(max_examples=80)
@given(data=st.data())
def test_truncated_batches_are_corrupt(intact_batch, data):
    cut = data.draw(st.integers(0, len(intact_batch) - 1))
    with pytest.raises(CorruptMessage):
        decode_batch(intact_batch[:cut])


@settings(max_examples=150)
@given(data=st.data())
def test_bit_flips_in_checked_bytes_are_corrupt(intact_batch, data):
    # Bytes 0-7 (base offset) and 12-15 (leader epoch) lie outside the CRC by design.
    position = data.draw(st.integers(8, len(intact_batch) - 1).filter(lambda p: not 12 <= p < 16))
    damaged = bytearray(intact_batch)
    damaged[position] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(CorruptMessage):
        decode_batch(damaged)


def _sealed(header_fields, records_section):
    """A batch with a correct length and CRC around arbitrary contents."""
    covered = struct.pack(">hiqqqhii", *header_fields) + records_section
    return struct.pack(">qiibI", 0, 9 + len(covered), 0, 2, crc32c.crc32c(covered)) + covered


def _expected_sealed_outcome(records_count: int, last_offset_delta: int, codec: int,
                             records: int, damaged: bool):
    """What decode_batch must do with a sealed batch (valid CRC) whose section holds
    ``records`` whole records with offset deltas 0.., ``damaged``: cut short or followed by
    bytes that cannot start a record. The decoded record count, or the error class."""
    if records_count < 0 or last_offset_delta < 0:
        return CorruptMessage
    if codec > ZSTD:
        return UnsupportedCompressionType
    if damaged or records_count != records or records - 1 > last_offset_delta:
        return CorruptMessage
    return records


@settings(max_examples=300)
@given(
    records=st.integers(1, 4),
    count_offset=st.sampled_from([0, 0, 0, -1, 1]),
    last_offset_delta=st.integers(-1, 6),
    codec=st.sampled_from([*ALL_CODECS, 5, 6, 7]),
    transactional=st.booleans(),
    log_append_time=st.booleans(),
    damage=st.sampled_from([b"", b"", b"cut", b"\x00", b"\x01"]),
    count_negative=st.sampled_from([False, False, False, True]),
)
def test_garbage_under_a_valid_crc_raises_only_kafka_errors(
    records, count_offset, last_offset_delta, codec, transactional, log_append_time, damage,
    count_negative
):
    """Sealed batches (a valid CRC around them) with every codec id, a record count or last
    offset delta off by one or negative, a section cut short or with a stray byte: each
    decodes to exactly its records or raises exactly the error its header and bytes call for."""
    values = [b"v%d" % i for i in range(records)]
    section = build_batch([(b"k", value, [], 0) for value in values])[61:]
    section = section[:-1] if damage == b"cut" else section + damage
    records_count = -1 if count_negative else records + count_offset
    stored = compress(codec, section) if codec <= ZSTD else section
    attributes = codec | (0x10 if transactional else 0) | (0x08 if log_append_time else 0)
    batch = _sealed((attributes, last_offset_delta, 0, 0, -1, -1, -1, records_count), stored)
    expected = _expected_sealed_outcome(records_count, last_offset_delta, codec, records,
                                        damaged=damage != b"")
    if isinstance(expected, int):
        decoded = decode_batch(batch)
        assert [(r.offset, r.key, r.value, r.timestamp_ms) for r in decoded.records] == [
            (offset, b"k", value, 0) for offset, value in enumerate(values)]
    else:
        with pytest.raises(expected):
            decode_batch(batch)


def test_record_count_disagreeing_with_the_records_is_corrupt():
    section = GOLDEN_RECORDS_SECTION
    for count in (1, 3):
        with pytest.raises(CorruptMessage):
            decode_batch(_sealed((0, 1, 0, 0, -1, -1, -1, count), section))


def test_offset_delta_past_last_offset_delta_is_corrupt():
    with pytest.raises(CorruptMessage):
        decode_batch(_sealed((0, 0, 0, 0, -1, -1, -1, 2), GOLDEN_RECORDS_SECTION))


def test_unknown_codec_in_a_valid_batch_is_unsupported():
    with pytest.raises(UnsupportedCompressionType):
        decode_batch(_sealed((6, 1, 0, 0, -1, -1, -1, 2), GOLDEN_RECORDS_SECTION))


def _expected_legacy_outcome(magic: int, body: bytes):
    """What decode_legacy must do with one message of ``magic`` + ``body``, decided from the
    input: (key, value, timestamp) of its one record, or the error class it must raise (an
    inner message set of random bytes never carries a valid CRC-32)."""
    header = struct.Struct(">bq" if magic == 1 else ">b")
    if len(body) < header.size + 8:
        return CorruptMessage
    attributes, *timestamp = header.unpack_from(body, 0)
    pos, fields = header.size, []
    for _ in range(2):
        if len(body) - pos < 4:
            return CorruptMessage
        (length,) = struct.unpack_from(">i", body, pos)
        pos += 4
        if length == -1:
            fields.append(None)
            continue
        if length < 0 or pos + length > len(body):
            return CorruptMessage
        fields.append(body[pos : pos + length])
        pos += length
    if pos != len(body):
        return CorruptMessage
    codec = attributes & 7
    if codec == 0:
        return (fields[0], fields[1], timestamp[0] if magic == 1 else -1)
    if codec > 3:
        return UnsupportedCompressionType
    return CorruptMessage


def _int32_bytes(data: bytes | None) -> bytes:
    return struct.pack(">i", -1) if data is None else struct.pack(">i", len(data)) + data


@settings(max_examples=200)
@given(
    magic=st.sampled_from([0, 1]),
    attributes=st.integers(0, 0x0F),
    timestamp=st.integers(-1, 2**40),
    key=st.none() | st.binary(max_size=12),
    value=st.none() | st.binary(max_size=12),
    cut_bytes=st.sampled_from([0, 0, 1, 4, 9]),
    extra=st.sampled_from([b"", b"", b"\x00", b"\xff\xff\xff\xfe"]),
)
def test_legacy_garbage_under_a_valid_crc_raises_only_kafka_errors(magic, attributes, timestamp,
                                                                   key, value, cut_bytes, extra):
    """Messages whole, cut short, with extra bytes or unknown codecs (under a valid CRC-32):
    each decodes to exactly its record or raises exactly the error its bytes call for."""
    header = struct.pack(">bq", attributes, timestamp) if magic == 1 else bytes([attributes])
    body = header + _int32_bytes(key) + _int32_bytes(value)
    body = body[: len(body) - cut_bytes] + extra
    expected = _expected_legacy_outcome(magic, body)
    entry = _legacy_entry(0, bytes([magic]) + body)
    if isinstance(expected, tuple):
        (record,) = decode_legacy(entry)
        assert (record.key, record.value, record.timestamp_ms) == expected
    else:
        with pytest.raises(expected):
            decode_legacy(entry)


# ---------------------------------------------------------------- buffers of many batches


def test_iter_records_spans_batches_and_legacy_entries():
    first = build_batch([(b"a", b"1", [], 10), (b"b", b"2", [], 11)], base_offset=0, compression=LZ4)
    second = build_batch([(b"c", b"3", [], 12)], base_offset=2)
    legacy = _legacy_entry(3, GOLDEN_V0_BODY)
    assert [r.offset for r in iter_records(first + second + legacy)] == [0, 1, 2, 3]
    assert [r.key for r in iter_records(first + second + legacy)] == [b"a", b"b", b"c", b"k"]


def test_iter_records_rejects_a_partial_trailing_batch():
    batch = build_batch([(b"a", b"1", [], 10)])
    with pytest.raises(CorruptMessage):
        list(iter_records(batch + batch[:20]))


# ---------------------------------------------------------------- kafka-python's encoders


def _payload(index):
    return b"payload %d " % index * 40


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_decode_kafka_python_v2_batches(codec):
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=codec,
        is_transactional=False,
        producer_id=9,
        producer_epoch=2,
        base_sequence=4,
        batch_size=1 << 20,
    )
    for index in range(20):
        key = None if index % 5 == 0 else b"key%d" % index
        builder.append(index, 1_000 + index, key, _payload(index), [("trace", b"%d" % index)])
    batch = decode_batch(bytes(builder.build()))
    assert batch.header.compression == codec
    assert (batch.header.producer_id, batch.header.base_sequence) == (9, 4)
    assert [r.value for r in batch.records] == [_payload(i) for i in range(20)]
    assert [r.key for r in batch.records][:2] == [None, b"key1"]
    assert batch.records[7].headers == (Header("trace", b"7"),)
    assert [r.timestamp_ms for r in batch.records] == [1_000 + i for i in range(20)]


@pytest.mark.parametrize("magic", [0, 1])
@pytest.mark.parametrize("codec", LEGACY_CODECS)
def test_decode_kafka_python_legacy_sets(magic, codec):
    builder = LegacyRecordBatchBuilder(magic=magic, compression_type=codec, batch_size=1 << 20)
    for index in range(10):
        builder.append(index, timestamp=5_000 + index, key=b"k%d" % index, value=_payload(index))
    legacy = bytes(builder.build())
    assert is_legacy(legacy)
    records = decode_legacy(legacy)
    expected_timestamps = [5_000 + i for i in range(10)] if magic == 1 else [-1] * 10
    assert [(r.key, r.value, r.timestamp_ms) for r in records] == [
        (b"k%d" % i, _payload(i), expected_timestamps[i]) for i in range(10)
    ]


# ---------------------------------------------------------------- streaming record walk

WALK_CHUNK_BYTES = 1 << 20


class _CountingChunks:
    """A section's chunks, counting how many the walk pulled."""

    def __init__(self, chunks):
        self._chunks = iter(chunks)
        self.pulled = 0

    def __iter__(self):
        return self

    def __next__(self):
        chunk = next(self._chunks)
        self.pulled += 1
        return chunk


def _one_record_section():
    batch = build_batch([(b"k", b"v", [], 1_000)])
    return parse_header(batch), batch[61:]


def test_the_walk_reads_no_further_than_the_declared_records_and_one_chunk():
    header, section = _one_record_section()
    trailing = (bytes(WALK_CHUNK_BYTES) for _ in range(1_000))  # a 1 GiB tail, never built
    chunks = _CountingChunks(_chain(section, trailing))
    with pytest.raises(InvalidRecord, match="bytes remain"):
        walk_records_section(header, chunks)
    assert chunks.pulled <= 2


def _chain(first, rest):
    yield first
    yield from rest


def test_a_section_ending_before_its_declared_records_is_an_invalid_record():
    header, section = _one_record_section()
    with pytest.raises(InvalidRecord):
        walk_records_section(header, iter([section[:-1]]))


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_recompression_stops_as_soon_as_the_output_passes_max_batch_bytes(codec):
    values = [bytes(random.Random(seed).randbytes(100_000)) for seed in range(40)]
    batch = build_batch([(b"k", value, [], 1_000) for value in values], compression=codec)
    with pytest.raises(MessageTooLarge):
        recompress_batch(batch, 0, GZIP if codec != GZIP else ZSTD, max_batch_bytes=1 << 20)
    assert len(recompress_batch(batch, 0, LZ4 if codec != LZ4 else NONE)) > 1 << 20


@pytest.mark.parametrize("codec", ALL_CODECS)
def test_the_walk_answers_the_first_record_without_a_key(codec):
    batch = build_batch([(b"k", b"v", [], 1_000), (None, b"v", [], 1_001)], compression=codec)
    header = parse_header(batch)
    assert walk_records_section(header, section_chunks(header, memoryview(batch)[61:])) == 1


@pytest.mark.parametrize("decode_fields", [False, True], ids=["kernel", "python"])
def test_the_walk_rejects_offset_deltas_past_the_last_offset_delta(decode_fields):
    batch = build_batch([(b"k", b"v", [], 1_000), (b"k", b"v", [], 1_001)])
    header = parse_header(_sealed((0, 0, 0, 0, -1, -1, -1, 2), batch[61:]))  # delta 1 > 0
    with pytest.raises(InvalidRecord):
        walk_records_section(header, iter([batch[61:]]), decode_fields=decode_fields)


@pytest.mark.parametrize("split", [0, 3, 9, 14])
@pytest.mark.parametrize(("position", "damage"), [(13, 0x7F), (17, 0x02)],
                         ids=["key-length", "header-count"])
def test_the_walk_finds_a_malformed_record_wherever_the_chunks_split(split, position, damage):
    section = bytearray(build_batch([(b"k", b"v", [], 1_000)] * 3)[61:])  # 9-byte records
    section[position] = damage  # record 2's key length -64, or 1 header that is not there
    header = parse_header(build_batch([(b"k", b"v", [], 1_000)] * 3))
    with pytest.raises(InvalidRecord):
        walk_records_section(header, iter([bytes(section[:split]), bytes(section[split:])]))
    assert walk_records_section(header, iter([build_batch([(b"k", b"v", [], 1)] * 3)[61:]])) == -1
