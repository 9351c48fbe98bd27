"""Append validation and broker-side recompression (compression.type) on a real log on disk.

Every test appends through ``Log.append`` and reads the stored batches back from the segment
files (``Log.read`` slices), decoding them with ``headrace.protocol.records``.
"""

from __future__ import annotations

import ctypes
import os
import struct
import threading

import crc32c
import pytest

from headrace.errors import CorruptMessage, InvalidRecord, MessageTooLarge
from headrace.protocol import compression as codecs
from headrace.protocol.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_BYTES,
    CRC_OFFSET,
    TRANSACTIONAL_BIT,
    parse_header,
)
from headrace.protocol.records import Header, build_batch, decode_batch, recompress_batch
from headrace.storage import validation
from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log
from tests.storage.helpers import read_all

NOW_MS = 1_700_000_000_000
TARGETS = {"uncompressed": codecs.NONE, "gzip": codecs.GZIP, "snappy": codecs.SNAPPY,
           "lz4": codecs.LZ4, "zstd": codecs.ZSTD}
SOURCES = [codecs.NONE, codecs.GZIP, codecs.ZSTD]


def _records(count: int = 12) -> list[tuple]:
    records = []
    for i in range(count):
        key = None if i % 5 == 2 else f"key-{i}".encode()
        value = None if i % 7 == 4 else f"value-{i}-".encode() * (i + 3)
        headers = [Header("trace", f"{i}".encode()), Header("null", None)] if i % 2 else []
        records.append((key, value, headers, NOW_MS - 1000 + 37 * i))
    return records


def _open(scratch, **overrides) -> Log:
    config = LogConfig(**overrides)
    return Log("topic", 0, scratch / "topic-0", config, RealFileSystem(), NOW_MS,
               clean_shutdown=True)


def _stored(log: Log):
    return [decode_batch(data) for _, data in read_all(log)]


def _contents(batch) -> list[tuple]:
    return [(r.offset - batch.header.base_offset, r.timestamp_ms, r.key, r.value, r.headers)
            for r in batch.records]


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("source", SOURCES)
def test_batches_are_stored_in_the_topic_codec_with_identical_records(scratch, source, target):
    log = _open(scratch, compression_type=target)
    sent = build_batch(_records(), compression=source, producer_id=7, producer_epoch=2,
                       base_sequence=0)
    log.append(bytearray(build_batch(_records(3))), NOW_MS)  # offsets 0..2 first
    result = log.append(bytearray(sent), NOW_MS)
    stored = _stored(log)[-1]
    original = decode_batch(sent)
    assert result.base_offset == stored.header.base_offset == 3
    assert stored.header.compression == TARGETS[target]
    assert _contents(stored) == _contents(original)
    for field in ("last_offset_delta", "base_timestamp", "max_timestamp", "producer_id",
                  "producer_epoch", "base_sequence", "records_count"):
        assert getattr(stored.header, field) == getattr(original.header, field), field
    assert stored.header.partition_leader_epoch == 0  # stamped: the appending leader's epoch
    log.close()


def test_producer_compression_type_stores_the_batch_byte_for_byte(scratch):
    log = _open(scratch, compression_type="producer")
    # sent as the leader stamps it (epoch 0): the rest is kept byte for byte
    sent = build_batch(_records(), compression=codecs.GZIP, partition_leader_epoch=0)
    log.append(bytearray(build_batch(_records(2))), NOW_MS)
    log.append(bytearray(sent), NOW_MS)
    _, stored = read_all(log)[-1]
    assert stored[8:] == sent[8:]  # all but the assigned base offset
    assert struct.unpack_from(">q", stored)[0] == 2
    log.close()


def test_a_batch_already_in_the_topic_codec_is_not_rebuilt(scratch):
    log = _open(scratch, compression_type="zstd")
    sent = build_batch(_records(), compression=codecs.ZSTD, partition_leader_epoch=0)
    log.append(bytearray(sent), NOW_MS)
    assert read_all(log)[0][1] == sent
    log.close()


def test_recompression_leaves_the_callers_buffer_alone_and_survives_a_restart(scratch):
    log = _open(scratch, compression_type="lz4")
    sent = bytearray(build_batch(_records()))
    untouched = bytes(sent)
    log.append(bytearray(build_batch(_records(4))), NOW_MS)
    log.append(sent, NOW_MS)
    assert sent == untouched
    log.close()
    reopened = _open(scratch, compression_type="lz4")
    stored = _stored(reopened)[-1]
    assert stored.header.compression == codecs.LZ4 and stored.header.base_offset == 4
    assert _contents(stored) == _contents(decode_batch(untouched))
    reopened.close()


def test_mixed_request_recompresses_each_batch_and_assigns_consecutive_offsets(scratch):
    log = _open(scratch, compression_type="snappy")
    batches = [build_batch(_records(3), compression=codec) for codec in SOURCES]
    log.append(bytearray(b"".join(batches)), NOW_MS)
    stored = _stored(log)
    assert [b.header.base_offset for b in stored] == [0, 3, 6]
    assert {b.header.compression for b in stored} == {codecs.SNAPPY}
    assert [_contents(b) for b in stored] == [_contents(decode_batch(b)) for b in batches]
    log.close()


def test_idempotent_retry_of_a_recompressed_batch_is_a_duplicate(scratch):
    log = _open(scratch, compression_type="gzip")
    sent = build_batch(_records(4), producer_id=11, producer_epoch=0, base_sequence=0,
                       transactional=True)
    first = log.append(bytearray(sent), NOW_MS)
    retry = log.append(bytearray(sent), NOW_MS)
    assert retry.duplicate and (retry.base_offset, retry.last_offset) == (0, 3)
    assert not first.duplicate and log.log_end_offset == 4
    stored = _stored(log)
    assert len(stored) == 1 and stored[0].header.attributes & TRANSACTIONAL_BIT
    log.close()


def test_log_append_time_is_stamped_on_the_recompressed_batch(scratch):
    log = _open(scratch, compression_type="zstd", message_timestamp_type="LogAppendTime")
    result = log.append(bytearray(build_batch(_records(5))), NOW_MS + 9)
    stored = _stored(log)[0]
    assert result.log_append_time_ms == NOW_MS + 9
    assert stored.header.compression == codecs.ZSTD and stored.header.is_log_append_time
    assert {r.timestamp_ms for r in stored.records} == {NOW_MS + 9}
    log.close()


def test_control_batches_are_stored_as_written(scratch):
    log = _open(scratch, compression_type="zstd")
    marker = build_batch([(b"\x00\x00\x00\x00", b"\x00\x00\x00\x00\x00\x00", [], NOW_MS)],
                         producer_id=5, producer_epoch=0, transactional=True, control=True,
                         partition_leader_epoch=0)
    log.append(bytearray(marker), NOW_MS)
    assert read_all(log)[0][1] == marker
    log.close()


def test_a_recompressed_batch_larger_than_max_message_bytes_is_rejected(scratch):
    incompressible = [(None, os.urandom(4000), [], NOW_MS)]
    sent = build_batch(incompressible)
    log = _open(scratch, compression_type="gzip", max_message_bytes=len(sent))
    with pytest.raises(MessageTooLarge):
        log.append(bytearray(sent), NOW_MS)
    assert log.log_end_offset == 0 and log.size_bytes == 0
    log.close()


def _with_fresh_crc(batch: bytearray) -> bytearray:
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return batch


def test_recompression_rejects_a_compressed_section_that_does_not_decode(scratch):
    log = _open(scratch, compression_type="zstd")
    damaged = bytearray(build_batch(_records(), compression=codecs.GZIP))
    damaged[BATCH_HEADER_BYTES + 20 : BATCH_HEADER_BYTES + 40] = bytes(20)
    with pytest.raises(CorruptMessage):
        log.append(_with_fresh_crc(damaged), NOW_MS)
    assert log.log_end_offset == 0
    log.close()


def test_recompression_rejects_records_disagreeing_with_the_header(scratch):
    short = bytearray(build_batch(_records(3)))
    struct.pack_into(">i", short, 57, 4)  # records_count 4, but 3 records...
    struct.pack_into(">i", short, 23, 3)  # ...and a matching last offset delta
    # Kafka's record iterator: "Incorrect declared batch size, premature EOF reached",
    # an InvalidRecordException (INVALID_RECORD)
    with pytest.raises(InvalidRecord):
        recompress_batch(_with_fresh_crc(short), 0, codecs.ZSTD)
    log = _open(scratch, compression_type="zstd")
    with pytest.raises(InvalidRecord):  # Kafka's LogValidator: an invalid record structure
        log.append(short, NOW_MS)
    log.close()


def test_recompress_batch_keeps_every_header_field_but_codec_length_and_crc():
    sent = build_batch(_records(), compression=codecs.LZ4, producer_id=3, producer_epoch=4,
                       base_sequence=17, transactional=True, partition_leader_epoch=9,
                       base_offset=1234)
    rebuilt = recompress_batch(sent, 0, codecs.GZIP)
    before, after = parse_header(sent), parse_header(rebuilt)
    assert after.compression == codecs.GZIP
    assert after.attributes & ~0x07 == before.attributes & ~0x07
    assert (after.base_offset, after.partition_leader_epoch, after.last_offset_delta,
            after.base_timestamp, after.max_timestamp, after.producer_id, after.producer_epoch,
            after.base_sequence, after.records_count) == (
        before.base_offset, before.partition_leader_epoch, before.last_offset_delta,
        before.base_timestamp, before.max_timestamp, before.producer_id, before.producer_epoch,
        before.base_sequence, before.records_count)
    assert decode_batch(rebuilt).records == decode_batch(sent).records


def test_append_still_rejects_bad_record_counts_and_damaged_batches(scratch):
    log = _open(scratch)
    counted = bytearray(build_batch(_records(3)))
    struct.pack_into(">i", counted, 57, 5)
    with pytest.raises(InvalidRecord):
        log.append(_with_fresh_crc(counted), NOW_MS)
    damaged = bytearray(build_batch(_records(3)))
    damaged[-1] ^= 0xFF
    with pytest.raises(CorruptMessage, match="CRC-32C"):
        log.append(damaged, NOW_MS)
    with pytest.raises(CorruptMessage, match="overruns"):
        log.append(bytearray(build_batch(_records(3)))[:-1], NOW_MS)
    assert log.log_end_offset == 0
    log.close()


def _with_header_max_timestamp(batch: bytes, max_timestamp_ms: int) -> bytearray:
    lying = bytearray(batch)
    struct.pack_into(">q", lying, 35, max_timestamp_ms)
    return _with_fresh_crc(lying)


@pytest.mark.parametrize("codec", [codecs.NONE, codecs.LZ4])
def test_the_max_timestamp_stored_and_indexed_is_the_records_largest(scratch, codec):
    """A header max timestamp below (or above) the records' largest is rewritten, on the
    general path (first append) and the plain one (after it), and the segment's largest
    timestamp (its time index and retention) is the records'."""
    log = _open(scratch)
    for header_max_ms in (0, NOW_MS + 10_000_000, NOW_MS - 5000):
        log.append(_with_header_max_timestamp(build_batch(_records(4), compression=codec),
                                              header_max_ms), NOW_MS)
    largest_ms = NOW_MS - 1000 + 37 * 3
    assert [batch.header.max_timestamp for batch in _stored(log)] == [largest_ms] * 3
    assert log.segments[-1].max_timestamp_ms == largest_ms
    log.close()


@pytest.mark.parametrize("codec", [codecs.NONE, codecs.ZSTD])
def test_records_without_timestamps_store_max_timestamp_minus_one(scratch, codec):
    """librdkafka's batch of records timestamped -1 carries a header max timestamp of 0: it is
    stored as -1 (no timestamp), never as 1970, which time retention would delete at once."""
    untimed = [(b"k", b"v", [], -1)] * 3
    log = _open(scratch)
    for _ in range(2):  # general path, then single-batch path
        log.append(_with_header_max_timestamp(build_batch(untimed, compression=codec), 0),
                   NOW_MS)
    assert [batch.header.max_timestamp for batch in _stored(log)] == [-1, -1]
    assert log.segments[-1].max_timestamp_ms == -1
    log.close()


@pytest.mark.parametrize("codec", [codecs.NONE, codecs.LZ4])
def test_the_callers_buffer_is_never_changed(scratch, codec):
    log = _open(scratch)
    for _ in range(2):  # general path, then single-batch path
        sent = _with_header_max_timestamp(build_batch(_records(4), compression=codec), 0)
        original = bytes(sent)
        log.append(sent, NOW_MS)
        assert sent == original
    log.close()


def test_record_errors_list_the_first_thousand_and_count_all(scratch):
    """Every record of a batch of 1500 keyless records is refused on a compacted topic; the
    error counts all 1500 and lists the first 1000 (bounded memory per batch)."""
    log = _open(scratch, cleanup_policy="compact")
    with pytest.raises(InvalidRecord) as refused:
        log.append(build_batch([(None, b"v", [], NOW_MS)] * 1500), NOW_MS)
    assert [index for index, _ in refused.value.record_errors] == list(range(1000))
    assert "due to 1500 record errors in total" in refused.value.message
    assert read_all(log) == []
    log.close()


# ---------------------------------------------------------------- the reusable section buffer

def _zeros_batch(section_mib: int, codec: int = codecs.LZ4) -> bytes:
    """A batch of 1 KiB zero values whose records section inflates to about ``section_mib``."""
    return build_batch([(None, bytes(1024), [], NOW_MS)] * (section_mib * 1000),
                       compression=codec)


def _resident_bytes(buffer) -> int:
    """Resident bytes of the mapping that holds ``buffer`` (its Rss in /proc/self/smaps)."""
    holder = ctypes.c_char.from_buffer(buffer)
    address = ctypes.addressof(holder)
    del holder
    with open("/proc/self/smaps") as smaps:
        inside = False
        for line in smaps:
            first = line.split()[0]
            if "-" in first and not first.endswith(":"):
                start, end = (int(bound, 16) for bound in first.split("-"))
                inside = start <= address < end
            elif inside and first == "Rss:":
                return int(line.split()[1]) * 1024
    raise AssertionError("the section buffer is not mapped")


def _in_new_thread(work):
    """``work()``'s result, run in a thread of its own (which gets its own section buffer)."""
    results = []
    thread = threading.Thread(target=lambda: results.append(work()))
    thread.start()
    thread.join(60)
    assert not thread.is_alive() and len(results) == 1
    return results[0]


def test_each_thread_inflates_every_section_into_its_one_buffer(scratch):
    batches = [_zeros_batch(1, codec) for codec in (codecs.LZ4, codecs.ZSTD, codecs.SNAPPY,
                                                    codecs.GZIP)]

    def sections_seen():
        seen = []
        for batch in batches:
            with validation._decompressed_records(batch, 0) as section:
                assert bytes(section) == codecs.decompress(batch[22] & 7,
                                                           batch[BATCH_HEADER_BYTES:])
                seen.append(section.obj)
        return seen, validation._section_buffer.buffer

    seen, buffer = _in_new_thread(sections_seen)
    assert all(obj is buffer for obj in seen)
    other_seen, other_buffer = _in_new_thread(sections_seen)
    assert other_buffer is not buffer and all(obj is other_buffer for obj in other_seen)
    log = _open(scratch)
    assert _in_new_thread(lambda: [log.append(bytearray(batch), NOW_MS).base_offset
                                   for batch in batches]) == [0, 1000, 2000, 3000]
    log.close()


@pytest.mark.parametrize("section_mib", [24, 40], ids=["fits the buffer", "past the buffer"])
def test_a_large_section_leaves_at_most_the_resident_limit_mapped(scratch, section_mib):
    """24 MiB inflates into the buffer and is then handed back above the resident limit; 40
    MiB (past WHOLE_SECTION_MAX_BYTES) fills the buffer before it is found too large, and
    is handed back before the streaming walk."""
    batch = _zeros_batch(section_mib)
    log = _open(scratch)

    def append_and_measure():
        buffer = validation._section_buffer.buffer
        with validation._decompressed_records(_zeros_batch(1), 0):
            pass
        before_bytes = _resident_bytes(buffer)
        largest_inside = []
        if section_mib * 1000 * 1024 < validation.WHOLE_SECTION_MAX_BYTES:
            with validation._decompressed_records(batch, 0):
                largest_inside.append(_resident_bytes(buffer))
        result = log.append(bytearray(batch), NOW_MS)
        return before_bytes, largest_inside, _resident_bytes(buffer), result.last_offset

    before_bytes, largest_inside, after_bytes, last_offset = _in_new_thread(append_and_measure)
    assert last_offset == section_mib * 1000 - 1
    assert before_bytes >= 1000 * 1024
    assert all(inside_bytes >= section_mib * 1000 * 1024 for inside_bytes in largest_inside)
    assert after_bytes <= validation.SECTION_BUFFER_RESIDENT_BYTES
    log.close()


def test_a_section_declined_after_filling_the_buffer_leaves_at_most_the_resident_limit(scratch):
    """lz4 data cut short after 24 MiB of output: the decoder has filled the buffer when it
    finds the end missing; the pages are handed back before the fallback raises."""
    batch = bytearray(_zeros_batch(24))
    del batch[-5:]  # the frame's end mark and one byte of the last block
    batch[8:12] = (len(batch) - 12).to_bytes(4, "big")

    def declined_and_measured():
        buffer = validation._section_buffer.buffer
        with pytest.raises(CorruptMessage), validation._decompressed_records(batch, 0):
            pass
        return _resident_bytes(buffer)

    assert _in_new_thread(declined_and_measured) <= validation.SECTION_BUFFER_RESIDENT_BYTES
