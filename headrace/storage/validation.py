"""Produce-side validation of record batches before the log appends them (Kafka's LogValidator).

Owns the checks every appended request passes and the broker-side recompression that the
topic's ``compression.type`` asks for:

* structure and integrity, in the compiled kernel (``kernel.validate_batches``, one call per
  request): whole v2 batches only, magic 2, a plausible ``batch_length``, CRC-32C over
  attributes..end -- ``CorruptMessage``;
* the request is at most ``segment.bytes`` -- ``RecordListTooLarge``; each batch at most
  ``max.message.bytes`` (before and after recompression) -- ``MessageTooLarge``;
* ``records_count == last_offset_delta + 1 >= 1`` -- ``InvalidRecord``;
* CreateTime timestamps within ``message.timestamp.before.max.ms`` /
  ``message.timestamp.after.max.ms`` of broker time -- ``InvalidTimestamp``.

The per-batch limits run in the kernel too (``kernel.first_batch_outside_limits``, one call);
Python only names the error of the batch it points at. The log's plain path
(``kernel.append_plain_batch``) applies the same checks to a single batch and declines
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

Pure functions over the caller's buffer; thread-safe.
"""

from __future__ import annotations

from headrace.errors import (
    CorruptMessage,
    InvalidRecord,
    InvalidTimestamp,
    MessageTooLarge,
    RecordListTooLarge,
)
from headrace.protocol.batch import COMPRESSION_MASK, CONTROL_BIT, NO_TIMESTAMP
from headrace.protocol.compression import codec_by_name
from headrace.protocol.kernel import first_batch_outside_limits
from headrace.protocol.kernel import validate_batches as kernel_validate_batches
from headrace.protocol.records import recompress_batch
from headrace.storage.config import LogConfig

Summary = tuple[int, int, int, int, int, int, int, int]

__all__ = ["Summary", "needs_recompression", "recompress_for_topic", "target_codec",
           "validate_request"]


def validate_request(records: bytearray, config: LogConfig, now_ms: int) -> tuple[Summary, ...]:
    """Check a produce request's batches against the topic config; their summaries.
    Two kernel calls and no Python loop per batch: this runs on every append."""
    summaries = kernel_validate_batches(records)
    if not summaries:
        raise CorruptMessage("produce request carries no record batch")
    if len(records) > config.segment_bytes:
        raise RecordListTooLarge(
            f"{len(records)} bytes exceed segment.bytes {config.segment_bytes}")
    bad = first_batch_outside_limits(
        summaries, config.max_message_bytes, now_ms, config.message_timestamp_before_max_ms,
        config.message_timestamp_after_max_ms, config.message_timestamp_type != "LogAppendTime")
    if bad >= 0:
        _raise_for_batch(summaries[bad], config, now_ms)
    return summaries


def _raise_for_batch(summary: Summary, config: LogConfig, now_ms: int) -> None:
    """The error for the batch ``first_batch_outside_limits`` picked, checks in Kafka's
    order: size, record count, timestamps."""
    _, size_bytes, _, last_offset_delta, base_ms, max_ms, _, records_count = summary
    if size_bytes > config.max_message_bytes:
        raise MessageTooLarge(f"batch of {size_bytes} bytes exceeds max.message.bytes "
                              f"{config.max_message_bytes}")
    if records_count != last_offset_delta + 1 or records_count < 1:
        raise InvalidRecord(f"batch has {records_count} records but last offset delta "
                            f"{last_offset_delta}")
    _raise_invalid_timestamp(base_ms, max_ms, config, now_ms)


def _raise_invalid_timestamp(base_ms: int, max_ms: int, config: LogConfig, now_ms: int) -> None:
    before_max_ms = config.message_timestamp_before_max_ms
    after_max_ms = config.message_timestamp_after_max_ms
    for timestamp in (base_ms, max_ms):
        if timestamp != NO_TIMESTAMP and (now_ms - timestamp > before_max_ms
                                          or timestamp - now_ms > after_max_ms):
            raise InvalidTimestamp(
                f"timestamp {timestamp} is out of the allowed range for broker time {now_ms} "
                f"(message.timestamp.before.max.ms {before_max_ms}, "
                f"message.timestamp.after.max.ms {after_max_ms})")


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
