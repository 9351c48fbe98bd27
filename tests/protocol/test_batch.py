"""batch.py: v2 header parsing, CRC checks and in-place patching, on batches from build_batch;
and the compiled append-path check (kernel.validate_batches, kernel.crc32c)."""

import os
import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.errors import CorruptMessage
from headrace.protocol import kernel
from headrace.protocol.batch import (
    BATCH_HEADER_BYTES,
    TIMESTAMP_TYPE_BIT,
    compute_crc,
    crc_is_valid,
    parse_header,
    peek_magic,
    set_base_offset,
    set_log_append_time,
)
from headrace.protocol.compression import GZIP
from headrace.protocol.records import build_batch, decode_batch
from tests.record_reading import iter_headers


def _batch(base_offset=0, count=3, **options):
    records = [(b"k%d" % i, b"value %d" % i, [("h", b"x")], 1_000 + 10 * i) for i in range(count)]
    return build_batch(records, base_offset=base_offset, **options)


def test_parse_header_reads_every_field():
    batch = _batch(
        base_offset=40,
        compression=GZIP,
        producer_id=77,
        producer_epoch=3,
        base_sequence=9,
        transactional=True,
        partition_leader_epoch=5,
    )
    header = parse_header(batch)
    assert header.base_offset == 40
    assert header.size_bytes == len(batch)
    assert header.partition_leader_epoch == 5
    assert header.magic == 2
    assert header.compression == GZIP
    assert header.is_transactional and not header.is_control and not header.is_log_append_time
    assert header.last_offset_delta == 2 and header.last_offset == 42 and header.next_offset == 43
    assert (header.base_timestamp, header.max_timestamp) == (1_000, 1_020)
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == (77, 3, 9)
    assert header.last_sequence == 11
    assert header.records_count == 3


def test_last_sequence_wraps_at_int32():
    header = parse_header(_batch(base_sequence=2**31 - 1, producer_id=1, producer_epoch=0))
    assert header.last_sequence == 1


def test_parse_header_rejects_short_and_wrong_magic():
    batch = _batch()
    with pytest.raises(CorruptMessage):
        parse_header(batch[: BATCH_HEADER_BYTES - 1])
    wrong_magic = bytearray(batch)
    wrong_magic[16] = 1
    with pytest.raises(CorruptMessage):
        parse_header(wrong_magic)


def test_parse_header_rejects_a_length_shorter_than_the_header():
    short_length = bytearray(_batch())
    struct.pack_into(">i", short_length, 8, 10)
    with pytest.raises(CorruptMessage):
        parse_header(short_length)


def test_peek_magic():
    batch = _batch()
    assert peek_magic(batch) == 2
    assert peek_magic(batch[:16]) == -1


def test_iter_headers_walks_consecutive_batches():
    first, second = _batch(base_offset=0), _batch(base_offset=3, count=5)
    found = list(iter_headers(first + second, verify_crc=True))
    assert [pos for pos, _ in found] == [0, len(first)]
    assert [header.base_offset for _, header in found] == [0, 3]
    assert [header.records_count for _, header in found] == [3, 5]


def test_iter_headers_rejects_a_trailing_partial_batch():
    batch = _batch()
    with pytest.raises(CorruptMessage):
        list(iter_headers(batch + batch[:-1]))


def test_iter_headers_detects_damage_only_when_verifying():
    damaged = bytearray(_batch())
    damaged[-1] ^= 0x01
    assert len(list(iter_headers(damaged))) == 1
    with pytest.raises(CorruptMessage):
        list(iter_headers(damaged, verify_crc=True))


def test_set_base_offset_keeps_the_crc_valid():
    buf = bytearray(_batch() + _batch())
    second_pos = len(buf) // 2
    set_base_offset(buf, second_pos, 1_000_000)
    headers = list(iter_headers(buf, verify_crc=True))
    assert headers[1][1].base_offset == 1_000_000
    assert [r.offset for r in decode_batch(buf, second_pos).records] == [1_000_000, 1_000_001, 1_000_002]


def test_set_log_append_time_sets_the_bit_and_keeps_the_crc_valid():
    buf = bytearray(_batch(compression=GZIP))
    set_log_append_time(buf, 0, 5_555)
    header = parse_header(buf)
    assert header.attributes & TIMESTAMP_TYPE_BIT and header.is_log_append_time
    assert header.max_timestamp == 5_555
    assert header.compression == GZIP
    assert crc_is_valid(buf, 0, header)
    assert compute_crc(buf, 0, header.size_bytes) == header.crc
    assert {record.timestamp_ms for record in decode_batch(buf).records} == {5_555}


# ---- the compiled append-path check: kernel.validate_batches and its CRC-32C


def test_kernel_crc32c_matches_the_reference_library_at_every_stride_boundary():
    lengths = [0, 1, 7, 8, 9, 255, 767, 768, 769, 3 * 4096 - 1, 3 * 4096, 3 * 4096 + 1,
               3 * 4096 + 3 * 256 + 5, 100_000, 1 << 20]
    for length in lengths:
        data = os.urandom(length)
        assert kernel.crc32c(data) == crc32c.crc32c(data), length


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=40_000), st.integers(0, 7))
def test_kernel_crc32c_matches_the_reference_library_on_any_input(data, skip):
    view = memoryview(data)[min(skip, len(data)):]  # unaligned starts
    assert kernel.crc32c(view) == crc32c.crc32c(view)


def test_validate_batches_summarises_every_batch_as_parse_header_reads_it():
    first = _batch(base_offset=5, producer_id=77, producer_epoch=3, base_sequence=9)
    second = _batch(count=5, compression=GZIP, transactional=True)
    buf = bytearray(first + second)
    summaries = kernel.validate_batches(buf)
    assert len(summaries) == 2
    for (position, header), summary in zip(iter_headers(buf), summaries, strict=True):
        assert summary == (position, header.size_bytes, header.attributes,
                           header.last_offset_delta, header.base_timestamp,
                           header.max_timestamp, header.producer_id, header.records_count)
    assert kernel.validate_batches(b"") == ()


def test_validate_batches_checks_buffers_above_the_gil_release_threshold():
    big = _batch(count=1)
    buf = bytearray(big * (300_000 // len(big) + 1))  # above the GIL-release threshold
    assert len(kernel.validate_batches(buf)) == len(buf) // len(big)
    buf[-1] ^= 1
    with pytest.raises(CorruptMessage, match=f"byte {len(buf) - len(big)} fails its CRC-32C"):
        kernel.validate_batches(buf)


@pytest.mark.parametrize("damage, message", [
    (lambda b: b[:-1], "overruns the buffer"),
    (lambda b: b[:40], "header truncated"),
    (lambda b: b[:16] + b"\x01" + b[17:], "has magic 1"),
    (lambda b: b[:8] + struct.pack(">i", 20) + b[12:], "has length 20"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 0x40]), "fails its CRC-32C check"),
])
def test_validate_batches_rejects_each_kind_of_damage_naming_the_batch(damage, message):
    good = _batch()
    with pytest.raises(CorruptMessage, match=message) as raised:
        kernel.validate_batches(good + damage(_batch()))
    assert f"at byte {len(good)}" in str(raised.value)
