"""The log of one topic-partition: segments, appends, reads, offsets by time, retention.

Directory ``<topic>-<partition>/`` holds the segments (``<20-digit base>.log``, ``.index``,
``.timeindex``; see ``segment``), producer-state snapshots (``<20-digit offset>.snapshot``; see
``producer_state``) and ``partition.metadata`` (written by the log manager). Segments being
deleted carry a ``.deleted`` suffix until ``file.delete.delay.ms`` has passed. The cleaner
writes ``<base>.log.cleaned``, renames it to ``<base>.log.swap`` (the commit point), retires the
segments it replaces and renames the swap file to ``<base>.log`` (``replace_segments``). On
load, Kafka's rules: ``.cleaned`` files are deleted; a ``.swap`` file is completed (segments
whose base offset lies in its offset range are deleted, it becomes ``.log``, and its indexes
are rebuilt); a segment whose ``.index`` file is missing gets its indexes rebuilt (a full CRC
scan of that segment).

Appends are serialized by one lock and do no per-record work in Python: one compiled-kernel call
checks every batch of the request (whole batches, magic, CRC-32C, and Kafka's LogValidator
checks of every record, parsed right after the CRC; see ``validation``) and summarises its
header as a tuple, with the max timestamp taken from the records, ``validation`` checks sizes
on those tuples (and walks the decompressed records of compressed batches), producer state is
consulted only for batches carrying a producer id, each base offset is rewritten and
LogAppendTime stamped if configured (in a copy: the caller's buffer is never changed), and the
request's batches are written with one ``write``
(no per-append fstat or seek; index entries only each ``index.interval.bytes``). The common
request -- one batch in the topic's codec, on a CreateTime topic, fitting the active segment --
takes the plain path: one kernel call (``kernel.append_plain_batch``) makes the same checks
and writes the batch with its new base offset to the segment's descriptor with the GIL
released, reading the caller's buffer in place -- a read-only view of the request frame needs
no copy (a batch with a producer id, compressed records or a header max timestamp that is not
its records' largest: validated by that call, then sequence-checked, its records checked
after decompression, its max timestamp rewritten in a copy, in Python, and written by
``kernel.write_batch``); it is gated per active segment (``_plain_gate``: set after a general-path
append, cleared by a roll, a config change or a full index) and used only when the log's file
system is exactly ``RealFileSystem`` (decided once per log), so a wrapping file system still
sees every write. Whatever the kernel declines goes the general way, which raises the precise
error. The one
exception to "no per-record work": a topic whose ``compression.type`` names a codec gets batches
in other codecs rebuilt in that codec (``validation.recompress_for_topic``; the caller's buffer
is left unchanged). After each append the writer publishes an immutable ``LogView``
(segment tuple, log end, active segment size, log start) with a single attribute store; readers
take that snapshot and never lock, so a reader never blocks a writer (copy-on-write segment
list, as in Kafka).

Time-based decisions read a segment's largest timestamp as Kafka's ``largestTimestamp``: the
largest valid (>= 0) batch timestamp, else the segment file's last-modified time (read through
the injected file system), so records sent without a timestamp (-1) age from when they were
written, never from 1970. Retention by retention.ms deletes a closed segment once that is
older than retention.ms; offsets by time search the first segment whose largest timestamp
reaches the target, as Kafka's ``searchOffsetInLocalLog`` (the time index and batch headers
find the batch, the kernel decodes it to find the first record at or after the log start
with a timestamp >= the target; records without a timestamp never match); the
max-timestamp lookup answers the first record carrying the largest timestamp. A batch's max
timestamp is its records' largest (-1 when none has one), written into the stored header where
the producer's differs, as Kafka's setMaxTimestamp does. CreateTime bounds
(message.timestamp.before/after.max.ms) are checked on every record's timestamp.

Recovery: after a clean shutdown the index files are sanity-checked and the active segment's
tail after its last index entry is CRC-checked all the same (the marker does not vouch for the
disk): a torn or garbled tail is truncated to its last valid batch with a WARNING naming the file
and byte, so nothing is ever appended after unreadable bytes. After an unclean shutdown every
batch after the recovery point is CRC-checked; the log is truncated at the first bad byte and the
indexes of the segments touched are rebuilt, so the work grows with the unflushed tail, not with
the log. Damage loading must not repair raises ``KafkaStorageError`` naming the file and byte
(the log manager then takes the partition offline): a bad byte in a sealed segment whose index
is being rebuilt (it may hold flushed, acknowledged records after it), and a gap or overlap
between segments (a header walk of each sealed segment's tail). Compacted logs may have gaps;
others only those listed in ``accepted-gaps`` (lines ``<end offset> <next base offset>``,
written by ``headrace repair --accept-gap``).

Time-based rolling uses Kafka's ``LogConfig.maxSegmentMs``: ``segment.ms``, or for a compacted
log ``min(segment.ms, max.compaction.lag.ms)``, and Kafka's ``timeWaitedForRoll``: a segment
whose first batch has a timestamp rolls when a batch to append has a max timestamp more than
that past it; a segment whose first batch has none (-1) when the broker time is that far past
its creation. Rolls happen on the appending thread only (at append, or in ``maintain`` called
by the broker's maintenance on that same thread, which rolls by creation time, and by
timestamp only on compact-only logs so their records become cleanable within
max.compaction.lag.ms).

Thread-safety: ``append``, ``roll``, ``flush``, retention and ``close`` take the log's lock;
``read``, ``offset_for_timestamp`` and the properties work on the published snapshot from any
thread. ``read`` remembers where each read's next batch starts (``_next_batches``: its base
offset -> segment and position, filled from the header the read's last step already read), so
a sequential reader's next read skips the index lookup and header read; an entry is trusted
only while its segment object is still in the snapshot (segments are append-only; the cleaner
replaces whole segment objects), and the map is only read, popped and rebound, so readers on
several threads need no lock.

Cleaning guard: a cleaner thread brackets a cleaning with ``begin_cleaning``/``end_cleaning``
(a per-log lock, separate from the append lock, so appends never wait for a cleaning) and calls
``check_cleaning_aborted`` between chunks. ``stop_cleaning`` (called by ``close``,
``close_without_flush`` and by the log manager before it renames a deleted partition's
directory) marks the log as no longer cleanable and waits until a cleaning in progress has
stopped, so no cleaner touches a segment file after its descriptor is closed or writes a
``.cleaned`` file into a directory that no longer belongs to this log. It must be called
without holding the log's lock (the cleaner takes that lock in ``replace_segments``).
Retention, DeleteRecords and rolls need no guard: the cleaner reads closed segments through
descriptors that stay open until ``file.delete.delay.ms``, and ``replace_segments`` re-checks
under the log's lock that the segments it replaces are still in the log (``CleaningAborted``
otherwise, nothing changed).
"""

from __future__ import annotations

import bisect
import functools
import logging
import os
import random
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from headrace.errors import (
    CorruptMessage,
    KafkaStorageError,
    OffsetOutOfRange,
    OutOfOrderSequenceNumber,
)
from headrace.protocol.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_BYTES,
    COMPRESSION_MASK,
    CONTROL_BIT,
    LOG_OVERHEAD_BYTES,
    MAX_TIMESTAMP_OFFSET,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    parse_header,
    set_log_append_time,
    set_max_timestamp,
)
from headrace.protocol.kernel import IndexedBatches, append_plain_batch, write_batch
from headrace.storage.config import LogConfig
from headrace.storage.fs import (
    FileSystem,
    RealFileSystem,
    read_whole_file,
    write_file_atomically,
)
from headrace.storage.producer_state import (
    SEQUENCE_MODULUS,
    ProducerStateManager,
)
from headrace.storage.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    MAX_RELATIVE_OFFSET,
    TIME_INDEX_SUFFIX,
    BatchLocation,
    FileSlice,
    LogSegment,
    segment_file_name,
)
from headrace.storage.validation import (
    Summary,
    check_compressed_batch,
    needs_recompression,
    recompress_for_topic,
    record_checks,
    target_codec,
    validate_request,
)

logger = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"
LEFTOVER_SUFFIXES = (DELETED_SUFFIX, ".tmp", CLEANED_SUFFIX)
MAX_READ_HINTS = 16  # remembered next-read positions per log (one per sequential reader)
ACCEPTED_GAPS_FILE = "accepted-gaps"

__all__ = [
    "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "MAX_TIMESTAMP", "AppendResult", "FileSlice",
    "Log", "ReadResult",
]


def read_accepted_gaps(fs: FileSystem, directory: Path) -> set[tuple[int, int]]:
    """The gaps between segments an operator accepted: ``ACCEPTED_GAPS_FILE`` in the
    partition directory, one ``<end offset of a segment> <base offset of the next>`` per
    line."""
    path = directory / ACCEPTED_GAPS_FILE
    if not fs.exists(path):
        return set()
    gaps = set()
    for line in read_whole_file(fs, path).decode().splitlines():
        fields = line.split()
        if len(fields) != 2 or not all(field.isdigit() for field in fields):
            raise KafkaStorageError(f"{path}: unreadable line {line!r}")
        gaps.add((int(fields[0]), int(fields[1])))
    return gaps


def accept_gap(fs: FileSystem, directory: Path, end_offset: int, next_base_offset: int) -> None:
    """Record that the hole [end_offset, next_base_offset) is known and accepted."""
    gaps = read_accepted_gaps(fs, directory) | {(end_offset, next_base_offset)}
    text = "".join(f"{end} {base}\n" for end, base in sorted(gaps))
    write_file_atomically(fs, directory / ACCEPTED_GAPS_FILE, text.encode())


class CleaningAborted(Exception):
    """A cleaning stopped early because the log was closed or deleted, the cleaner is shutting
    down, or the segments it was rewriting changed; nothing was half-done (a ``.cleaned``
    file not yet swapped in is removed; swapped groups are complete)."""


@dataclass(frozen=True, slots=True)
class ReadResult:
    slices: tuple[FileSlice, ...]
    size_bytes: int
    high_watermark: int
    log_start_offset: int


class AppendResult(NamedTuple):
    """What an append assigned. A named tuple rather than a frozen dataclass: it is built
    on every append, and a tuple costs less than half as much to construct."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool = False


# What batch.set_base_offset does, without a Python call per batch on the append path.
_pack_base_offset = struct.Struct(">q").pack_into
# AppendResult(...) runs NamedTuple's Python-level __new__; this builds the same tuple in C.
_new_append_result = functools.partial(tuple.__new__, AppendResult)

# When a plain append may take the kernel's one-call path: (the active segment, the broker
# time after which it must roll by age, the largest last offset its index can address, the
# largest batch max timestamp it takes before rolling by age, the broker time until which no
# batch the kernel accepts -- none stamped past message.timestamp.after.max.ms -- can carry
# a larger one, so the header need not be read).
_PlainGate = tuple[LogSegment, int, int, int, int]
ROLL_NEVER = 2**63 - 1  # a roll deadline that is never passed
# A batch header's batch_length (int32 at byte 8) and max_timestamp (int64 at byte 35).
_LENGTH_AND_MAX_TIMESTAMP = struct.Struct(">8xi23xq").unpack_from


def single_batch_max_timestamp(records: bytes | bytearray | memoryview) -> int:
    """The header max timestamp of ``records`` if they are exactly one batch, else
    ``ROLL_NEVER`` (unknown: whoever asks must assume the batch may roll the segment).
    On the plain append path: one struct call."""
    size_bytes = len(records)
    if size_bytes < BATCH_HEADER_BYTES:
        return ROLL_NEVER
    batch_length, max_timestamp_ms = _LENGTH_AND_MAX_TIMESTAMP(records)
    return max_timestamp_ms if batch_length + LOG_OVERHEAD_BYTES == size_bytes else ROLL_NEVER


class LogView:
    """An immutable snapshot of the log that readers use without locking."""

    __slots__ = ("segments", "base_offsets", "log_end_offset", "active_size_bytes",
                 "log_start_offset")

    def __init__(self, segments: tuple[LogSegment, ...], log_end_offset: int,
                 active_size_bytes: int, log_start_offset: int) -> None:
        self.segments = segments
        self.base_offsets = tuple(s.base_offset for s in segments)
        self.log_end_offset = log_end_offset
        self.active_size_bytes = active_size_bytes
        self.log_start_offset = log_start_offset

    def with_tail(self, log_end_offset: int, active_size_bytes: int) -> LogView:
        view = LogView.__new__(LogView)
        view.segments, view.base_offsets = self.segments, self.base_offsets
        view.log_end_offset, view.active_size_bytes = log_end_offset, active_size_bytes
        view.log_start_offset = self.log_start_offset
        return view

    def max_position(self, segment_index: int) -> int:
        if segment_index == len(self.segments) - 1:
            return self.active_size_bytes
        return self.segments[segment_index].size_bytes


@dataclass(slots=True)
class _PendingDeletion:
    due_ms: int
    segment: LogSegment
    paths: list[Path]


class Log:
    """One topic-partition's log; opened (and recovered) by the constructor."""

    def __init__(self, topic: str, partition: int, directory: Path, config: LogConfig,
                 fs: FileSystem, now_ms: int, recovery_point: int = 0, log_start_offset: int = 0,
                 clean_shutdown: bool = False, rng: random.Random | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.dir = directory
        self.config = config
        self.fs = fs
        # The kernel may write straight to segment descriptors only when no wrapper (a
        # fault-injecting test file system) needs to see the writes.
        self._fs_is_real = type(fs) is RealFileSystem
        self._lock = threading.Lock()  # not re-entrant: locked paths call *_locked helpers
        self._listeners: list[Callable[[int], None]] = []
        self._pending_deletions: list[_PendingDeletion] = []
        # next batch's base offset -> (segment, its BatchLocation): see _remember_next_batch
        self._next_batches: dict[int, tuple[LogSegment, BatchLocation]] = {}
        self._rng = rng or random.Random()
        self._segment_jitter_ms = self._pick_jitter(config)
        self._apply_config(config)
        self._closed = False
        self._cleaning_lock = threading.Lock()
        self._cleaning_stopped = False
        self.producer_state = ProducerStateManager(fs, directory)
        fs.mkdir(directory)
        self._segments: list[LogSegment] = []
        self._missing_index_bases: set[int] = set()
        try:
            segments, log_end_offset, snapshot_limit = self._load(
                now_ms, recovery_point, log_start_offset, clean_shutdown)
        except BaseException:
            self._abandon_loading()
            raise
        self._segments = segments
        self.recovery_point = log_end_offset
        self.last_flush_ms = now_ms
        self._rebuild_producer_state(snapshot_limit, log_end_offset)
        log_start = min(max(log_start_offset, segments[0].base_offset), log_end_offset)
        self._view = LogView(tuple(segments), log_end_offset, segments[-1].size_bytes, log_start)

    # ---- public state --------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._view.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._view.log_end_offset

    @property
    def high_watermark(self) -> int:
        return self._view.log_end_offset

    @property
    def size_bytes(self) -> int:
        view = self._view
        return sum(s.size_bytes for s in view.segments[:-1]) + view.active_size_bytes

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return self._view.segments

    def add_append_listener(self, callback: Callable[[int], None]) -> None:
        self._listeners.append(callback)

    # ---- loading -------------------------------------------------------------------------

    def _apply_config(self, config: LogConfig) -> None:
        """Precompute what every append consults: the target codec, the timestamp type, the
        plain-append limits; and forget the cached roll deadline and plain-append gate
        (segment.ms may have changed)."""
        self._target_codec = target_codec(config)
        self._log_append_time = config.log_append_time
        self._roll_deadline: tuple[LogSegment | None, tuple[int, int]] = (None, (0, 0))
        self._segment_bytes = config.segment_bytes
        self._flush_messages = config.flush_messages
        limits = (config.max_message_bytes, config.message_timestamp_before_max_ms,
                  config.message_timestamp_after_max_ms,
                  -1 if self._target_codec is None else self._target_codec,
                  config.compact_enabled)
        # by from_client: a client's batches may not be control batches (LogValidator)
        self._plain_limits = (limits + (False,), limits + (True,))
        self._plain_gate: _PlainGate | None = None

    def _pick_jitter(self, config: LogConfig) -> int:
        if config.segment_jitter_ms <= 0:
            return 0
        return self._rng.randrange(min(config.segment_jitter_ms, config.segment_ms))

    def _new_segment(self, base_offset: int, now_ms: int) -> LogSegment:
        return LogSegment(self.fs, self.dir, base_offset, self.config.segment_index_bytes,
                          self.config.index_interval_bytes, now_ms)

    def _abandon_loading(self) -> None:
        """Loading failed: close what ``_open_segments`` opened and remove the offset index
        files it created for segments that had none, so the next start meets the same
        damage rather than an empty index that passes the sanity check."""
        for segment in self._segments:
            segment.close()
        for base in self._missing_index_bases:
            path = self.dir / segment_file_name(base, INDEX_SUFFIX)
            if self.fs.exists(path):
                self.fs.remove(path)

    def _load(self, now_ms: int, recovery_point: int, log_start_offset: int,
              clean_shutdown: bool) -> tuple[list[LogSegment], int, int]:
        """Open and check the segments: (segments, log end offset, snapshot limit). Raises
        KafkaStorageError naming the file and byte for damage that loading must not repair
        (a bad sealed segment, a gap or overlap between segments)."""
        segments = self._open_segments(now_ms, log_start_offset)
        if clean_shutdown:
            log_end_offset = self._load_clean(segments)
            snapshot_limit = log_end_offset
        else:
            segments, log_end_offset = self._recover(segments, recovery_point)
            snapshot_limit = recovery_point
        self._check_contiguous(segments)
        return segments, log_end_offset, snapshot_limit

    def _check_contiguous(self, segments: list[LogSegment]) -> None:
        """Each segment must start where the one before it ends (a header walk from each
        sealed segment's last index entry). A gap is a hole nobody was told about -- silent
        data loss -- unless the log is compacted (the cleaner leaves gaps) or the operator
        accepted it (``ACCEPTED_GAPS_FILE``, written by ``headrace repair --accept-gap``);
        an overlap is always damage."""
        accepted = read_accepted_gaps(self.fs, self.dir)
        for previous, following in zip(segments, segments[1:], strict=False):
            _, position = previous.offset_index.last_entry()
            end = previous.next_offset_after(position)
            end = previous.base_offset if end < 0 else end
            gap = end < following.base_offset and not self.config.compact_enabled and \
                (end, following.base_offset) not in accepted
            if gap or end > following.base_offset:
                kind = "gap" if end < following.base_offset else "overlap"
                raise KafkaStorageError(
                    f"{kind} between segments: {previous.log_path} ends at offset {end} "
                    f"(byte {previous.size_bytes}) but {following.log_path.name} starts at "
                    f"offset {following.base_offset}")

    def _open_segments(self, now_ms: int, log_start_offset: int) -> list[LogSegment]:
        needs_index_rebuild = self._complete_swaps()
        names = self.fs.listdir(self.dir)
        bases = set()
        for name in names:
            path = self.dir / name
            if name.endswith(LEFTOVER_SUFFIXES):
                self.fs.remove(path)
            elif name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit():
                bases.add(int(name[: -len(LOG_SUFFIX)]))
        for name in names:  # Kafka deletes indexes that have lost their segment
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX):
                stem = name[: -len(suffix)]
                if name.endswith(suffix) and stem.isdigit() and int(stem) not in bases:
                    self.fs.remove(self.dir / name)
        # Kafka's sanity check: a flushed segment whose offset index file is missing is
        # rebuilt (``_load_indexes``); one after the recovery point is recovered anyway
        self._missing_index_bases = {base for base in bases if not self.fs.exists(
            self.dir / segment_file_name(base, INDEX_SUFFIX))}
        if not bases:
            bases.add(max(log_start_offset, 0))
        segments = self._segments  # closed by __init__ if loading fails
        for base in sorted(bases):
            segments.append(self._new_segment(base, now_ms))
        for segment in segments[:-1]:  # the active segment's tail is scanned anyway
            if segment.base_offset in needs_index_rebuild and segment.size_bytes:
                self._rebuild_indexes(segment, sealed=True)
        return segments

    def _complete_swaps(self) -> set[int]:
        """Finish a cleaner swap interrupted by a crash: the ``.swap`` file replaces every
        segment whose base offset lies in its offset range. Returns the swapped bases."""
        swapped = set()
        names = self.fs.listdir(self.dir)
        for name in sorted(names):
            stem = name[: -len(LOG_SUFFIX + SWAP_SUFFIX)]
            if not (name.endswith(LOG_SUFFIX + SWAP_SUFFIX) and stem.isdigit()):
                continue
            swap_path, base = self.dir / name, int(stem)
            next_offset = max(self._next_offset_of_file(swap_path), base + 1)
            for other in names:
                other_stem = other.split(".", 1)[0]
                if other_stem.isdigit() and base <= int(other_stem) < next_offset and \
                        other.endswith((LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX)):
                    self.fs.remove(self.dir / other)
            self.fs.rename(swap_path, self.dir / segment_file_name(base, LOG_SUFFIX))
            self.fs.fsync_dir(self.dir)
            logger.warning("%s-%d: completed an interrupted cleaner swap of %s", self.topic,
                           self.partition, name)
            swapped.add(base)
        return swapped

    def _next_offset_of_file(self, path: Path) -> int:
        """Offset after the last whole batch of a segment file (header walk, no CRC)."""
        fd = self.fs.open(path, os.O_RDONLY)
        try:
            size_bytes, position, next_offset = self.fs.size(fd), 0, -1
            while position + BATCH_HEADER_BYTES <= size_bytes:
                header = parse_header(self.fs.pread(fd, BATCH_HEADER_BYTES, position))
                if position + header.size_bytes > size_bytes:
                    break
                next_offset, position = header.next_offset, position + header.size_bytes
            return next_offset
        finally:
            self.fs.close(fd)

    def _load_clean(self, segments: list[LogSegment]) -> int:
        """Clean shutdown: trust the sealed segments' indexes (sanity-checked), and still
        CRC-check the active segment's tail from its last index entry, whatever the marker
        says: a torn or garbled tail is truncated to its last valid batch, never appended
        after."""
        for segment in segments[:-1]:
            self._load_indexes(segment)
        active = segments[-1]
        start = active.offset_index.last_entry()[1] if active.load_indexes() else 0
        next_offset = self._check_tail(active, start)
        return max(next_offset, active.base_offset)

    def _check_tail(self, segment: LogSegment, start_position: int) -> int:
        """CRC-check ``segment`` from ``start_position`` (a batch boundary) to its end with
        the kernel's ``index_batches`` scan, truncating at the first bad byte with a WARNING
        naming the file and byte position. Returns the next offset (-1 if no batch)."""
        next_offset, truncated = segment.recover(start_position)
        if truncated:
            logger.warning("%s-%d: truncated %d unreadable bytes of %s at byte %d",
                           self.topic, self.partition, truncated, segment.log_path,
                           segment.size_bytes)
            segment.flush()
        if next_offset < 0 and start_position > 0:  # the indexed batch itself was bad
            return self._check_tail(segment, 0)
        return next_offset

    def _recover(self, segments: list[LogSegment], recovery_point: int
                 ) -> tuple[list[LogSegment], int]:
        """Unclean shutdown: trust the data below the recovery point, CRC-scan the rest."""
        first_dirty = max(0, bisect.bisect_right([s.base_offset for s in segments],
                                                 recovery_point) - 1)
        for segment in segments[:first_dirty]:
            self._load_indexes(segment)
        next_offset = -1
        for position, segment in enumerate(segments[first_dirty:], start=first_dirty):
            start = self._trusted_start(segment, recovery_point) if position == first_dirty else 0
            segment_next, truncated = segment.recover(start)
            if segment_next >= 0:
                next_offset = segment_next
            if truncated:
                logger.warning("%s-%d: truncated %d bytes of %s at byte %d (offset %d)",
                               self.topic, self.partition, truncated, segment.log_path.name,
                               segment.size_bytes, max(next_offset, segment.base_offset))
            if truncated and position < len(segments) - 1:
                self._drop_segments_after(segments, position)
                segment.flush()
                break
            if position < len(segments) - 1:
                segment.seal()
            segment.flush()
        segments = [s for s in segments if not s.closed]
        active = segments[-1]
        if next_offset < 0 or active.size_bytes == 0:
            next_offset = max(next_offset, active.base_offset)
        return segments, next_offset

    def _load_indexes(self, segment: LogSegment) -> None:
        """Load a sealed, flushed segment's indexes; rebuild them when they fail the sanity
        check or the offset index file was missing (a bad byte then is damage)."""
        if segment.base_offset in self._missing_index_bases or not segment.load_indexes():
            self._rebuild_indexes(segment, sealed=True)

    @staticmethod
    def _rebuild_indexes(segment: LogSegment, sealed: bool) -> None:
        """Rebuild damaged index files from the log (a full scan of this one segment). A bad
        byte in it is damage (KafkaStorageError naming the file and byte), never truncated:
        the segment may hold acknowledged, flushed records after it."""
        segment.recover(0, truncate=False)
        if sealed:
            segment.seal()
        segment.flush()

    @staticmethod
    def _adopt_indexes(segment: LogSegment, index: IndexedBatches) -> None:
        """Give a fresh, closed segment the index ``index_batches`` computed over its whole
        file (what ``_rebuild_indexes`` would compute, without reading the file) and seal it."""
        segment.apply_index(index)
        segment.seal()
        segment.flush()

    def _trusted_start(self, segment: LogSegment, recovery_point: int) -> int:
        """A batch position below the recovery point from which to CRC-scan: the last index
        entry whose batch ends below it, if that batch verifies; else the segment start."""
        if not segment.load_indexes():
            return 0
        offsets = segment.offset_index
        slot = bisect.bisect_left(offsets.relative_offsets,
                                  recovery_point - segment.base_offset) - 1
        if slot < 0:
            return 0
        position = offsets.positions[slot]
        try:
            header = next(segment.iter_batches(position, position + 1))[1]
        except (CorruptMessage, StopIteration):
            return 0
        expected_last = segment.base_offset + offsets.relative_offsets[slot]
        return position if header.last_offset == expected_last else 0

    def _drop_segments_after(self, segments: list[LogSegment], position: int) -> None:
        for segment in segments[position + 1:]:
            logger.warning("%s-%d: deleting segment %s after a corrupt one", self.topic,
                           self.partition, segment.log_path.name)
            paths = segment.file_paths()
            segment.close()
            for path in paths:
                self.fs.remove(path)

    def _rebuild_producer_state(self, snapshot_limit: int, log_end_offset: int) -> None:
        """Load the newest snapshot at or below ``snapshot_limit`` and replay the batch
        headers after it, so deduplication survives restarts."""
        state = self.producer_state
        replay_from = max(state.load_latest_snapshot(min(snapshot_limit, log_end_offset)), 0)
        segments = self._segments
        for index, segment in enumerate(segments):
            if index + 1 < len(segments) and segments[index + 1].base_offset <= replay_from:
                continue
            location = segment.find_batch(replay_from, segment.size_bytes)
            if location is None:
                continue
            for _, header in segment.iter_batches(location.position):
                if header.base_offset >= replay_from:
                    state.replay(header)
        state.remove_snapshots(above_offset=log_end_offset)

    # ---- appending -----------------------------------------------------------------------

    def append(self, records: bytes | bytearray | memoryview, now_ms: int,
               from_client: bool = False) -> AppendResult:
        """Validate, assign offsets to and write one or more whole v2 batches; a topic whose
        compression.type names a codec gets batches of other codecs recompressed first.
        ``records`` (any contiguous buffer) is only read: the plain path writes it with its
        new base offset in one writev, the general path works on a copy. ``from_client``:
        a producer's request (Produce), held to Kafka's client rules (no control batches).

        The hot path of every produce request. Its common case -- one batch in the topic's
        codec, on a CreateTime topic, fitting the active segment -- is one kernel call
        (``append_plain_batch``: validate, rewrite the base offset, write; for an idempotent
        producer's batch the sequence check comes between validating and ``write_batch``) and
        the index upkeep, behind a gate opened by the general path."""
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost, on every append
        try:
            if self._closed:
                raise KafkaStorageError(f"log {self.topic}-{self.partition} is closed")
            gate = self._plain_gate
            result = None
            if gate is not None and now_ms <= gate[1] and (
                    now_ms <= gate[4] or single_batch_max_timestamp(records) <= gate[3]):
                result = self._append_plain(records, gate, now_ms, from_client)
            if result is None:
                result = self._append_general(records, now_ms, from_client)
        finally:
            lock.release()
        if self._listeners and not result.duplicate:
            for listener in self._listeners:
                listener(result.last_offset + 1)
        return result

    def _append_plain(self, records: bytes | bytearray | memoryview, gate: _PlainGate,
                      now_ms: int, from_client: bool) -> AppendResult | None:
        """The common case in one kernel call (two with a producer id, compressed records
        or a max timestamp to rewrite); None (nothing written) when the kernel declines the
        request and the general path must decide."""
        active = gate[0]
        first_offset = self._view.log_end_offset
        written = append_plain_batch(records, active.fd, first_offset,
                                     self._segment_bytes - active.size_bytes, gate[2], now_ms,
                                     self._plain_limits[from_client])
        if written is None:
            return None
        last_offset, max_timestamp_ms, was_written = written
        if not was_written:
            records, max_timestamp_ms = self._finish_plain_batch(records, max_timestamp_ms,
                                                                 now_ms, from_client)
            duplicate = self._write_producer_batch(records, active.fd, first_offset)
            if duplicate is not None:
                return duplicate
        if active.note_written_batch(len(records), last_offset, max_timestamp_ms, now_ms):
            self._plain_gate = None  # an index is full: the next append rolls
        if last_offset + 1 - self.recovery_point >= self._flush_messages:
            self._flush_locked(now_ms, last_offset + 1)  # before fetches can see the records
        view = self._view
        self._view = view.with_tail(last_offset + 1, active.size_bytes)
        return _new_append_result((first_offset, last_offset, -1, view.log_start_offset, False))

    def _finish_plain_batch(self, records: bytes | bytearray | memoryview, max_timestamp_ms: int,
                            now_ms: int, from_client: bool
                            ) -> tuple[bytes | bytearray | memoryview, int]:
        """A batch the kernel validated but did not write: a compressed batch's records
        checked (raising as the general path does), and the batch with its header's max
        timestamp set to its records' largest and its LogAppendTime bit cleared (in a copy
        when either differs: Kafka's setMaxTimestamp) and that maximum."""
        if records[22] & COMPRESSION_MASK:  # read-only: the caller's buffer stays as it is
            with memoryview(records) as view, view.toreadonly() as unchanged:
                max_timestamp_ms = check_compressed_batch(
                    unchanged, 0, record_checks(self.config, now_ms, from_client),
                    f"{self.topic}-{self.partition}")
        if (int.from_bytes(records[MAX_TIMESTAMP_OFFSET : MAX_TIMESTAMP_OFFSET + 8], "big",
                           signed=True) != max_timestamp_ms
                or records[ATTRIBUTES_OFFSET + 1] & TIMESTAMP_TYPE_BIT):
            records = bytearray(records)
            set_max_timestamp(records, 0, len(records), max_timestamp_ms)
        return records, max_timestamp_ms

    def _write_producer_batch(self, records: bytes | bytearray | memoryview, fd: int,
                              first_offset: int) -> AppendResult | None:
        """A validated batch, written at ``first_offset``; with a producer id, the original
        result instead if it is a duplicate (else the batch is recorded); raises for a bad
        epoch or sequence, as the general path does."""
        header = parse_header(records)
        duplicate = self._duplicate_of(header) if header.producer_id >= 0 else None
        if duplicate is None:
            write_batch(records, fd, first_offset)
            if header.producer_id >= 0 and not header.is_control:
                self.producer_state.update(header, first_offset)
        return duplicate

    def _append_general(self, request: bytes | bytearray | memoryview, now_ms: int,
                        from_client: bool) -> AppendResult:
        """Every append the plain path declines: several batches, LogAppendTime,
        recompression, a roll, or a request to reject (the precise error is raised here).
        Base offsets and LogAppendTime are written into a copy of ``request``."""
        records = bytearray(request)
        config = self.config
        summaries = validate_request(records, config, now_ms, from_client=from_client,
                                     topic_partition=f"{self.topic}-{self.partition}")
        producer_headers = None
        if len(summaries) > 1 or summaries[0][6] >= 0:  # else: one plain batch
            producer_headers = self._producer_headers(records, summaries)
            if producer_headers:
                duplicate = self._check_producers(producer_headers)
                if duplicate is not None:
                    return duplicate
        codec = self._target_codec
        if codec is not None and needs_recompression(summaries, codec):
            records, summaries = recompress_for_topic(records, summaries, codec,
                                                      config.max_message_bytes)
        first_offset = self._view.log_end_offset
        next_offset, active = self._write(records, summaries, first_offset, now_ms)
        if producer_headers:
            self._record_producers(producer_headers, first_offset)
        if next_offset - self.recovery_point >= config.flush_messages:
            self._flush_locked(now_ms, next_offset)  # before fetches can see the records
        view = self._view  # after _write: a roll publishes a new segment tuple
        self._view = view.with_tail(next_offset, active.size_bytes)
        self._plain_gate = self._plain_gate_for(active)
        return _new_append_result((first_offset, next_offset - 1,
                                   now_ms if self._log_append_time else -1,
                                   view.log_start_offset, False))

    def _plain_gate_for(self, active: LogSegment) -> _PlainGate | None:
        """The gate that lets the next appends to ``active`` take the plain path, or None:
        only when the kernel may write to its descriptor, the topic uses CreateTime, and
        ``active`` is non-empty with indexes not full (so nothing but its age, which the gate
        holds, or its size, which the kernel checks, can make it roll)."""
        if (self._fs_is_real and not self._log_append_time and active.size_bytes
                and not active.offset_index.is_full and not active.time_index.is_full):
            broker_deadline_ms, message_deadline_ms = self._roll_deadlines(active)
            unread_until_ms = ROLL_NEVER if message_deadline_ms == ROLL_NEVER else \
                message_deadline_ms - self.config.message_timestamp_after_max_ms
            return (active, broker_deadline_ms, active.base_offset + MAX_RELATIVE_OFFSET,
                    message_deadline_ms, unread_until_ms)
        return None

    def _write(self, records: bytearray, summaries: tuple[Summary, ...], first_offset: int,
               now_ms: int) -> tuple[int, LogSegment]:
        """Assign offsets from ``first_offset``, roll if needed, write to the active segment:
        the next offset and the segment written. One batch (the usual request) takes a
        path without per-batch lists."""
        log_append_time = self._log_append_time
        if len(summaries) == 1:  # a single whole batch: it starts at position 0
            _pack_base_offset(records, 0, first_offset)
            next_offset = first_offset + summaries[0][3] + 1
            max_timestamp_ms = now_ms if log_append_time else summaries[0][5]
            if log_append_time:
                set_log_append_time(records, 0, now_ms)
            active = self._active_segment_for(len(records), next_offset - 1, max_timestamp_ms,
                                              now_ms)
            active.append_batch(records, next_offset - 1, max_timestamp_ms, now_ms)
            return next_offset, active
        next_offset, entries = self._assign_offsets(records, summaries, first_offset,
                                                    log_append_time, now_ms)
        max_timestamp_ms = max(entry[2] for entry in entries)
        active = self._active_segment_for(len(records), next_offset - 1, max_timestamp_ms, now_ms)
        active.append(records, entries, now_ms)
        return next_offset, active

    @staticmethod
    def _assign_offsets(records: bytearray, summaries: tuple[Summary, ...], first_offset: int,
                        log_append_time: bool, now_ms: int
                        ) -> tuple[int, list[tuple[int, int, int, int]]]:
        """Rewrite each batch's base offset (and stamp LogAppendTime if asked): the next
        offset and the segment's index entries (size, last offset, max timestamp, position)."""
        offset, entries = first_offset, []
        for position, size_bytes, _, last_offset_delta, _, max_timestamp, _, _ in summaries:
            _pack_base_offset(records, position, offset)
            if log_append_time:
                set_log_append_time(records, position, now_ms)
                max_timestamp = now_ms
            offset += last_offset_delta + 1
            entries.append((size_bytes, offset - 1, max_timestamp, position))
        return offset, entries

    @staticmethod
    def _producer_headers(records: bytearray, summaries: tuple[Summary, ...]
                          ) -> list[tuple[int, BatchHeader]]:
        """(offset relative to the request's first, header) of each data batch that carries
        a producer id; empty (and no header parsed) for plain producers."""
        found, relative_offset = [], 0
        for position, _, attributes, last_offset_delta, _, _, producer_id, _ in summaries:
            if producer_id >= 0 and not attributes & CONTROL_BIT:
                found.append((relative_offset, parse_header(records, position)))
            relative_offset += last_offset_delta + 1
        return found

    def _check_producers(self, headers: list[tuple[int, BatchHeader]]) -> AppendResult | None:
        pending: dict[int, tuple[int, int]] = {}
        for _, header in headers:
            if header.producer_id in pending:
                self._check_within_request(header, pending[header.producer_id])
            else:
                duplicate = self._duplicate_of(header)
                if duplicate is not None:
                    return duplicate
            pending[header.producer_id] = (header.producer_epoch, header.last_sequence)
        return None

    def _duplicate_of(self, header: BatchHeader) -> AppendResult | None:
        """The original append's result if ``header``'s batch repeats one of its producer's
        last five (raises for a bad epoch or sequence); None for a batch to write."""
        original = self.producer_state.check(header)
        if original is None:
            return None
        return AppendResult(original.first_offset, original.last_offset, -1,
                            self._view.log_start_offset, duplicate=True)

    @staticmethod
    def _check_within_request(header: BatchHeader, previous: tuple[int, int]) -> None:
        epoch, last_sequence = previous
        expected = (last_sequence + 1) % SEQUENCE_MODULUS
        if header.producer_epoch != epoch or header.base_sequence != expected:
            raise OutOfOrderSequenceNumber(
                f"producer {header.producer_id} sent sequence {header.base_sequence} in epoch "
                f"{header.producer_epoch}, expected {expected} in epoch {epoch}")

    def _record_producers(self, headers: list[tuple[int, BatchHeader]], first_offset: int) -> None:
        for relative_offset, header in headers:
            self.producer_state.update(header, first_offset + relative_offset)

    # ---- rolling and flushing ------------------------------------------------------------

    def _active_segment_for(self, size_bytes: int, last_offset: int, max_timestamp_ms: int,
                            now_ms: int) -> LogSegment:
        """The segment to append to: the active one, unless it is non-empty and must roll:
        full by size, index or relative offset range, or too old (Kafka's ``shouldRoll``;
        ``max_timestamp_ms`` is the largest timestamp of the batches to append)."""
        active = self._segments[-1]
        if active.size_bytes and self._must_roll(active, size_bytes, last_offset,
                                                 max_timestamp_ms, now_ms):
            self._roll_locked(now_ms)
            active = self._segments[-1]
        return active

    def _must_roll(self, active: LogSegment, size_bytes: int, last_offset: int,
                   max_timestamp_ms: int, now_ms: int) -> bool:
        broker_deadline_ms, message_deadline_ms = self._roll_deadlines(active)
        return (now_ms > broker_deadline_ms or max_timestamp_ms > message_deadline_ms
                or active.size_bytes + size_bytes > self.config.segment_bytes
                or len(active.offset_index.positions) >= active.offset_index.max_entries
                or len(active.time_index.timestamps) >= active.time_index.max_entries
                or last_offset - active.base_offset > MAX_RELATIVE_OFFSET)

    def append_needs_no_io_wait(self, size_bytes: int, now_ms: int,
                                records: bytes | bytearray | memoryview = b"") -> bool:
        """Whether appending ``records`` (``size_bytes`` of them) now certainly neither fsyncs
        nor rolls (flush.messages not reached even if every byte were a record; no roll by
        size, index, offset range or age -- by the batch's max timestamp when the active
        segment rolls by timestamps) and is not on a compacted log (whose lock the cleaner
        takes for a swap). The broker runs such small appends inline on its event loop.
        A hint read without the lock: a racing append can only make the answer stale
        towards "a roll or flush happens", which the append then simply performs."""
        config = self.config
        if config.compact_enabled or self._closed:
            return False
        log_end_offset = self._view.log_end_offset
        if log_end_offset + size_bytes - self.recovery_point >= config.flush_messages:
            return False
        active = self._segments[-1]
        return not (active.size_bytes and self._must_roll(
            active, size_bytes, log_end_offset + size_bytes,
            single_batch_max_timestamp(records), now_ms))

    def _roll_deadlines(self, segment: LogSegment) -> tuple[int, int]:
        """When ``segment`` is too old to append to, as Kafka's ``timeWaitedForRoll``: a
        segment whose first batch has a timestamp (>= 0) rolls for a batch whose max
        timestamp lies more than segment.ms (less the jitter) after it -- (NEVER, that
        timestamp) --, any other when the broker time is that far past its creation --
        (that time, NEVER). Cached per segment once its first batch is known (config
        changes clear it)."""
        cached_segment, deadlines = self._roll_deadline
        if cached_segment is segment:
            return deadlines
        limit_ms = self._max_segment_ms - self._segment_jitter_ms
        first_timestamp_ms = segment.first_batch_timestamp_ms
        if first_timestamp_ms is not None and first_timestamp_ms >= 0:
            deadlines = (ROLL_NEVER, first_timestamp_ms + limit_ms)
        else:
            deadlines = (segment.created_ms + limit_ms, ROLL_NEVER)
        if first_timestamp_ms is not None:
            self._roll_deadline = (segment, deadlines)
        return deadlines

    def _segment_expired(self, segment: LogSegment, now_ms: int) -> bool:
        """Roll by time without a batch to append (headrace's maintenance; Kafka rolls only
        at an append): by broker time for a segment that rolls by its creation time; for
        one that rolls by timestamps only on a compact-only log (no retention can follow)
        whose first timestamp is > 0, so its records become cleanable within
        max.compaction.lag.ms. Records with old timestamps are never rolled -- and so
        exposed to retention -- sooner than Kafka would."""
        broker_deadline_ms, message_deadline_ms = self._roll_deadlines(segment)
        if now_ms > broker_deadline_ms:
            return True
        config = self.config
        return (config.compact_enabled and not config.delete_enabled
                and (segment.first_batch_timestamp_ms or 0) > 0 and now_ms > message_deadline_ms)

    @property
    def _max_segment_ms(self) -> int:
        """Kafka's ``LogConfig.maxSegmentMs``: a compacted log also rolls by
        max.compaction.lag.ms."""
        config = self.config
        if config.compact_enabled:
            return min(config.segment_ms, config.max_compaction_lag_ms)
        return config.segment_ms

    def roll(self, now_ms: int) -> None:
        with self._lock:
            if self._segments[-1].size_bytes:
                self._roll_locked(now_ms)

    def maybe_roll_by_time(self, now_ms: int) -> None:
        with self._lock:
            self._maybe_roll_by_time_locked(now_ms)

    def _maybe_roll_by_time_locked(self, now_ms: int) -> None:
        active = self._segments[-1]
        if active.size_bytes and self._segment_expired(active, now_ms):
            self._roll_locked(now_ms)

    def maintain(self, now_ms: int, flush_by_time: bool = False,
                 check_retention: bool = False) -> int | None:
        """The broker's periodic work on this log: roll by segment.ms and flush the rolled
        segments; with ``flush_by_time`` flush by flush.ms (Kafka's log flusher, run each
        log.flush.scheduler.interval.ms); with ``check_retention`` delete segments by
        retention (Kafka's retention check, run each log.retention.check.interval.ms).
        Returns the count of segments deleted; None -- nothing done -- while another thread
        holds the log's lock (a cleaner swapping segments in holds it across renames and
        fsyncs): the caller is the append thread, which must not wait for that, and retries
        at its next round."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                return 0
            self._maybe_roll_by_time_locked(now_ms)
            self._flush_if_due_locked(now_ms, flush_by_time)
            return self._delete_old_segments_locked(now_ms) if check_retention else 0
        finally:
            self._lock.release()

    def _roll_locked(self, now_ms: int) -> None:
        log_end_offset = self._view.log_end_offset
        # Make everything below the new segment durable before it exists: otherwise a power
        # loss can tear the old segment while the new one survives, leaving a hole that no
        # CRC scan detects (the torn segment simply ends early). One fsync per segment.bytes.
        self._flush_locked(now_ms, force=True)
        self._plain_gate = None
        self._segments[-1].seal()
        self.producer_state.take_snapshot(log_end_offset)
        segment = self._new_segment(log_end_offset, now_ms)
        self._segments.append(segment)
        view = self._view
        self._view = LogView(tuple(self._segments), log_end_offset, 0, view.log_start_offset)
        logger.info("%s-%d: rolled new segment at offset %d", self.topic, self.partition,
                    log_end_offset)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked(None)

    def _flush_locked(self, now_ms: int | None, log_end_offset: int | None = None,
                      force: bool = False) -> None:
        """Sync the segments from the recovery point on; ``log_end_offset`` (default the
        published one) is the new recovery point: an append due for a flush passes its own
        end, so records become visible to fetches (and so to consumers) only once synced, as
        Kafka raises the high watermark only after the append and its flush return."""
        log_end_offset = self._view.log_end_offset if log_end_offset is None else log_end_offset
        if not force and log_end_offset <= self.recovery_point and not self._rolled_unflushed():
            return
        first = max(0, bisect.bisect_right([s.base_offset for s in self._segments],
                                           self.recovery_point) - 1)
        for segment in self._segments[first:]:
            segment.flush()
        self.recovery_point = log_end_offset
        if now_ms is not None:
            self.last_flush_ms = now_ms

    def _rolled_unflushed(self) -> bool:
        return self.recovery_point < self._segments[-1].base_offset

    def flush_if_due(self, now_ms: int) -> None:
        """Time-based flush (flush.ms), and the flush Kafka schedules after a roll."""
        with self._lock:
            if not self._closed:
                self._flush_if_due_locked(now_ms, flush_by_time=True)

    def _flush_if_due_locked(self, now_ms: int, flush_by_time: bool) -> None:
        """The flush Kafka schedules after a roll (segments below the active one); with
        ``flush_by_time`` also Kafka's ``flushDirtyLogs`` rule: everything once flush.ms has
        passed since the last flush."""
        if flush_by_time and now_ms - self.last_flush_ms >= self.config.flush_ms:
            self._flush_locked(now_ms)
            self.last_flush_ms = now_ms
        elif self._rolled_unflushed():
            self._flush_rolled_segments()

    def _flush_rolled_segments(self) -> None:
        active_base = self._segments[-1].base_offset
        first = max(0, bisect.bisect_right([s.base_offset for s in self._segments],
                                           self.recovery_point) - 1)
        for segment in self._segments[first:-1]:
            segment.flush()
        self.recovery_point = active_base

    # ---- reading -------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, min_one_batch: bool = True) -> ReadResult:
        view = self._view
        if offset < view.log_start_offset or offset > view.log_end_offset:
            raise OffsetOutOfRange(f"offset {offset} is outside [{view.log_start_offset}, "
                                   f"{view.log_end_offset}] of {self.topic}-{self.partition}")
        slices: list[FileSlice] = []
        remaining = max_bytes
        first_index = bisect.bisect_right(view.base_offsets, offset) - 1
        hint = self._next_batches.pop(offset, None)
        for index in range(first_index, len(view.segments)):
            if offset >= view.log_end_offset:
                break
            segment, max_position = view.segments[index], view.max_position(index)
            if hint is not None and hint[0] is segment:
                location = hint[1]
            else:
                location = segment.find_batch(offset, max_position)
            hint = None
            if location is None:
                continue
            piece, following = segment.slice_and_next(location, remaining, max_position,
                                                      min_one_batch and not slices)
            if piece is None:
                break
            slices.append(piece)
            remaining -= piece.length
            if piece.position + piece.length < max_position or remaining <= 0:
                if following is not None:
                    self._remember_next_batch(segment, following)
                break
        size_bytes = sum(piece.length for piece in slices)
        return ReadResult(tuple(slices), size_bytes, view.log_end_offset, view.log_start_offset)

    def _remember_next_batch(self, segment: LogSegment, location: BatchLocation) -> None:
        """Where the next read of a sequential reader starts (by the batch's base offset),
        so that read needs no index lookup and no header read. Entries are used once; the
        map is emptied when it holds ``MAX_READ_HINTS`` (readers that went away)."""
        if len(self._next_batches) >= MAX_READ_HINTS:
            self._next_batches = {}
        self._next_batches[location.base_offset] = (segment, location)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        view = self._view
        if timestamp_ms == EARLIEST_TIMESTAMP:
            return view.log_start_offset, -1
        if timestamp_ms == LATEST_TIMESTAMP:
            return view.log_end_offset, -1
        if timestamp_ms == MAX_TIMESTAMP:
            return self._max_timestamp_offset(view)
        for index, segment in enumerate(view.segments):
            if segment.largest_timestamp_ms() >= timestamp_ms:
                return segment.offset_at_or_after_timestamp(
                    timestamp_ms, view.log_start_offset, view.max_position(index))
        return None

    @staticmethod
    def _max_timestamp_offset(view: LogView) -> tuple[int, int] | None:
        best: tuple[int, int, int] | None = None  # (offset, timestamp, segment index)
        for index, segment in enumerate(view.segments):
            if segment.max_timestamp_ms >= 0 and (best is None or segment.max_timestamp_ms > best[1]):
                if segment.offset_of_max_timestamp < view.log_end_offset:
                    best = (segment.offset_of_max_timestamp, segment.max_timestamp_ms, index)
        if best is None:
            return None
        offset, timestamp_ms, index = best
        return view.segments[index].record_with_timestamp(offset, timestamp_ms,
                                                          view.max_position(index))

    # ---- retention -----------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: advance the log start offset to ``offset`` (<= high watermark)."""
        with self._lock:
            view = self._view
            if offset < 0 or offset > view.log_end_offset:
                raise OffsetOutOfRange(f"cannot delete records before {offset}: high watermark "
                                       f"is {view.log_end_offset}")
            if offset > view.log_start_offset:
                self._set_log_start(offset)
            return self._view.log_start_offset

    def _set_log_start(self, log_start_offset: int) -> None:
        view = self._view
        self._view = LogView(view.segments, view.log_end_offset, view.active_size_bytes,
                             log_start_offset)

    def delete_old_segments(self, now_ms: int) -> int:
        """Retention: delete whole non-active segments past retention.ms / retention.bytes
        (cleanup.policy delete) or wholly below the log start offset. Returns the count."""
        with self._lock:
            return 0 if self._closed else self._delete_old_segments_locked(now_ms)

    def _delete_old_segments_locked(self, now_ms: int) -> int:
        deletable = self._deletable_prefix(now_ms)
        if deletable:
            self._delete_segments(deletable, now_ms)
        return deletable

    def _deletable_prefix(self, now_ms: int) -> int:
        segments, config = self._segments, self.config
        log_start = self._view.log_start_offset
        count = 0
        excess_bytes = self.size_bytes - config.retention_bytes
        for index, segment in enumerate(segments[:-1]):
            below_start = segments[index + 1].base_offset <= log_start
            by_time = config.delete_enabled and config.retention_ms >= 0 and \
                now_ms - segment.largest_timestamp_ms() > config.retention_ms
            by_size = config.delete_enabled and config.retention_bytes >= 0 and \
                excess_bytes - segment.size_bytes >= 0
            if not (below_start or by_time or by_size):
                break
            excess_bytes -= segment.size_bytes
            count += 1
        return count

    def _delete_segments(self, count: int, now_ms: int) -> None:
        doomed, kept = self._segments[:count], self._segments[count:]
        self._segments = kept
        view = self._view
        log_start = max(view.log_start_offset, kept[0].base_offset)
        self._view = LogView(tuple(kept), view.log_end_offset, view.active_size_bytes, log_start)
        for segment in doomed:
            paths = segment.rename_to_deleted()
            self._pending_deletions.append(
                _PendingDeletion(now_ms + self.config.file_delete_delay_ms, segment, paths))
            logger.info("%s-%d: deleting segment %s (retention)", self.topic, self.partition,
                        segment.log_path.name)
        self.producer_state.remove_snapshots(below_offset=kept[0].base_offset)

    def remove_deleted_files(self, now_ms: int, force: bool = False) -> None:
        """Close and remove ``.deleted`` segments whose file.delete.delay.ms has passed.

        The files are unlinked after the log's lock is released: unlinking a large file can
        take tens of milliseconds (freeing its blocks, discards), and appends must not wait
        for it."""
        with self._lock:
            due, kept = [], []
            for pending in self._pending_deletions:
                (due if force or pending.due_ms <= now_ms else kept).append(pending)
            self._pending_deletions = kept
            for pending in due:
                pending.segment.close()
        for pending in due:
            for path in pending.paths:
                if self.fs.exists(path):
                    self.fs.remove(path)

    # ---- compaction ----------------------------------------------------------------------

    def replace_segments(self, old: list[LogSegment], cleaned_path: Path, now_ms: int,
                         index: IndexedBatches | None = None) -> LogSegment:
        """Swap the cleaner's fsynced ``<base>.log.cleaned`` (base = ``old[0]``'s) in for the
        consecutive closed segments ``old``: rename it to ``.swap`` (the commit point), retire
        ``old`` as ``.deleted`` (open readers keep their descriptors), rename the swap file to
        ``.log``, write its indexes and publish the new segment list. The indexes are
        ``index`` (the cleaner's, computed as it wrote the file: ``index_batches`` over the
        whole file) if given and it covers the file, else rebuilt by a scan of the file
        (either way written and fsynced at the same step, so the crash rules stay). Raises
        ``CleaningAborted`` (nothing changed) if ``old`` is no longer in the log."""
        with self._lock:
            first = next((i for i, s in enumerate(self._segments) if s is old[0]), -1)
            if first < 0 or first + len(old) >= len(self._segments) or any(
                    self._segments[first + i] is not s for i, s in enumerate(old)):
                raise CleaningAborted(f"{self.topic}-{self.partition}: segments to replace "
                                      "changed during cleaning")
            swap_path = cleaned_path.with_name(
                segment_file_name(old[0].base_offset, LOG_SUFFIX + SWAP_SUFFIX))
            # Kafka's cleaner keeps the replaced segments' last-modified time (the time-based
            # decisions for batches without timestamps read it); set before the commit point.
            last_modified_ms = old[-1].last_modified_ms()
            self.fs.set_mtime_ms(cleaned_path, last_modified_ms)
            self.fs.rename(cleaned_path, swap_path)
            self.fs.fsync_dir(self.dir)
            for segment in old:
                paths = segment.rename_to_deleted()
                self._pending_deletions.append(
                    _PendingDeletion(now_ms + self.config.file_delete_delay_ms, segment, paths))
            self.fs.rename(swap_path, old[0].log_path)
            self.fs.fsync_dir(self.dir)
            cleaned = self._new_segment(old[0].base_offset, now_ms)
            if index is not None and index.bytes_valid == cleaned.size_bytes:
                self._adopt_indexes(cleaned, index)
            else:
                if index is not None:
                    logger.warning("%s: the cleaner's index covers %d of its %d bytes; "
                                   "rebuilding it", cleaned.log_path, index.bytes_valid,
                                   cleaned.size_bytes)
                self._rebuild_indexes(cleaned, sealed=True)
            self._segments[first : first + len(old)] = [cleaned]
            view = self._view
            self._view = LogView(tuple(self._segments), view.log_end_offset,
                                 view.active_size_bytes, view.log_start_offset)
            return cleaned

    # ---- cleaning guard ------------------------------------------------------------------

    def begin_cleaning(self) -> bool:
        """Take the cleaning lock for one cleaning; False (lock not held) if cleaning stopped
        for good (closed or deleted log). Blocks while another thread cleans this log."""
        self._cleaning_lock.acquire()
        if self._cleaning_stopped:
            self._cleaning_lock.release()
            return False
        return True

    def end_cleaning(self) -> None:
        self._cleaning_lock.release()

    def check_cleaning_aborted(self) -> None:
        """Raise ``CleaningAborted`` once ``stop_cleaning`` has been called."""
        if self._cleaning_stopped:
            raise CleaningAborted(f"{self.topic}-{self.partition}: log closed or deleted")

    def stop_cleaning(self) -> None:
        """No cleaning starts any more; wait for one in progress to stop (at its next chunk).
        Call without holding the log's lock."""
        self._cleaning_stopped = True
        with self._cleaning_lock:
            pass

    # ---- configuration and shutdown ------------------------------------------------------

    def update_config(self, config: LogConfig) -> None:
        with self._lock:
            if (config.segment_jitter_ms, config.segment_ms) != (
                    self.config.segment_jitter_ms, self.config.segment_ms):
                self._segment_jitter_ms = self._pick_jitter(config)
            self.config = config
            self._apply_config(config)

    def close(self) -> None:
        """Flush everything, snapshot producer state at the log end, close all files."""
        self.stop_cleaning()
        with self._lock:
            if self._closed:
                return
            self._segments[-1].seal()
            self._flush_locked(None, force=True)
            self.producer_state.take_snapshot(self._view.log_end_offset)
            self._closed = True
            for segment in self._segments:
                segment.close()
            for pending in self._pending_deletions:
                pending.segment.close()

    def close_without_flush(self) -> None:
        """Release file descriptors (a deleted partition)."""
        self.stop_cleaning()
        with self._lock:
            self._closed = True
            for segment in self._segments:
                segment.close()
            for pending in self._pending_deletions:
                pending.segment.close()
            self._pending_deletions = []

    @property
    def closed(self) -> bool:
        return self._closed
