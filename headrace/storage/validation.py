"""Produce-side validation of record batches before the log appends them (Kafka's LogValidator).

Owns the checks every appended request passes and the broker-side recompression that the
topic's ``compression.type`` asks for:

* structure and integrity, in the compiled kernel (``kernel.validate_batches``, one call per
  request): whole v2 batches only, magic 2, a plausible ``batch_length``, CRC-32C over
  attributes..end, a known codec id (0-4) -- ``CorruptMessage``;
* Kafka's LogValidator checks, in the same kernel pass (each uncompressed batch's records are
  parsed right after its CRC): ``records_count == last_offset_delta + 1 >= 1``, from clients
  base offset 0, no control batch and no producer id without a base sequence, every record
  well formed
  (length, varints, key, value, headers, nothing left over) with offset deltas 0..n-1 --
  ``InvalidRecord``. A compressed batch's records are decompressed (``_decompressed_records``;
  data that does not decode is ``CorruptMessage``) into the thread's reusable section buffer
  (``_SectionBuffer``: no fresh buffer, so no page faults, per batch) and checked by
  ``kernel.check_compressed_records``; an lz4 batch (librdkafka's and Java's default codec
  for speed) in one kernel pass instead, ``kernel.check_lz4_records``: liblz4 inflates a
  block at a time into that buffer and each block's records are checked while it is in the
  CPU caches, with no Python between inflating and checking. What that pass declines (data
  it cannot inflate into the buffer) takes the general path, which raises the precise error;
* per record (KIP-467): a key on a compacted topic -- ``InvalidRecord``; a CreateTime
  timestamp (other than -1) within ``message.timestamp.before.max.ms`` /
  ``message.timestamp.after.max.ms`` of broker time, and no LogAppendTime bit from the
  producer unless the timestamp is so checked -- ``InvalidTimestamp``; the error
  carries ``record_errors`` (index in the batch, Kafka's message) of the refused records of
  the batch -- the first 1000: Kafka lists all, but a batch of tiny refused records would
  cost the broker some hundred bytes per record -- and Kafka's summary message;
* the request is at most ``segment.bytes`` -- ``RecordListTooLarge``; each batch at most
  ``max.message.bytes`` (before and after recompression) -- ``MessageTooLarge``.

Where headrace departs from Kafka's answers, on input no Kafka client sends: an unknown codec id
and data that does not decompress are CORRUPT_MESSAGE (Kafka's broker answers
UNKNOWN_SERVER_ERROR there, from exceptions it does not map); offset deltas other than
0..n-1 are INVALID_RECORD (Kafka stores an uncompressed batch's as sent, whose consumers then
read wrong offsets, and rebuilds a compressed batch with new ones).

Each batch's max timestamp is its largest record timestamp (-1: none has one; a producer's
LogAppendTime batch: its header's, as Kafka reads its records), computed in that pass and
written into the header (with a new CRC, the LogAppendTime bit cleared) where the producer's
differs, as Kafka's ``setMaxTimestamp`` does; the summaries carry it to the segment's indexes.

The size limit runs in the kernel too (``kernel.first_batch_outside_limits``, one call);
Python only names the error of the batch it points at. The log's single-batch
path (``segment_io.append_plain_batch``) applies the same checks to a single batch and declines
whatever fails a limit, so these functions raise every error.

Batches are summarised as plain tuples ``(position, size_bytes, attributes,
last_offset_delta, base_timestamp, max_timestamp, producer_id, records_count)`` (``Summary``):
no object per batch beyond that on the append hot path.

Recompression (``compression.type`` other than ``producer``): a non-control batch whose codec
differs from the target is rebuilt by ``records.recompress_batch`` -- same header fields
(offsets, timestamps, producer id/epoch/sequence, transactional bit), the records section
byte-for-byte as the producer encoded it (offset deltas, timestamp deltas, keys, values,
headers), compressed with the target codec, with a new length and CRC. Control batches
(transaction markers) are stored as written, as Kafka writes them uncompressed. The rebuild
streams (``recompress_batch``): the section is inflated a chunk at a time, at most
``compression.MAX_RECORDS_SECTION_BYTES``, and the rebuilt batch is refused with
``MessageTooLarge`` the moment it passes ``max.message.bytes`` -- Kafka's re-validation of
sizes after recompression, checked while writing rather than after -- so a decompression
bomb costs one chunk of memory, not its inflated size.

Functions over the caller's buffer, which they only read except for the max timestamps
``validate_request`` and ``check_compressed_batch`` rewrite in a writable one (the log passes
its own copy); thread-safe for buffers not shared between threads. Each thread that checks
compressed batches holds one ``_SectionBuffer`` (an anonymous mapping of
``WHOLE_SECTION_MAX_BYTES`` + 1 bytes, at most ``SECTION_BUFFER_RESIDENT_BYTES`` of it resident between
batches), used by that thread only.
"""

from __future__ import annotations

import mmap
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from headrace.errors import (
    CorruptMessage,
    InvalidRecord,
    InvalidTimestamp,
    KafkaError,
    MessageTooLarge,
    RecordListTooLarge,
)
from headrace.protocol.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_BYTES,
    COMPRESSION_MASK,
    CONTROL_BIT,
    parse_header,
)
from headrace.protocol.compression import (
    LZ4,
    codec_by_name,
    decompress,
    decompress_bounded,
    decompress_into,
)
from headrace.protocol.kernel import (
    RECORD_ERROR_NO_KEY,
    RECORD_ERROR_TIMESTAMP_TYPE,
    RecordsRejected,
    check_compressed_records,
    check_lz4_records,
    first_batch_outside_limits,
)
from headrace.protocol.kernel import validate_batches as kernel_validate_batches
from headrace.protocol.records import (
    recompress_batch,
    section_chunks,
    walk_records_section,
)
from headrace.storage.config import LogConfig

Summary = tuple[int, int, int, int, int, int, int, int]

__all__ = ["Summary", "check_compressed_batch", "needs_recompression", "record_checks",
           "recompress_for_topic", "target_codec", "validate_request"]

RecordChecks = tuple[bool, bool, bool, int, int, int]
RECORD_ERRORS_SHOWN = 3  # Kafka's summary message quotes at most the first three
# A compressed section inflating past this is walked as it streams before being held whole,
# so a decompression bomb costs the broker at most this much memory.
WHOLE_SECTION_MAX_BYTES = 32 * 1024 * 1024
# What each thread's reusable section buffer keeps mapped between batches (_SectionBuffer):
# a section inflated from a batch of librdkafka's or Java's default sizes fits.
SECTION_BUFFER_RESIDENT_BYTES = 4 * 1024 * 1024


def record_checks(config: LogConfig, now_ms: int, from_client: bool) -> RecordChecks:
    """The kernel's per-record checks for ``config`` at broker time ``now_ms``: (compacted,
    check CreateTime timestamps, from a client, now_ms, before_max_ms, after_max_ms)."""
    return (config.compact_enabled, config.message_timestamp_type != "LogAppendTime",
            from_client, now_ms, config.message_timestamp_before_max_ms,
            config.message_timestamp_after_max_ms)


def validate_request(records: bytearray, config: LogConfig, now_ms: int, *,
                     from_client: bool = False, topic_partition: str = "",
                     ) -> tuple[Summary, ...]:
    """Check a produce request's batches against the topic config; their summaries (max
    timestamps from the records, rewritten into ``records``' headers where they differ).
    One kernel call for uncompressed batches, and no Python loop per batch: this runs on
    every append; a compressed batch's records are decompressed and checked in a second."""
    checks = record_checks(config, now_ms, from_client)
    try:
        summaries = kernel_validate_batches(records, checks)
    except RecordsRejected as rejected:
        raise _record_errors(*rejected.args[1:], checks, topic_partition) from None
    if not summaries:
        raise CorruptMessage("produce request carries no record batch")
    if len(records) > config.segment_bytes:
        raise RecordListTooLarge(
            f"{len(records)} bytes exceed segment.bytes {config.segment_bytes}")
    bad = first_batch_outside_limits(
        summaries, config.max_message_bytes, now_ms, config.message_timestamp_before_max_ms,
        config.message_timestamp_after_max_ms, False)
    if bad >= 0:
        raise MessageTooLarge(f"batch of {summaries[bad][1]} bytes exceeds max.message.bytes "
                              f"{config.max_message_bytes}")
    if any(summary[2] & COMPRESSION_MASK for summary in summaries):
        summaries = tuple(_check_compressed(records, summary, checks, topic_partition)
                          for summary in summaries)
    return summaries


def _check_compressed(records: bytearray, summary: Summary, checks: RecordChecks,
                      topic_partition: str) -> Summary:
    """``summary`` itself for an uncompressed batch; else its records checked, with the max
    timestamp from them."""
    if not summary[2] & COMPRESSION_MASK:
        return summary
    max_timestamp = check_compressed_batch(records, summary[0], checks, topic_partition)
    return (*summary[:5], max_timestamp, *summary[6:])


def check_compressed_batch(records: bytes | bytearray | memoryview, position: int,
                           checks: RecordChecks, topic_partition: str) -> int:
    """Kafka's record checks of the compressed batch at ``position`` (its CRC already
    checked): the largest record timestamp, written into the header when ``records`` is
    writable and the header differs; raises as ``validate_request`` does. An lz4 batch is
    inflated and checked in one kernel pass (``_SectionBuffer.check_lz4``); what that
    declines, and every other codec, takes ``_decompressed_records`` and then the check."""
    try:
        if records[position + ATTRIBUTES_OFFSET + 1] & COMPRESSION_MASK == LZ4:
            max_timestamp = _section_buffer.check_lz4(records, position, checks)
            if max_timestamp is not None:
                return max_timestamp
        with _decompressed_records(records, position) as section:
            return check_compressed_records(records, position, section, checks)
    except RecordsRejected as rejected:
        raise _record_errors(*rejected.args[1:], checks, topic_partition) from None


class _SectionBuffer(threading.local):
    """One thread's reusable output buffer for decompressed sections: an anonymous mapping
    of ``WHOLE_SECTION_MAX_BYTES`` + 1 (a section of the limit fits with a byte to spare),
    created on the thread's first compressed batch. A fresh buffer per batch cost a page
    fault for every 4 KiB inflated (the allocator hands a section's pages back to the
    kernel when it is freed, and the next one faults them in again): more CPU than lz4's
    decoding itself. Pages stay mapped up to ``SECTION_BUFFER_RESIDENT_BYTES``; the rest,
    touched only by a larger section (or a bomb filling the buffer), is returned
    (``MADV_DONTNEED``) once that section is checked or refused, so each thread holds at
    most that much between batches. Used by its own thread only, one section at a time."""

    def __init__(self) -> None:
        self.buffer = mmap.mmap(-1, WHOLE_SECTION_MAX_BYTES + 1)

    def inflate(self, codec: int, payload: memoryview) -> int | None:
        """``compression.decompress_into`` the buffer: the section's size, None where it
        declines the data; ``MessageTooLarge`` past ``WHOLE_SECTION_MAX_BYTES``."""
        try:
            written = decompress_into(codec, payload, self.buffer)
        except MessageTooLarge:
            self._return_pages_above_resident()
            raise
        if written is None:  # the decoder may have written far before declining
            self._return_pages_above_resident()
        return written

    def check_lz4(self, records: bytes | bytearray | memoryview, position: int,
                  checks: RecordChecks) -> int | None:
        """``kernel.check_lz4_records`` of the lz4 batch at ``position`` into the buffer:
        its max timestamp, or None where the kernel declines the section (the general path
        then raises the precise error); pages above the resident limit are returned after a
        section larger than it, a decline or an error."""
        try:
            checked = check_lz4_records(records, position, self.buffer, checks)
        except BaseException:
            self._return_pages_above_resident()
            raise
        if checked is None or checked[1] > SECTION_BUFFER_RESIDENT_BYTES:
            self._return_pages_above_resident()
        return None if checked is None else checked[0]

    @contextmanager
    def section(self, size_bytes: int) -> Iterator[memoryview]:
        """The first ``size_bytes`` of the buffer (what ``inflate`` wrote), inside the
        block; pages above the resident limit are returned after it."""
        try:
            with memoryview(self.buffer) as whole, whole[:size_bytes] as view:
                yield view
        finally:
            if size_bytes > SECTION_BUFFER_RESIDENT_BYTES:
                self._return_pages_above_resident()

    def _return_pages_above_resident(self) -> None:
        self.buffer.madvise(mmap.MADV_DONTNEED, SECTION_BUFFER_RESIDENT_BYTES,
                            len(self.buffer) - SECTION_BUFFER_RESIDENT_BYTES)


_section_buffer = _SectionBuffer()


@contextmanager
def _decompressed_records(records: bytes | bytearray | memoryview, position: int
                          ) -> Iterator[bytes | memoryview]:
    """The records section of the compressed batch at ``position``, decompressed, for the
    duration of the block: the one place produce validation decompresses. Into the thread's
    ``_SectionBuffer`` when it fits there; where that decoding declines the data,
    ``decompress_bounded`` with the same limit, which raises the precise error. A section
    inflating past ``WHOLE_SECTION_MAX_BYTES`` is walked as it streams
    (``records.walk_records_section``: one chunk held at a time), so a decompression bomb
    or a malformed section is refused without being held; only a section that passes that
    walk (at most ``compression.MAX_RECORDS_SECTION_BYTES``) is then inflated whole for the
    record checks."""
    with memoryview(records) as view:
        size_bytes = int.from_bytes(view[position + 8 : position + 12], "big") + 12
        codec = view[position + 22] & COMPRESSION_MASK
        with view[position + BATCH_HEADER_BYTES : position + size_bytes] as payload:
            whole = None
            try:
                written = _section_buffer.inflate(codec, payload)
                if written is None:
                    whole = decompress_bounded(codec, payload, WHOLE_SECTION_MAX_BYTES)
            except MessageTooLarge:
                header = parse_header(view, position)
                walk_records_section(header, section_chunks(header, payload))
                written, whole = None, decompress(codec, payload)
            if written is None:
                yield whole
            else:
                with _section_buffer.section(written) as section:
                    yield section


def _record_errors(errors: tuple[tuple[int, int, int, int], ...], total: int,
                   checks: RecordChecks, topic_partition: str) -> KafkaError:
    """Kafka's RecordValidationException for the refused records of one batch (``total`` of
    them, the first ``errors`` listed by the kernel): each record error with Kafka's message;
    InvalidTimestamp if any is a timestamp, else InvalidRecord."""
    no_key = f"Compacted topic cannot accept message without key in topic partition {topic_partition}"
    listed = tuple((index, no_key if kind == RECORD_ERROR_NO_KEY
                    else _timestamp_error(kind, timestamp, offset_delta, checks))
                   for index, kind, timestamp, offset_delta in errors)
    if any(kind != RECORD_ERROR_NO_KEY for _, kind, _, _ in errors):
        error: KafkaError = InvalidTimestamp(
            "One or more records have been rejected due to invalid timestamp")
    else:
        shown = ", ".join(f"RecordError(batchIndex={index}, message='{message}')"
                          for index, message in listed[:RECORD_ERRORS_SHOWN])
        error = InvalidRecord(
            f"One or more records have been rejected due to {total} record errors in "
            f"total, and only showing the first three errors at most: [{shown}]")
    error.record_errors = listed
    return error


def _timestamp_error(kind: int, timestamp: int, offset_delta: int, checks: RecordChecks) -> str:
    if kind == RECORD_ERROR_TIMESTAMP_TYPE:
        return (f"Invalid timestamp type in message DefaultRecord(offset={offset_delta}, "
                f"timestamp={timestamp}). Producer should not set timestamp type to "
                "LogAppendTime.")
    now_ms, before_max_ms, after_max_ms = checks[3:]
    return (f"Timestamp {timestamp} of message with offset {offset_delta} is out of range. The "
            f"timestamp should be within [{now_ms - before_max_ms}, {now_ms + after_max_ms}]")


def target_codec(config: LogConfig) -> int | None:
    """The codec stored batches must have, or None for ``compression.type=producer``."""
    if config.compression_type == "producer":
        return None
    return codec_by_name(config.compression_type)


def needs_recompression(summaries: tuple[Summary, ...], codec: int) -> bool:
    return any(summary[2] & COMPRESSION_MASK != codec and not summary[2] & CONTROL_BIT
               for summary in summaries)


def recompress_for_topic(records: bytearray, summaries: tuple[Summary, ...], codec: int,
                         max_message_bytes: int) -> tuple[bytearray, tuple[Summary, ...]]:
    """The request with every non-control batch in ``codec`` (others copied unchanged),
    and its summaries; ``MessageTooLarge`` if a rebuilt batch outgrows max.message.bytes."""
    rebuilt = bytearray()
    view = memoryview(records)
    for position, size_bytes, attributes, *_ in summaries:
        if attributes & COMPRESSION_MASK == codec or attributes & CONTROL_BIT:
            rebuilt += view[position : position + size_bytes]
        else:
            rebuilt += recompress_batch(view, position, codec, max_message_bytes)
    view.release()
    new_summaries = kernel_validate_batches(rebuilt)
    for summary in new_summaries:
        if summary[1] > max_message_bytes:
            raise MessageTooLarge(f"batch recompressed to {summary[1]} bytes exceeds "
                                  f"max.message.bytes {max_message_bytes}")
    return rebuilt, new_summaries
