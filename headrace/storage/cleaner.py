"""Log compaction: the cleaner's two passes over one partition log, in bounded memory.

Owns the algorithm (Kafka's ``Cleaner``, WarpStream's two-pass dedupe, seed 000):

1. Pass 1 maps key hash -> latest offset (``OffsetMap``) over the dirty section: from the
   first dirty offset (the cleaner-offset-checkpoint) to ``cleanable_end_offset`` -- never
   the active segment, never a segment whose largest timestamp is newer than
   ``min.compaction.lag.ms``, and at most ``MAX_OFFSET_SPAN`` (2**26) offsets per cleaning
   (the map's offset field; the rest is the next cleaning's dirty section, as when Kafka's
   map fills).
2. Pass 2 rewrites every closed segment from the log start up to that end offset, grouped so
   each output stays within ``segment.bytes``, the index size and the 2**31 relative-offset
   range. A record is kept iff it has a key and its offset is >= the key's mapped offset
   (absent keys are kept); a tombstone (null value) is kept until the delete horizon
   stamped in its batch has passed.

Beyond Kafka: when the dirty section holds more distinct keys than the map, the cleaning is
split into passes over disjoint ranges of ``h2 >> 32`` (halving a range whenever its keys
overflow the map); records outside a pass's range are kept by that pass, so one ``clean``
call removes every duplicate whatever the cardinality.

Batches: offsets never change. A batch whose records are all kept (and that needs no delete
horizon) is copied byte for byte; a batch that loses every record disappears, except that
the last batch of a producer id is kept as an empty batch (0 records, same offsets and
producer id/epoch/sequence) so producer state survives, as Kafka does; any other batch is
re-encoded with the same header fields and codec. Tombstones (KIP-534): the first cleaning
that sees a batch holding tombstones sets ``DELETE_HORIZON_BIT`` and puts clean time +
``delete.retention.ms`` in ``base_timestamp`` (record timestamp deltas rewritten so record
timestamps stay unchanged); a cleaning at or after that horizon drops them. Control batches
(transaction markers) and aborted transactional data are copied unchanged (not removed yet).

Files: each group is written to ``<base>.log.cleaned``, fsynced, and swapped in by
``Log.replace_segments`` (``.cleaned`` -> ``.swap`` -> ``.log``; see ``log`` for crash rules).

Thread-safety: one ``Cleaner`` (and its map) per cleaner thread; it works on a log
concurrently with appends and reads, touching only closed segments.
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import crc32c
import numpy as np

from headrace.protocol.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_BYTES,
    COMPRESSION_MASK,
    CRC_OFFSET,
    DELETE_HORIZON_BIT,
    LOG_OVERHEAD_BYTES,
    BatchHeader,
    iter_headers,
    parse_header,
)
from headrace.protocol.compression import compress
from headrace.protocol.kernel import KeyHashes, hash_keys
from headrace.protocol.records import Record, decode_batch, write_varint
from headrace.storage.log import CLEANED_SUFFIX, Log
from headrace.storage.offset_map import (
    HASH_RANGE_VALUES,
    MAX_OFFSET_SPAN,
    OffsetMap,
    hash_range_values,
)
from headrace.storage.segment import (
    LOG_SUFFIX,
    MAX_RELATIVE_OFFSET,
    LogSegment,
    segment_file_name,
)

logger = logging.getLogger(__name__)

DEFAULT_IO_CHUNK_BYTES = 4 * 1024 * 1024
NO_HORIZON = np.iinfo(np.int64).max
_HEADER = struct.Struct(">qiibIhiqqqhii")
_CLEANED_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC


@dataclass(slots=True)
class CleanerStats:
    """Figures of one ``clean`` call (Kafka's ``CleanerStats``)."""

    bytes_read: int = 0
    bytes_written: int = 0
    messages_read: int = 0
    messages_written: int = 0
    map_messages_read: int = 0
    start_size_bytes: int = 0
    end_size_bytes: int = 0
    passes: int = 0
    max_buffer_utilization: float = 0.0
    elapsed_secs: float = 0.0
    end_offset: int = 0  # the new cleaner checkpoint: first offset not yet cleaned
    groups: list[int] = field(default_factory=list)


def cleanable_end_offset(log: Log, now_ms: int, first_dirty_offset: int) -> int:
    """First offset the cleaner may not touch: the active segment's base, or the base of the
    first segment with a record newer than ``min.compaction.lag.ms``, capped at
    ``MAX_OFFSET_SPAN`` offsets past the first dirty offset."""
    segments = log.segments
    end = segments[-1].base_offset
    lag_ms = log.config.min_compaction_lag_ms
    if lag_ms > 0:
        for segment in segments[:-1]:
            if segment.largest_timestamp_ms > now_ms - lag_ms:
                end = min(end, segment.base_offset)
                break
    return min(end, first_dirty_offset + MAX_OFFSET_SPAN)


def iter_chunks(segment: LogSegment, start_position: int, end_position: int,
                chunk_bytes: int) -> Iterator[tuple[int, bytes]]:
    """(position, bytes) of runs of whole batches of ``segment``, about ``chunk_bytes`` each
    (one batch larger than that comes alone)."""
    position = start_position
    while position < end_position:
        length = min(chunk_bytes, end_position - position)
        data = segment.fs.pread(segment.fd, length, position)
        whole = _whole_batches_length(data)
        if whole == 0:
            first_size = parse_header(data).size_bytes
            data = segment.fs.pread(segment.fd, first_size, position)
            whole = len(data)
        yield position, data[:whole]
        position += whole


def _whole_batches_length(data: bytes) -> int:
    pos = 0
    while pos + LOG_OVERHEAD_BYTES <= len(data):
        size_bytes = struct.unpack_from(">i", data, pos + 8)[0] + LOG_OVERHEAD_BYTES
        if pos + size_bytes > len(data):
            break
        pos += size_bytes
    return pos


class Cleaner:
    """Compacts one log at a time with its own offset map."""

    def __init__(self, offset_map: OffsetMap, io_chunk_bytes: int = DEFAULT_IO_CHUNK_BYTES
                 ) -> None:
        self.offset_map = offset_map
        self.io_chunk_bytes = io_chunk_bytes

    def clean(self, log: Log, first_dirty_offset: int, now_ms: int) -> CleanerStats:
        """Clean ``log`` from ``first_dirty_offset``; returns the stats, whose ``end_offset``
        is the new cleaner checkpoint."""
        stats = CleanerStats(start_size_bytes=log.size_bytes)
        first_dirty = max(first_dirty_offset, log.log_start_offset)
        end_offset = cleanable_end_offset(log, now_ms, first_dirty)
        stats.end_offset = max(end_offset, first_dirty)
        if end_offset <= first_dirty:
            stats.end_size_bytes = log.size_bytes
            return stats
        ranges = [(0, HASH_RANGE_VALUES)]
        while ranges:
            low, high = ranges.pop(0)
            if not self._build_map(log, first_dirty, end_offset, low, high, stats):
                if high - low < 2:
                    raise MemoryError("one key-hash value overflows the dedupe buffer")
                middle = (low + high) // 2
                ranges[0:0] = [(low, middle), (middle, high)]
                continue
            stats.passes += 1
            stats.max_buffer_utilization = max(stats.max_buffer_utilization,
                                               self.offset_map.utilization)
            self._rewrite(log, end_offset, low, high, now_ms, stats)
        stats.end_size_bytes = log.size_bytes
        return stats

    # ---- pass 1 --------------------------------------------------------------------------

    def _build_map(self, log: Log, first_dirty: int, end_offset: int, low: int, high: int,
                   stats: CleanerStats) -> bool:
        """Map the dirty keys of hash range [low, high); False if they overflow the map."""
        offset_map = self.offset_map
        offset_map.clear(first_dirty)
        for segment, start, end in _segment_ranges(log, first_dirty, end_offset):
            for _, chunk in iter_chunks(segment, start, end, self.io_chunk_bytes):
                keys = hash_keys(chunk)
                stats.map_messages_read += keys.count
                wanted = keys.has_key & (keys.offsets >= first_dirty) & \
                    (keys.offsets < end_offset) & _in_range(keys, low, high)
                hash_hi, hash_lo = keys.hash_hi[wanted], keys.hash_lo[wanted]
                if offset_map.put(hash_hi, hash_lo, keys.offsets[wanted]) < len(hash_hi):
                    return False
        return True

    # ---- pass 2 --------------------------------------------------------------------------

    def _rewrite(self, log: Log, end_offset: int, low: int, high: int, now_ms: int,
                 stats: CleanerStats) -> None:
        for group in group_segments(log, end_offset):
            cleaned_path = group[0].directory / segment_file_name(
                group[0].base_offset, LOG_SUFFIX + CLEANED_SUFFIX)
            try:
                self._write_group(log, group, cleaned_path, low, high, now_ms, stats)
            except BaseException:
                if log.fs.exists(cleaned_path):
                    log.fs.remove(cleaned_path)
                raise
            log.replace_segments(group, cleaned_path, now_ms)
            stats.groups.append(len(group))

    def _write_group(self, log: Log, group: list[LogSegment], cleaned_path: Path, low: int,
                     high: int, now_ms: int, stats: CleanerStats) -> None:
        fd = log.fs.open(cleaned_path, _CLEANED_FLAGS)
        try:
            for segment in group:
                for _, chunk in iter_chunks(segment, 0, segment.size_bytes, self.io_chunk_bytes):
                    output = self._clean_chunk(log, chunk, low, high, now_ms, stats)
                    if output:
                        log.fs.write(fd, output)
                        stats.bytes_written += len(output)
            log.fs.fsync(fd)
        finally:
            log.fs.close(fd)

    def _clean_chunk(self, log: Log, chunk: bytes, low: int, high: int, now_ms: int,
                     stats: CleanerStats) -> bytearray:
        stats.bytes_read += len(chunk)
        headers = list(iter_headers(chunk))
        keys = hash_keys(chunk)
        stats.messages_read += keys.count
        data_batches = [(pos, h) for pos, h in headers if not h.is_control]
        last_offsets = np.fromiter((h.last_offset for _, h in data_batches), np.int64,
                                   len(data_batches))
        horizons = np.fromiter((h.base_timestamp if h.has_delete_horizon else NO_HORIZON
                                for _, h in data_batches), np.int64, len(data_batches))
        batch_of_record = np.searchsorted(last_offsets, keys.offsets)
        keep = self._keep_mask(keys, batch_of_record, horizons, low, high, now_ms)
        batches = len(data_batches)
        kept_counts = np.bincount(batch_of_record, weights=keep, minlength=batches)
        totals = np.bincount(batch_of_record, minlength=batches)
        kept_tombstones = np.bincount(batch_of_record, weights=keep & keys.is_tombstone,
                                      minlength=batches)
        record_starts = np.concatenate(([0], np.cumsum(totals)))
        output = bytearray()
        data_index = 0
        for pos, header in headers:
            raw = memoryview(chunk)[pos : pos + header.size_bytes]
            if header.is_control:
                output += raw
                continue
            i = data_index
            data_index += 1
            kept, total = int(kept_counts[i]), int(totals[i])
            stats.messages_written += kept
            if kept == total and (kept_tombstones[i] == 0 or header.has_delete_horizon):
                output += raw
            elif kept == 0:
                if _is_last_batch_of_producer(log, header):
                    output += _empty_batch(header)
            else:
                horizon = header.base_timestamp if header.has_delete_horizon else (
                    now_ms + log.config.delete_retention_ms if kept_tombstones[i] else None)
                mask = keep[record_starts[i] : record_starts[i + 1]]
                output += _rebuild_batch(raw, header, mask, horizon)
        return output

    def _keep_mask(self, keys: KeyHashes, batch_of_record: np.ndarray, horizons: np.ndarray,
                   low: int, high: int, now_ms: int) -> np.ndarray:
        """Per record: keyed, and outside this pass's hash range or the key's latest record
        (not an expired tombstone)."""
        in_range = _in_range(keys, low, high)
        mapped = np.full(keys.count, -1, np.int64)
        looked_up = np.flatnonzero(in_range)
        mapped[looked_up] = self.offset_map.get(keys.hash_hi[looked_up],
                                                keys.hash_lo[looked_up])
        latest = keys.offsets >= mapped
        expired_tombstone = keys.is_tombstone & (horizons[batch_of_record] <= now_ms)
        return keys.has_key & (~in_range | (latest & ~expired_tombstone))


def _in_range(keys: KeyHashes, low: int, high: int) -> np.ndarray:
    if low == 0 and high == HASH_RANGE_VALUES:
        return np.ones(keys.count, np.bool_)
    values = hash_range_values(keys.hash_lo)
    return (values >= np.uint64(low)) & (values < np.uint64(high))


def _segment_ranges(log: Log, start_offset: int, end_offset: int
                    ) -> Iterator[tuple[LogSegment, int, int]]:
    """(segment, start position, end position) of the closed segments holding offsets in
    [start_offset, end_offset)."""
    segments = log.segments
    for index, segment in enumerate(segments[:-1]):
        if segments[index + 1].base_offset <= start_offset:
            continue
        if segment.base_offset >= end_offset:
            break
        location = segment.find_batch(start_offset, segment.size_bytes)
        if location is not None:
            yield segment, location.position, segment.size_bytes


def group_segments(log: Log, end_offset: int) -> list[list[LogSegment]]:
    """Consecutive closed segments with base offset < ``end_offset``, grouped so that each
    group's bytes fit ``segment.bytes``, its index entries fit ``segment.index.bytes`` and
    its offsets fit the 2**31 relative-offset range (Kafka's ``groupSegmentsBySize``)."""
    segments = log.segments
    config = log.config
    groups: list[list[LogSegment]] = []
    index = 0
    closed = len(segments) - 1
    while index < closed and segments[index].base_offset < end_offset:
        group = [segments[index]]
        size_bytes = segments[index].size_bytes
        entries = segments[index].offset_index.entries
        index += 1
        while index < closed and segments[index].base_offset < end_offset:
            candidate = segments[index]
            next_base = segments[index + 1].base_offset
            if size_bytes + candidate.size_bytes > config.segment_bytes or \
                    entries + candidate.offset_index.entries >= candidate.offset_index.max_entries \
                    or next_base - 1 - group[0].base_offset > MAX_RELATIVE_OFFSET:
                break
            group.append(candidate)
            size_bytes += candidate.size_bytes
            entries += candidate.offset_index.entries
            index += 1
        groups.append(group)
    return groups


def _is_last_batch_of_producer(log: Log, header: BatchHeader) -> bool:
    if header.producer_id < 0:
        return False
    entry = log.producer_state.producers.get(header.producer_id)
    return entry is not None and bool(entry.batches) and \
        entry.batches[-1].last_offset == header.last_offset


def _empty_batch(header: BatchHeader) -> bytes:
    """The batch with no records: same offsets, producer fields and timestamps."""
    attributes = header.attributes & ~COMPRESSION_MASK
    return _seal(header, attributes, header.base_timestamp, header.max_timestamp, 0, b"")


def _rebuild_batch(raw: memoryview, header: BatchHeader, keep: np.ndarray,
                   horizon_ms: int | None) -> bytes:
    """Re-encode the batch with the kept records, the same header fields and codec; with
    ``horizon_ms`` the delete horizon goes into base_timestamp."""
    records = [r for r, kept in zip(decode_batch(raw).records, keep.tolist(), strict=True)
               if kept]
    attributes = header.attributes
    if horizon_ms is not None:
        attributes |= DELETE_HORIZON_BIT
        base_timestamp = horizon_ms
    else:
        base_timestamp = records[0].timestamp_ms
    if header.is_log_append_time:
        max_timestamp = header.max_timestamp
    else:
        max_timestamp = max(r.timestamp_ms for r in records)
    section = _encode_records(records, header.base_offset, base_timestamp)
    if header.compression:
        section = compress(header.compression, section)
    return _seal(header, attributes, base_timestamp, max_timestamp, len(records), section)


def _encode_records(records: list[Record], base_offset: int, base_timestamp: int) -> bytes:
    out = bytearray()
    for record in records:
        body = bytearray(b"\x00")
        write_varint(body, record.timestamp_ms - base_timestamp)
        write_varint(body, record.offset - base_offset)
        _write_nullable(body, record.key)
        _write_nullable(body, record.value)
        write_varint(body, len(record.headers))
        for item in record.headers:
            encoded_key = item.key.encode()
            write_varint(body, len(encoded_key))
            body += encoded_key
            _write_nullable(body, item.value)
        write_varint(out, len(body))
        out += body
    return bytes(out)


def _write_nullable(out: bytearray, data: bytes | None) -> None:
    if data is None:
        write_varint(out, -1)
    else:
        write_varint(out, len(data))
        out += data


def _seal(header: BatchHeader, attributes: int, base_timestamp: int, max_timestamp: int,
          records_count: int, section: bytes) -> bytes:
    batch_length = BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + len(section)
    batch = bytearray(_HEADER.pack(
        header.base_offset, batch_length, header.partition_leader_epoch, header.magic, 0,
        attributes, header.last_offset_delta, base_timestamp, max_timestamp,
        header.producer_id, header.producer_epoch, header.base_sequence, records_count))
    batch += section
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c.crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)

