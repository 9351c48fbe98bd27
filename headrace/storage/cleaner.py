"""Log compaction: the cleaner's two passes over one partition log, in bounded memory.

Owns the algorithm (Kafka's ``Cleaner``, WarpStream's two-pass dedupe, seed 000):

1. Pass 1 maps key hash -> its latest record (``OffsetMap``) over the dirty section: from the
   first dirty offset (the cleaner-offset-checkpoint) to ``cleanable_end_offset`` -- never
   the active segment, never a segment whose largest timestamp is newer than
   ``min.compaction.lag.ms``. A record is named by its ordinal: the count of the pass's
   records (keyed, dirty, in the pass's hash range) before it, so the map's 26-bit field
   limits a pass to 2**26 of its own records, not the cleaning's offset span.
2. Pass 2 rewrites every closed segment from the log start up to that end offset, grouped so
   each output stays within ``segment.bytes``, the index sizes and the 2**31 relative-offset
   range (Kafka's ``groupSegmentsBySize``). It numbers the records as pass 1 did and keeps a
   record iff it has a key and is outside the pass's hash range, or its key is unmapped, or
   it is the mapped (latest) record; a tombstone (null value) is kept until the delete
   horizon stamped in its batch has passed.

Beyond Kafka: when the dirty section holds more distinct keys (or records) than one map
holds, the cleaning is split into passes over disjoint ranges of ``h2 >> 32``; records
outside a pass's range are kept by that pass, so one ``clean`` call removes every duplicate
whatever the cardinality. The first overflow is followed by a sampling scan of a narrow
range that sizes the split (each extra range costs a rewrite); a range that still
overflows is halved.

The per-record work of both passes -- parsing, MurmurHash3, map inserts and lookups, the
keep decision, copying kept records -- and their I/O are in the compiled kernel
(``segment_io.map_span``, ``segment_io.filter_span``): one call runs a pass over a span of about
``span_bytes`` of a segment, reads and writes included, without the GIL; Python runs between
spans (the hook), for the few compressed batches (``segment_io.map_batches`` /
``segment_io.filter_batches`` over one chunk: decompressed and recompressed in Python) and to
grow the buffer. So a cleaning re-takes the GIL a few hundred times per GB, not several times
per chunk: a thread that keeps releasing and re-taking the GIL starves the broker's event
loop of it (produce p99 during an unthrottled cleaning).

Batches: offsets never change. A batch whose records are all kept (and that needs no delete
horizon) is copied byte for byte; a batch that loses every record disappears, except that
the last batch of a producer id is kept as an empty batch (0 records, same offsets and
producer id/epoch/sequence) so producer state survives, as Kafka does; any other batch is
rebuilt with the same header fields and codec and its kept records' bytes, timestamp deltas
rebased. Tombstones (KIP-534): the first cleaning that sees a batch holding tombstones sets
``DELETE_HORIZON_BIT`` and puts clean time + ``delete.retention.ms`` in ``base_timestamp``
(record timestamps unchanged); a cleaning at or after that horizon drops them. Aborted
transactions (Kafka's ``CleanedTransactionMetadata``): the data batches of the transactions
the aborted-transaction indexes list, below the cleanable end, are neither mapped in pass 1
(so an aborted record never shadows a committed one) nor numbered, and are removed in pass 2
(a producer's last batch stays, empty, as above; an emptied batch that no longer is its
producer's last goes, as Kafka's DELETE_EMPTY). Transaction markers (Kafka 3.x's
``CleanedTransactionMetadata`` with KIP-534's horizon): pass 2 notes, per producer, the
transactional data batches it meets from the log start on (``TxnMarkerState``, carried
across the rewrite's spans, chunks and groups); a marker stays while any transactional batch
of its producer (an emptied one too) lies between it and the producer's previous marker.
Once none does, the first cleaning that finds it so stamps its delete horizon (clean time +
``delete.retention.ms``), and a cleaning at or after that horizon removes it. A marker that
is its producer's last record at the producer's epoch stays whole, for fencing (Kafka empties
it, keeping the batch). The cleaned segments keep the aborted-transaction entries of the
replaced ones except those whose marker lies below the cleanable end: their data is gone,
and an entry outliving its marker would make read_committed consumers skip the producer's
next, committed transaction.

I/O: both passes read segments chunk by chunk into one reused, aligned buffer of
``io_chunk_bytes`` (no bytes object per chunk): a chunk in the page cache with ``pread``, one
that is not with ``O_DIRECT`` through a second descriptor of the segment (``segment_io.map_span``):
buffered reads of cold segments fill the page cache and run readahead, which stalled the
broker's other threads on a small machine (produce p99 during a cleaning that re-read the
previous cleaning's output: 2.0-2.5 ms with buffered reads, 0.5-1.1 ms with direct ones), and
would evict the pages the broker's readers use for bytes read once. For the rest of a
segment with a batch larger than a chunk, a buffer of that batch's size rounded up to a
multiple of it (Kafka's ``growBuffersOrFail``: producers write batches of up to 1 MB), kept
until the end of the cleaning; pass 2 writes each chunk's cleaned bytes as it goes, so memory
stays at the read buffer plus about one chunk of output and the ``O_DIRECT`` stage
(``direct_stage_bytes``, 4 MiB). Pass 1 uses a map table sized to the dirty section's offset
span (``OffsetMap.clear``), falling back to the whole buffer.

Files: each group is written to ``<base>.log.cleaned``, fsynced, and swapped in by
``Log.replace_segments`` (``.cleaned`` -> ``.swap`` -> ``.log``; see ``local_log`` and
``log_loader`` for the crash rules).
``log.fs`` opens, fsyncs and closes it and writes the recompressed chunks; the kernel's spans
read the segments and write to that descriptor themselves, each on a helper thread
``span_niceness`` nicer than the caller (see ``segment_io.map_span``). The ``.cleaned`` file is opened
with ``O_DIRECT`` where the file system allows it (``_CleanedFile``): a cleaning then leaves
no dirty page cache for write-back to flush while the broker serves requests (its pages are
read back from disk on the next fetch of them). The file's offset and time index entries are
computed as its bytes are written (by the spans in the kernel, by ``index_batches`` for
recompressed chunks) and handed to ``replace_segments``, which so writes the new segment's
indexes without re-reading the file under the log's lock.

Hook: ``on_chunk(log, bytes_read)``, if given, is called after each span (and each chunk of
compressed batches) of either pass with the bytes it consumed; the broker uses it to
throttle (log.cleaner.io.max.bytes.per.second) and to abort (it raises ``CleaningAborted``,
leaving no ``.cleaned`` file behind).

Thread-safety: one ``Cleaner`` (and its map) per cleaner thread; it works on a log
concurrently with appends and reads, touching only closed segments. The kernel calls
release the GIL.
"""

from __future__ import annotations

import bisect
import errno
import logging
import math
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from headrace.errors import CorruptMessage
from headrace.protocol.kernel import whole_batches_bytes
from headrace.storage.fs import FileSystem
from headrace.storage.local_log import CLEANED_SUFFIX, CleaningAborted
from headrace.storage.log import Log
from headrace.storage.offset_map import HASH_RANGE_VALUES, MAX_OFFSET_SPAN, OffsetMap
from headrace.storage.segment import (
    LOG_SUFFIX,
    MAX_RELATIVE_OFFSET,
    LogSegment,
    segment_file_name,
)
from headrace.storage.segment_io import (
    DIRECT_READ_ALIGN_BYTES,
    DIRECT_READ_SLACK_BYTES,
    SPAN_COMPRESSED,
    SPAN_FULL,
    SPAN_GROW,
    FilterSpan,
    IndexedBatches,
    IndexState,
    MapSpan,
    OutputIndex,
    PassScope,
    TxnMarkerState,
    aborted_txn_triples,
    aligned_buffer,
    filter_batches,
    filter_span,
    index_batches,
    read_chunk,
    txn_marker_state,
)

logger = logging.getLogger(__name__)

DEFAULT_IO_CHUNK_BYTES = 4 * 1024 * 1024
# Bytes a pass covers per kernel call: the GIL is re-taken (and the hook runs) once per span,
# at ~1 GB/s every ~30 ms -- a few dozen times per GB, so the cleaner thread rarely holds the
# GIL when the event loop wants it. A throttled cleaner takes smaller spans (span_bytes_for).
DEFAULT_SPAN_BYTES = 32 * 1024 * 1024
SPAN_MS_AT_MAX_RATE = 100  # a throttled span is what the I/O limit allows in this time
SAMPLE_HEADROOM = 2  # the sampling range is sized to hold twice the extrapolated keys
SPLIT_HEADROOM = 1.1  # ranges are sized to hold the estimated keys plus 10%
_CLEANED_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
# O_DIRECT writes must start, end and sit in memory on a multiple of the device's logical
# block size; 4 KiB is the largest in common use (Linux reports 512 or 4096). The kernel's
# direct reads use the same.
DIRECT_IO_ALIGNMENT_BYTES = DIRECT_READ_ALIGN_BYTES
# One O_DIRECT write of the .cleaned file: large, as each waits for the device.
DIRECT_STAGE_BYTES = 4 * 1024 * 1024
ReadBuffer = bytearray | np.ndarray  # writable, contiguous bytes


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


class _CleanedIndex:
    """The offset and time index of a ``.cleaned`` file, computed as its bytes are written
    (the spans index their output in the kernel; recompressed chunks are indexed here) --
    what recovery would compute from the finished file, handed to ``Log.replace_segments``
    so the swap re-reads nothing."""

    def __init__(self, base_offset: int, index_interval_bytes: int) -> None:
        self.index_interval_bytes = index_interval_bytes
        self.size_bytes = 0
        self.next_offset = -1
        self.first_max_timestamp_ms: int | None = None
        # a fresh segment's state, as recovery from position 0 starts
        self.state = IndexState(0, -1, base_offset, 0, False)
        self._offset_entries: list[np.ndarray] = []
        self._time_entries: list[np.ndarray] = []

    def output(self) -> OutputIndex:
        """Where the next span's output goes, for ``filter_span``."""
        return OutputIndex(self.size_bytes, self.next_offset, self.index_interval_bytes,
                           self.state)

    def add(self, indexed: IndexedBatches, bytes_written: int) -> None:
        """Take the index of ``bytes_written`` more bytes written at ``size_bytes``."""
        self.size_bytes += bytes_written
        self.next_offset = indexed.next_offset
        if self.first_max_timestamp_ms is None:
            self.first_max_timestamp_ms = indexed.first_max_timestamp_ms
        self.state = indexed.state
        if len(indexed.offset_entries):
            self._offset_entries.append(indexed.offset_entries)
        if len(indexed.time_entries):
            self._time_entries.append(indexed.time_entries)

    def add_written(self, data: memoryview | bytes) -> None:
        """Index ``data``, just written at ``size_bytes`` (CRC-checked as recovery would)."""
        indexed = index_batches(data, self.size_bytes, self.size_bytes + len(data), 0,
                                self.next_offset, self.index_interval_bytes, self.state)
        if indexed.bytes_valid != len(data):
            raise CorruptMessage(f"cleaned output at position {self.size_bytes} fails "
                                 "validation")
        self.add(indexed, len(data))

    def result(self) -> IndexedBatches:
        """The whole file's index, as one ``index_batches`` over it would return it."""
        return IndexedBatches(
            self.size_bytes, self.next_offset, False, self.first_max_timestamp_ms, self.state,
            _stacked(self._offset_entries), _stacked(self._time_entries),
            np.empty(0, np.int64))


class _CleanedFile:
    """A ``.cleaned`` file being written, with ``O_DIRECT`` where the file system allows it:
    the cleaned bytes then bypass the page cache, so a cleaning leaves no dirty pages behind
    for write-back to flush while the broker serves requests. Direct writes go through
    ``stage`` (aligned, ``DIRECT_STAGE_BYTES``): only whole stages are written as the
    cleaning goes, and at the end the staged rest is written zero-padded to a whole block
    and the file truncated to its size. A file system that refuses ``O_DIRECT`` at open
    (``EINVAL``) gets plain writes."""

    def __init__(self, fs: FileSystem, path: Path, stage: np.ndarray) -> None:
        self.fs = fs
        self.size_bytes = 0
        self.stage_fill = 0
        self.stage: np.ndarray | None = stage
        try:
            self.fd = fs.open(path, _CLEANED_FLAGS | os.O_DIRECT)
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            self.stage = None
            self.fd = fs.open(path, _CLEANED_FLAGS)

    def took(self, span: FilterSpan) -> None:
        """Account for the output ``filter_span`` wrote or staged."""
        self.size_bytes += span.bytes_written
        self.stage_fill = span.stage_fill

    def write(self, data: memoryview | bytes) -> None:
        """Append ``data`` (through the stage for a direct file)."""
        self.size_bytes += len(data)
        if self.stage is None:
            self.fs.write(self.fd, data)
            return
        view, stage = memoryview(data), memoryview(self.stage)
        while len(view):
            count = min(len(view), len(stage) - self.stage_fill)
            stage[self.stage_fill:self.stage_fill + count] = view[:count]
            self.stage_fill += count
            view = view[count:]
            if self.stage_fill == len(stage):
                self.fs.write(self.fd, stage)
                self.stage_fill = 0

    def finish(self) -> None:
        """Write what is staged and fsync."""
        if self.stage is not None and self.stage_fill:
            padded = -(-self.stage_fill // DIRECT_IO_ALIGNMENT_BYTES) * DIRECT_IO_ALIGNMENT_BYTES
            self.stage[self.stage_fill:padded] = 0
            self.fs.write(self.fd, memoryview(self.stage)[:padded])
            self.fs.truncate(self.fd, self.size_bytes)
            self.stage_fill = 0
        self.fs.fsync(self.fd)

    def close(self) -> None:
        self.fs.close(self.fd)


def _stacked(entries: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(entries) if entries else np.empty((0, 2), np.int64)


@dataclass(slots=True)
class _MapPass:
    """Pass 1 of one hash range: whether it fit, the ordinal at the start of each dirty
    segment (pass 2 numbers from there), and the share of the dirty bytes scanned."""

    fits: bool
    first_ordinals: dict[int, int]
    scanned_fraction: float
    ordinals: int


def dirty_closed_segments(log: Log, first_dirty_offset: int) -> tuple[LogSegment, ...]:
    """Kafka's ``nonActiveLogSegmentsFrom(firstDirtyOffset)``: the closed segments from the
    one holding ``first_dirty_offset`` on."""
    segments = log.segments[:-1]
    first = max(0, bisect.bisect_right([s.base_offset for s in segments], first_dirty_offset) - 1)
    return segments[first:]


def cleanable_end_offset(log: Log, now_ms: int, first_dirty_offset: int) -> int:
    """First offset the cleaner may not touch (Kafka's ``firstUncleanableDirtyOffset``, never
    below ``first_dirty_offset``): the active segment's base, or the base of the first dirty
    closed segment whose largest timestamp -- its file's last-modified time when no batch
    has a timestamp -- is newer than ``min.compaction.lag.ms``, or the base of the segment
    holding the last stable offset (Kafka never cleans past the LSO: an ongoing
    transaction's records may yet be aborted; whole segments here, as the cleaner rewrites
    whole segments)."""
    end = log.segments[-1].base_offset
    bases = [segment.base_offset for segment in log.segments]
    end = min(end, bases[max(0, bisect.bisect_right(bases, log.last_stable_offset) - 1)])
    lag_ms = max(0, log.config.min_compaction_lag_ms)
    if lag_ms > 0:
        for segment in dirty_closed_segments(log, first_dirty_offset):
            if segment.largest_timestamp_ms() > now_ms - lag_ms:
                end = min(end, segment.base_offset)
                break
    return max(first_dirty_offset, end)


def max_compaction_delay_ms(log: Log, now_ms: int, first_dirty_offset: int) -> int:
    """Kafka's ``maxCompactionDelay``: how far past ``max.compaction.lag.ms`` the earliest
    first-batch timestamp of the dirty closed segments is; timestamps <= 0 (none, or 0 as
    some clients send) are ignored, so they never force a cleaning."""
    first_timestamps = [ts for ts in (s.first_batch_timestamp()
                                      for s in dirty_closed_segments(log, first_dirty_offset))
                        if ts is not None and ts > 0]
    if not first_timestamps:
        return 0
    clean_until_ms = now_ms - max(0, log.config.max_compaction_lag_ms)
    return max(0, clean_until_ms - min(first_timestamps))


def span_bytes_for(max_bytes_per_second: float, io_chunk_bytes: int) -> int:
    """The span for a cleaner held to ``max_bytes_per_second``: what that rate allows in
    ``SPAN_MS_AT_MAX_RATE`` (so a throttled cleaning reads in steps as fine as its sleeps),
    at least one chunk and at most ``DEFAULT_SPAN_BYTES``."""
    allowed_bytes = max_bytes_per_second * SPAN_MS_AT_MAX_RATE / 1000
    return int(max(io_chunk_bytes, min(DEFAULT_SPAN_BYTES, allowed_bytes)))


def _whole_batches_at(segment: LogSegment, direct_fd: int, buffer: ReadBuffer, position: int,
                      end_position: int) -> memoryview:
    """The whole batches of a chunk of ``segment`` read at ``position`` into ``buffer`` (which
    holds at least the first batch there), read as the spans read theirs (``read_chunk``)."""
    want = min(len(buffer) - DIRECT_READ_SLACK_BYTES, end_position - position)
    chunk = read_chunk(segment.fd, direct_fd, buffer, position, want)
    whole = whole_batches_bytes(chunk)
    if whole == 0:
        raise CorruptMessage(f"{segment.log_path}: batch at {position} runs past the end")
    return chunk[:whole]


def _grown_buffer_bytes(batch_bytes: int, io_chunk_bytes: int) -> int:
    """Size of a read buffer holding a ``batch_bytes`` batch: rounded up to a multiple of
    ``io_chunk_bytes``."""
    return -(-batch_bytes // io_chunk_bytes) * io_chunk_bytes


def _open_direct(fs: FileSystem, segment: LogSegment) -> int:
    """``segment``'s file opened again with ``O_DIRECT``, for the spans to read its chunks
    that are not in the page cache; -1 (buffered reads only) where the file system refuses
    ``O_DIRECT`` or the file is gone (retention may delete a segment the cleaner reads: the
    segment's own descriptor still reads it)."""
    try:
        return fs.open(segment.log_path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return -1


class Cleaner:
    """Compacts one log at a time with its own offset map."""

    def __init__(self, offset_map: OffsetMap, io_chunk_bytes: int = DEFAULT_IO_CHUNK_BYTES,
                 on_chunk: Callable[[Log, int], None] | None = None,
                 span_bytes: int = DEFAULT_SPAN_BYTES,
                 direct_stage_bytes: int = DIRECT_STAGE_BYTES, span_niceness: int = 0) -> None:
        if direct_stage_bytes <= 0 or direct_stage_bytes % DIRECT_IO_ALIGNMENT_BYTES:
            raise ValueError(f"direct_stage_bytes must be a positive multiple of "
                             f"{DIRECT_IO_ALIGNMENT_BYTES}")
        self.offset_map = offset_map
        self.io_chunk_bytes = io_chunk_bytes
        self.span_bytes = span_bytes
        self.span_niceness = span_niceness  # the spans' CPU priority below the caller's
        # Aligned, with room for a chunk read with O_DIRECT (see segment_io.map_span).
        self._read_buffer = aligned_buffer(io_chunk_bytes + DIRECT_READ_SLACK_BYTES,
                                            DIRECT_READ_ALIGN_BYTES)
        self._grown_buffer: np.ndarray | None = None  # kept for the rest of one clean()
        self._direct_stage = aligned_buffer(direct_stage_bytes, DIRECT_IO_ALIGNMENT_BYTES)
        self.on_chunk = on_chunk or _no_hook

    def clean(self, log: Log, first_dirty_offset: int, now_ms: int) -> CleanerStats:
        """Clean ``log`` from ``first_dirty_offset``; returns the stats, whose ``end_offset``
        is the new cleaner checkpoint."""
        try:
            return self._clean(log, first_dirty_offset, now_ms)
        finally:
            self._grown_buffer = None

    def _clean(self, log: Log, first_dirty_offset: int, now_ms: int) -> CleanerStats:
        stats = CleanerStats(start_size_bytes=log.size_bytes)
        first_dirty = max(first_dirty_offset, log.log_start_offset)
        end_offset = cleanable_end_offset(log, now_ms, first_dirty)
        stats.end_offset = max(end_offset, first_dirty)
        if end_offset <= first_dirty:
            stats.end_size_bytes = log.size_bytes
            return stats
        ranges = [(0, HASH_RANGE_VALUES)]
        sized = False
        aborted = _aborted_txns(log, end_offset)
        while ranges:
            low, high = ranges.pop(0)
            scope = PassScope(first_dirty, end_offset, low, high, aborted)
            map_pass = self._build_map(log, scope, stats)
            if not map_pass.fits:
                if high - low < 2:
                    raise MemoryError("one key-hash value overflows the dedupe buffer")
                parts = 2 if sized else self._estimate_parts(log, scope, map_pass, stats)
                sized = True
                ranges[0:0] = _split_range(low, high, parts)
                continue
            stats.passes += 1
            stats.max_buffer_utilization = max(stats.max_buffer_utilization,
                                               self.offset_map.utilization)
            self._rewrite(log, scope, map_pass.first_ordinals, now_ms, stats)
        stats.end_size_bytes = log.size_bytes
        return stats

    # ---- pass 1 --------------------------------------------------------------------------

    def _build_map(self, log: Log, scope: PassScope, stats: CleanerStats) -> _MapPass:
        """Map the dirty keys of the scope's hash range to their latest ordinal, in a table
        sized for the dirty section's offset span (which bounds its keys); should a slot be
        out of reach in that table, over again in the whole buffer."""
        offset_map = self.offset_map
        map_pass = self._map_keys(log, scope, stats, scope.end_offset - scope.first_offset)
        if map_pass.fits or offset_map.active_slots == offset_map.capacity_slots:
            return map_pass
        return self._map_keys(log, scope, stats, None)

    def _map_keys(self, log: Log, scope: PassScope, stats: CleanerStats,
                  expected_values: int | None) -> _MapPass:
        offset_map = self.offset_map
        offset_map.clear(0, expected_values)
        first_ordinals: dict[int, int] = {}
        ordinal = scanned = 0
        ranges = list(_segment_ranges(log, scope.first_offset, scope.end_offset))
        total = sum(end - start for _, start, end in ranges) or 1
        for segment, start, end in ranges:
            first_ordinals[segment.base_offset] = ordinal

            def map_span(buffer: ReadBuffer, position: int, end_position: int, direct_fd: int,
                         segment: LogSegment = segment) -> MapSpan:
                nonlocal ordinal
                span = offset_map.put_span(segment.fd, buffer, position, end_position,
                                           self.span_bytes, scope, ordinal,
                                           self.span_niceness, direct_fd)
                stats.map_messages_read += span.records_read
                ordinal = span.next_ordinal
                return span

            def map_chunk(chunk: memoryview) -> bool:
                nonlocal ordinal
                build = offset_map.put_batches(chunk, scope, ordinal)
                stats.map_messages_read += build.records_read
                ordinal = build.next_ordinal
                return not build.full

            position, fits = self._walk_segment(log, segment, start, end, map_span, map_chunk)
            scanned += position - start
            if not fits:
                return _MapPass(False, first_ordinals, scanned / total, ordinal)
        return _MapPass(True, first_ordinals, 1.0, ordinal)

    def _walk_segment(self, log: Log, segment: LogSegment, start: int, end: int,
                      run_span: Callable[[ReadBuffer, int, int, int], MapSpan | FilterSpan],
                      run_chunk: Callable[[memoryview], bool]) -> tuple[int, bool]:
        """One pass over bytes ``[start, end)`` of ``segment``: spans in the kernel
        (``run_span(buffer, position, end, direct_fd)``), a chunk of compressed batches
        through ``run_chunk(view)`` (False: the map is full), the buffer grown for a larger
        batch; the hook after each. Returns the position reached and whether the pass went
        on to ``end`` (False: the map filled)."""
        direct_fd = _open_direct(log.fs, segment)
        try:
            with segment.pinned():  # ``segment.fd`` stays open for the spans
                return self._walk_spans(log, segment, start, end, run_span, run_chunk,
                                        direct_fd)
        finally:
            if direct_fd >= 0:
                log.fs.close(direct_fd)

    def _walk_spans(self, log: Log, segment: LogSegment, start: int, end: int,
                    run_span: Callable[[ReadBuffer, int, int, int], MapSpan | FilterSpan],
                    run_chunk: Callable[[memoryview], bool],
                    direct_fd: int) -> tuple[int, bool]:
        # A chunk is the buffer less the direct-read slack, however it is read: a span with a
        # direct_fd and the compressed path (read_chunk) leave the slack themselves, a span
        # without one is given the chunk's part of the buffer.
        slack_bytes = 0 if direct_fd >= 0 else DIRECT_READ_SLACK_BYTES
        buffer = self._read_buffer
        position = start
        while position < end:
            span = run_span(buffer[:len(buffer) - slack_bytes], position, end, direct_fd)
            consumed = span.position - position
            position = span.position
            goes_on = span.stop != SPAN_FULL
            if span.stop == SPAN_GROW:
                buffer = self._buffer_for(span.stop_bytes + slack_bytes)
            elif span.stop == SPAN_COMPRESSED:
                chunk = _whole_batches_at(segment, direct_fd, buffer, position, end)
                goes_on = run_chunk(chunk)
                consumed += len(chunk)
                position += len(chunk)
            self.on_chunk(log, consumed)
            if not goes_on:
                return position, False
        return position, True

    def _buffer_for(self, batch_bytes: int) -> np.ndarray:
        """A read buffer of at least ``batch_bytes`` (a batch plus the direct-read slack) for
        the rest of a segment (Kafka's ``growBuffersOrFail``): kept and reused until the end of the cleaning, so a log of
        1 MB batches costs one allocation per cleaning, not one per segment or batch. Not
        zeroed (the kernel reads into it), so allocating it takes no time under the GIL."""
        needed = _grown_buffer_bytes(batch_bytes, len(self._read_buffer))
        if self._grown_buffer is None or len(self._grown_buffer) < needed:
            self._grown_buffer = aligned_buffer(needed, DIRECT_READ_ALIGN_BYTES)
        return self._grown_buffer

    def _estimate_parts(self, log: Log, scope: PassScope, overflowed: _MapPass,
                        stats: CleanerStats) -> int:
        """How many ranges ``scope``'s hash range needs: count the keys of a narrow sample
        range (sized from the overflowed scan's extrapolation) over the whole dirty section
        and scale up; each range is a rewrite, so guessing high is dear."""
        width = scope.range_high - scope.range_low
        capacity = self.offset_map.max_entries
        extrapolated = max(self.offset_map.size / overflowed.scanned_fraction,
                           overflowed.ordinals * capacity / MAX_OFFSET_SPAN
                           / overflowed.scanned_fraction)
        sample_parts = min(width, max(2, math.ceil(SAMPLE_HEADROOM * extrapolated / capacity)))
        sample = PassScope(scope.first_offset, scope.end_offset, scope.range_low,
                           scope.range_low + width // sample_parts, scope.aborted_txns)
        sampled = self._build_map(log, sample, stats)
        if not sampled.fits:
            return sample_parts
        scale = width / (sample.range_high - sample.range_low)
        keys_needed = self.offset_map.size * scale / capacity
        ordinals_needed = sampled.ordinals * scale / MAX_OFFSET_SPAN
        parts = math.ceil(SPLIT_HEADROOM * max(keys_needed, ordinals_needed))
        logger.info("%s-%d: cleaning in %d hash ranges (sampled %d keys in 1/%d of the range)",
                    log.topic, log.partition, parts, self.offset_map.size, sample_parts)
        return min(width, max(2, parts))

    # ---- pass 2 --------------------------------------------------------------------------

    def _rewrite(self, log: Log, scope: PassScope, first_ordinals: dict[int, int], now_ms: int,
                 stats: CleanerStats) -> None:
        protected = _producers_last_offsets(log)
        markers = _txn_marker_state(log)
        for group in group_segments(log, scope.end_offset):
            cleaned_path = group[0].directory / segment_file_name(
                group[0].base_offset, LOG_SUFFIX + CLEANED_SUFFIX)
            try:
                index = self._write_group(log, group, cleaned_path, scope, first_ordinals,
                                          now_ms, protected, markers, stats)
            except BaseException:
                if log.fs.exists(cleaned_path):
                    log.fs.remove(cleaned_path)
                raise
            log.replace_segments(group, cleaned_path, now_ms, index,
                                 aborted_data_removed_below=scope.end_offset)
            stats.groups.append(len(group))

    def _write_group(self, log: Log, group: list[LogSegment], cleaned_path: Path,
                     scope: PassScope, first_ordinals: dict[int, int], now_ms: int,
                     protected: np.ndarray, markers: TxnMarkerState,
                     stats: CleanerStats) -> IndexedBatches:
        """Write the group's cleaned records to ``cleaned_path`` and fsync it; returns the
        file's index."""
        horizon_ms = now_ms + log.config.delete_retention_ms
        offset_map = self.offset_map
        index = _CleanedIndex(group[0].base_offset, log.config.index_interval_bytes)
        cleaned = _CleanedFile(log.fs, cleaned_path, self._direct_stage)
        try:
            for segment in group:
                ordinal = _first_ordinal(log, segment, scope, first_ordinals)

                def filter_span_of(buffer: ReadBuffer, position: int, end_position: int,
                                   direct_fd: int, segment: LogSegment = segment
                                   ) -> FilterSpan:
                    nonlocal ordinal
                    span = filter_span(segment.fd, cleaned.fd, buffer, position, end_position,
                                       self.span_bytes, offset_map.fingerprints,
                                       offset_map.words, scope, ordinal, now_ms, horizon_ms,
                                       protected, index.output(), cleaned.stage,
                                       cleaned.stage_fill, self.span_niceness, direct_fd,
                                       markers)
                    cleaned.took(span)
                    index.add(span.indexed, span.bytes_written)
                    ordinal = span.next_ordinal
                    stats.bytes_read += span.position - position
                    stats.messages_read += span.records_read
                    stats.messages_written += span.records_kept
                    stats.bytes_written += span.bytes_written
                    return span

                def filter_chunk(chunk: memoryview) -> bool:
                    nonlocal ordinal
                    filtered = filter_batches(chunk, offset_map.fingerprints, offset_map.words,
                                              scope, ordinal, now_ms, horizon_ms, protected,
                                              markers=markers)
                    ordinal = filtered.next_ordinal
                    stats.bytes_read += len(chunk)
                    stats.messages_read += filtered.records_read
                    stats.messages_written += filtered.records_kept
                    if len(filtered.data):
                        cleaned.write(filtered.data)
                        index.add_written(filtered.data)
                        stats.bytes_written += len(filtered.data)
                    return True

                self._walk_segment(log, segment, 0, segment.size_bytes, filter_span_of,
                                   filter_chunk)
            cleaned.finish()
        finally:
            cleaned.close()
        return index.result()


def _no_hook(_log: Log, _bytes_read: int) -> None:
    pass


def _split_range(low: int, high: int, parts: int) -> list[tuple[int, int]]:
    """``[low, high)`` cut into ``parts`` consecutive ranges of (nearly) equal width."""
    bounds = [low + (high - low) * i // parts for i in range(parts + 1)]
    return [(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if a < b]


def _first_ordinal(log: Log, segment: LogSegment, scope: PassScope,
                   first_ordinals: dict[int, int]) -> int:
    """The ordinal pass 1 gave the first dirty record of ``segment`` (0 for a clean one)."""
    if segment.base_offset in first_ordinals:
        return first_ordinals[segment.base_offset]
    if segment.base_offset >= scope.first_offset:
        raise CleaningAborted(f"{log.topic}-{log.partition}: segment "
                              f"{segment.log_path.name} appeared during cleaning")
    return 0


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
        start = segment.size_bytes if location is None else location.position
        yield segment, start, segment.size_bytes


def group_segments(log: Log, end_offset: int) -> list[list[LogSegment]]:
    """Consecutive closed segments with base offset < ``end_offset``, grouped as Kafka's
    ``groupSegmentsBySize`` does: a group's bytes fit ``segment.bytes``, its offset and time
    index entries fit ``segment.index.bytes``, and (unless the next segment is empty) the
    offsets up to the next segment's base fit the 2**31 - 1 relative-offset range."""
    segments = log.segments
    config = log.config
    groups: list[list[LogSegment]] = []
    index = 0
    closed = len(segments) - 1
    while index < closed and segments[index].base_offset < end_offset:
        group = [segments[index]]
        size_bytes = segments[index].size_bytes
        entries = segments[index].offset_index.entries
        time_entries = segments[index].time_index.entries
        index += 1
        while index < closed and segments[index].base_offset < end_offset:
            candidate = segments[index]
            last_offset = min(segments[index + 1].base_offset, end_offset) - 1
            if size_bytes + candidate.size_bytes > config.segment_bytes or \
                    entries + candidate.offset_index.entries > candidate.offset_index.max_entries \
                    or time_entries + candidate.time_index.entries > \
                    candidate.time_index.max_entries \
                    or (candidate.size_bytes > 0
                        and last_offset - group[0].base_offset > MAX_RELATIVE_OFFSET):
                break
            group.append(candidate)
            size_bytes += candidate.size_bytes
            entries += candidate.offset_index.entries
            time_entries += candidate.time_index.entries
            index += 1
        groups.append(group)
    return groups


def _aborted_txns(log: Log, end_offset: int) -> bytes:
    """The aborted transactions with data below ``end_offset`` (Kafka's cleaner collects
    them from the aborted-transaction indexes of the segments it cleans)."""
    return aborted_txn_triples([
        (txn.producer_id, txn.first_offset, txn.last_offset)
        for txn in log.collect_aborted_transactions(log.log_start_offset, end_offset)])


def _producers_last_offsets(log: Log) -> np.ndarray:
    """Sorted last offsets of every producer's last batch: those batches stay, if emptied."""
    producers = log.producer_state.producers.values()
    return np.sort(np.fromiter((entry.batches[-1].last_offset for entry in producers
                                if entry.batches), np.int64))


def _txn_marker_state(log: Log) -> TxnMarkerState:
    """A rewrite's marker state: room for every producer of the log, and the producers
    whose last record is a marker (no batch, so no last sequence, at their epoch), whose
    marker stays. The producers are read under the log's lock (appends add to them)."""
    producers = log.active_producers()
    return txn_marker_state(len(producers), [(p.producer_id, p.producer_epoch)
                                             for p in producers if p.last_sequence < 0])
