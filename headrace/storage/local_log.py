"""The segments of one partition's log on local disk, as Kafka's ``LocalLog``: the segment
list and its published snapshot, reads, offsets by time, rolling, flushing, deleting and
swapping segments.

Files (formats: ``segment``, ``index``): ``<20-digit base>.log``, ``.index`` and
``.timeindex`` per segment, ``.txnindex`` where a transaction aborted. A deleted segment's files are renamed with a ``.deleted`` suffix
and removed once ``file.delete.delay.ms`` has passed (``remove_deleted_files``), so a reader
that took a snapshot before the deletion still reads them. A cleaning's output is swapped in
by ``replace_segments``: ``<base>.log.cleaned`` renamed to ``<base>.log.swap`` (the commit
point; ``log_loader`` completes an interrupted swap), the replaced segments retired as
``.deleted``, the swap file renamed to ``<base>.log`` and its indexes written, its
aborted-transaction index holding the replaced segments' entries (written after the commit
point: a crash right there loses them for that range, unless a replay covers it).

Snapshot: after each change the writer publishes an immutable ``LogView`` (segment tuple, log
end, active segment size, log start) with a single attribute store; readers take that
snapshot and never lock, so a reader never blocks a writer (copy-on-write segment list, as in
Kafka). ``read`` remembers where each read's next batch starts (``_next_batches``: its base
offset -> segment and position, filled from the header the read's last step already read), so
a sequential reader's next read skips the index lookup and header read; an entry is trusted
only while its segment object is still in the snapshot (segments are append-only; the cleaner
replaces whole segment objects), and the map is only read, popped and rebound, so readers on
several threads need no lock.

Offsets by time read a segment's largest timestamp as Kafka's ``largestTimestamp`` and search
the first segment whose largest timestamp reaches the target, as Kafka's
``searchOffsetInLocalLog``; the max-timestamp lookup answers the first record carrying the
largest timestamp.

Thread-safety: not thread-safe for changes. The owning ``Log`` calls every method that changes
the segments, the snapshot, the recovery point or the pending deletions under its lock;
``read``, ``offset_for_timestamp``, ``view`` and ``size_bytes`` work on the published snapshot
from any thread.
"""

from __future__ import annotations

import bisect
import logging
from dataclasses import dataclass
from pathlib import Path

from headrace.errors import OffsetOutOfRange
from headrace.storage.config import LogConfig
from headrace.storage.fs import FileSystem
from headrace.storage.segment import (
    LOG_SUFFIX,
    BatchLocation,
    FileSlice,
    LogSegment,
    segment_file_name,
)
from headrace.storage.segment_io import IndexedBatches
from headrace.storage.txn_index import AbortedTxn

logger = logging.getLogger(__name__)

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
MAX_TIMESTAMP = -3
CLEANED_SUFFIX = ".cleaned"  # a cleaning's output before its commit point
SWAP_SUFFIX = ".swap"  # a cleaning's output past its commit point
MAX_READ_HINTS = 16  # remembered next-read positions per log (one per sequential reader)


def open_segment(fs: FileSystem, directory: Path, config: LogConfig, base_offset: int,
                 now_ms: int, active: bool = False) -> LogSegment:
    """The segment of ``directory`` at ``base_offset``, created if it does not exist; an
    ``active`` one keeps its files open, a sealed one opens them when used."""
    return LogSegment(fs, directory, base_offset, config.segment_index_bytes,
                      config.index_interval_bytes, now_ms, active)


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
class PendingDeletion:
    """A retired segment whose ``.deleted`` files are removed at ``due_ms``."""

    due_ms: int
    segment: LogSegment
    paths: list[Path]


class LocalLog:
    """The segment list of one partition directory and its published snapshot."""

    def __init__(self, topic: str, partition: int, directory: Path, config: LogConfig,
                 fs: FileSystem, segments: list[LogSegment], log_end_offset: int,
                 log_start_offset: int, now_ms: int) -> None:
        self.topic = topic
        self.partition = partition
        self.dir = directory
        self.config = config
        self.fs = fs
        self.segments = segments  # the last one is active; replaced by copy-on-write views
        self.recovery_point = log_end_offset
        self.last_flush_ms = now_ms
        self.pending_deletions: list[PendingDeletion] = []
        # next batch's base offset -> (segment, its BatchLocation): see _remember_next_batch
        self._next_batches: dict[int, tuple[LogSegment, BatchLocation]] = {}
        log_start = min(max(log_start_offset, segments[0].base_offset), log_end_offset)
        self.view = LogView(tuple(segments), log_end_offset, segments[-1].size_bytes, log_start)

    @property
    def active_segment(self) -> LogSegment:
        return self.segments[-1]

    @property
    def size_bytes(self) -> int:
        view = self.view
        return sum(s.size_bytes for s in view.segments[:-1]) + view.active_size_bytes

    # ---- publishing ----------------------------------------------------------------------

    def publish_tail(self, log_end_offset: int, active_size_bytes: int) -> None:
        """Readers see the log end and the active segment's size after an append."""
        self.view = self.view.with_tail(log_end_offset, active_size_bytes)

    def publish_log_start(self, log_start_offset: int) -> None:
        view = self.view
        self.view = LogView(view.segments, view.log_end_offset, view.active_size_bytes,
                            log_start_offset)

    def _publish_segments(self, log_start_offset: int | None = None) -> None:
        view = self.view
        log_start = view.log_start_offset if log_start_offset is None else log_start_offset
        self.view = LogView(tuple(self.segments), view.log_end_offset, view.active_size_bytes,
                            log_start)

    # ---- rolling and flushing ------------------------------------------------------------

    def seal_active_segment(self, now_ms: int) -> None:
        """Make everything durable and seal the active segment, before a roll: otherwise a
        power loss can tear the old segment while the new one survives, leaving a hole that
        no CRC scan detects (the torn segment simply ends early). One fsync per
        segment.bytes."""
        self.flush(now_ms, force=True)
        self.segments[-1].seal()

    def start_segment(self, now_ms: int) -> LogSegment:
        """A new, empty active segment at the log end offset (after
        ``seal_active_segment``)."""
        log_end_offset = self.view.log_end_offset
        segment = open_segment(self.fs, self.dir, self.config, log_end_offset, now_ms,
                               active=True)
        self.segments.append(segment)
        view = self.view
        self.view = LogView(tuple(self.segments), log_end_offset, 0, view.log_start_offset)
        logger.info("%s-%d: rolled new segment at offset %d", self.topic, self.partition,
                    log_end_offset)
        return segment

    def flush(self, now_ms: int | None, log_end_offset: int | None = None,
              force: bool = False) -> None:
        """fsync every segment from the one holding the recovery point; the recovery point
        becomes ``log_end_offset`` (default the published one). An append due for a flush
        passes its own end before publishing it, so records become visible to fetches (and so
        to consumers) only once synced, as Kafka raises the high watermark only after the
        append and its flush return."""
        if log_end_offset is None:
            log_end_offset = self.view.log_end_offset
        if not force and log_end_offset <= self.recovery_point and not self.rolled_unflushed():
            return
        for segment in self.segments[self._first_unflushed_index():]:
            segment.flush()
        self.recovery_point = log_end_offset
        if now_ms is not None:
            self.last_flush_ms = now_ms

    def rolled_unflushed(self) -> bool:
        return self.recovery_point < self.segments[-1].base_offset

    def flush_rolled_segments(self) -> None:
        """The flush Kafka schedules after a roll: the segments below the active one."""
        active_base = self.segments[-1].base_offset
        for segment in self.segments[self._first_unflushed_index():-1]:
            segment.flush()
        self.recovery_point = active_base

    def _first_unflushed_index(self) -> int:
        return max(0, bisect.bisect_right([s.base_offset for s in self.segments],
                                          self.recovery_point) - 1)

    # ---- reading -------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, min_one_batch: bool = True,
             max_offset: int | None = None, high_watermark: int | None = None) -> ReadResult:
        """Whole batches from the one holding ``offset``; with ``max_offset`` (a batch
        boundary: the high watermark or the last stable offset) none at or after it. The
        result reports ``high_watermark`` (None: the log end offset)."""
        view = self.view
        if offset < view.log_start_offset or offset > view.log_end_offset:
            raise OffsetOutOfRange(f"offset {offset} is outside [{view.log_start_offset}, "
                                   f"{view.log_end_offset}] of {self.topic}-{self.partition}")
        slices: list[FileSlice] = []
        remaining = max_bytes
        end_offset = view.log_end_offset if max_offset is None else \
            min(max_offset, view.log_end_offset)
        first_index = bisect.bisect_right(view.base_offsets, offset) - 1
        hint = self._next_batches.pop(offset, None)
        for index in range(first_index, len(view.segments)):
            if offset >= end_offset:
                break
            segment, max_position = view.segments[index], view.max_position(index)
            if end_offset < view.log_end_offset:
                max_position = self._position_below(view, index, end_offset, max_position)
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
        if high_watermark is None or high_watermark > view.log_end_offset:
            high_watermark = view.log_end_offset
        return ReadResult(tuple(slices), size_bytes, high_watermark, view.log_start_offset)

    @staticmethod
    def _position_below(view: LogView, index: int, end_offset: int, max_position: int) -> int:
        """The position in segment ``index`` where the batch holding ``end_offset`` starts
        (``max_position`` when the segment ends below it)."""
        following = index + 1 < len(view.segments) and \
            view.segments[index + 1].base_offset <= end_offset
        if following:
            return max_position
        location = view.segments[index].find_batch(end_offset, max_position)
        return max_position if location is None else location.position

    def collect_aborted_transactions(self, start_offset: int, upper_bound_offset: int
                                     ) -> list[AbortedTxn]:
        """The aborted transactions overlapping [start_offset, upper_bound_offset), from
        the segment holding ``start_offset`` on (Kafka's ``collectAbortedTransactions``)."""
        view = self.view
        found: list[AbortedTxn] = []
        first_index = max(bisect.bisect_right(view.base_offsets, start_offset) - 1, 0)
        for segment in view.segments[first_index:]:
            entries, complete = segment.txn_index.collect_aborted(start_offset,
                                                                  upper_bound_offset)
            found.extend(entries)
            if complete:
                break
        return found

    def _remember_next_batch(self, segment: LogSegment, location: BatchLocation) -> None:
        """Where the next read of a sequential reader starts (by the batch's base offset),
        so that read needs no index lookup and no header read. Entries are used once; the
        map is emptied when it holds ``MAX_READ_HINTS`` (readers that went away)."""
        if len(self._next_batches) >= MAX_READ_HINTS:
            self._next_batches = {}
        self._next_batches[location.base_offset] = (segment, location)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        view = self.view
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

    # ---- deleting segments ---------------------------------------------------------------

    def delete_oldest_segments(self, count: int, now_ms: int, reason: str) -> int:
        """Retire the ``count`` oldest segments (never the active one) as ``.deleted`` files,
        removed after file.delete.delay.ms; the log start moves up to the first kept
        segment. Returns that segment's base offset."""
        doomed, kept = self.segments[:count], self.segments[count:]
        self.segments = kept
        self._publish_segments(max(self.view.log_start_offset, kept[0].base_offset))
        for segment in doomed:
            self._retire(segment, now_ms)
            logger.info("%s-%d: deleting segment %s (%s)", self.topic, self.partition,
                        segment.log_path.name, reason)
        return kept[0].base_offset

    def _retire(self, segment: LogSegment, now_ms: int) -> None:
        paths = segment.rename_to_deleted()
        self.pending_deletions.append(
            PendingDeletion(now_ms + self.config.file_delete_delay_ms, segment, paths))

    def take_due_deletions(self, now_ms: int, force: bool) -> list[PendingDeletion]:
        """Close and forget the retired segments whose file.delete.delay.ms has passed (all
        of them with ``force``); their files are for ``remove_files`` to unlink."""
        due, kept = [], []
        for pending in self.pending_deletions:
            (due if force or pending.due_ms <= now_ms else kept).append(pending)
        self.pending_deletions = kept
        for pending in due:
            pending.segment.close()
        return due

    def remove_files(self, deletions: list[PendingDeletion]) -> None:
        """Unlink the files of retired segments (without the log's lock: unlinking a large
        file can take tens of milliseconds)."""
        for pending in deletions:
            for path in pending.paths:
                if self.fs.exists(path):
                    self.fs.remove(path)

    # ---- truncation (a follower's) -------------------------------------------------------

    def truncate_to(self, offset: int, now_ms: int) -> int:
        """Drop every batch holding an offset >= ``offset`` (``log_start <= offset <
        log end``): later segments retired as ``.deleted``, the one holding ``offset`` cut
        (and made the active segment), both made durable (fsync of the cut file and of the
        directory). Returns the new log end offset: the end of the last
        batch kept (``offset`` itself at a batch boundary)."""
        segments = self.segments
        keep = max(1, bisect.bisect_right([s.base_offset for s in segments], offset))
        for segment in segments[keep:]:
            self._retire(segment, now_ms)
            logger.info("%s-%d: truncation to offset %d deletes segment %s", self.topic,
                        self.partition, offset, segment.log_path.name)
        self.segments = segments[:keep]
        active = self.segments[-1]
        active.truncate_to(offset)
        active.make_active()
        # Durable before anything is appended after the cut: a power loss must not bring the
        # cut tail back (its renames or the file's old length) below a recovery point that
        # was checkpointed before the truncation, where loading would trust it unchecked.
        active.flush()
        self.fs.fsync_dir(self.dir)
        next_offset = active.next_offset_after(active.offset_index.last_entry()[1]
                                               if active.offset_index.entries else 0)
        log_end_offset = max(next_offset, active.base_offset)
        self.recovery_point = min(self.recovery_point, log_end_offset)
        self._next_batches = {}
        view = self.view
        self.view = LogView(tuple(self.segments), log_end_offset, active.size_bytes,
                            min(view.log_start_offset, log_end_offset))
        return log_end_offset

    def truncate_fully_and_start_at(self, offset: int, now_ms: int) -> None:
        """Retire every segment and start an empty one at ``offset``: the log start, log
        end and recovery point all become ``offset``."""
        for segment in self.segments:
            self._retire(segment, now_ms)
        logger.info("%s-%d: emptied the log to restart it at offset %d", self.topic,
                    self.partition, offset)
        segment = open_segment(self.fs, self.dir, self.config, offset, now_ms, active=True)
        self.fs.fsync_dir(self.dir)  # the retirements are durable before the log restarts
        self.segments = [segment]
        self.recovery_point = offset
        self._next_batches = {}
        self.view = LogView((segment,), offset, 0, offset)

    # ---- swapping in a cleaned segment ---------------------------------------------------

    def replace_segments(self, old: list[LogSegment], cleaned_path: Path, now_ms: int,
                         index: IndexedBatches | None = None,
                         aborted_data_removed_below: int = -1) -> LogSegment:
        """Swap the cleaner's fsynced ``<base>.log.cleaned`` (base = ``old[0]``'s) in for the
        consecutive sealed segments ``old`` (see the module docstring). The indexes are
        ``index`` (the cleaner's, computed as it wrote the file) if given and it covers the
        file, else rebuilt by a scan of the file (either way written and fsynced at the same
        step, so the crash rules stay). Raises ``CleaningAborted`` (nothing changed) if
        ``old`` is no longer in the log. The replaced segments' aborted-transaction entries
        carry over, but for those whose marker lies below ``aborted_data_removed_below``: the
        cleaning removed their data, and once a later one removes their marker too, an entry
        left behind would make read_committed consumers skip the producer's next, committed
        transaction (Kafka's cleaner writes the cleaned index likewise)."""
        first = self._position_of(old)
        swap_path = cleaned_path.with_name(
            segment_file_name(old[0].base_offset, LOG_SUFFIX + SWAP_SUFFIX))
        # Kafka's cleaner keeps the replaced segments' last-modified time (the time-based
        # decisions for batches without timestamps read it); set before the commit point.
        self.fs.set_mtime_ms(cleaned_path, old[-1].last_modified_ms())
        aborted = tuple(entry for segment in old for entry in segment.txn_index.entries
                        if entry.last_offset >= aborted_data_removed_below)
        self.fs.rename(cleaned_path, swap_path)
        self.fs.fsync_dir(self.dir)
        for segment in old:
            self._retire(segment, now_ms)
        self.fs.rename(swap_path, old[0].log_path)
        self.fs.fsync_dir(self.dir)
        cleaned = open_segment(self.fs, self.dir, self.config, old[0].base_offset, now_ms)
        self._index_cleaned(cleaned, index)
        if aborted:
            cleaned.txn_index.replace(aborted)
        self.segments[first : first + len(old)] = [cleaned]
        self._publish_segments()
        return cleaned

    def _position_of(self, old: list[LogSegment]) -> int:
        """Where the consecutive sealed segments ``old`` start in the list; CleaningAborted
        when they are no longer all there."""
        segments = self.segments
        first = next((i for i, s in enumerate(segments) if s is old[0]), -1)
        if first < 0 or first + len(old) >= len(segments) or any(
                segments[first + i] is not s for i, s in enumerate(old)):
            raise CleaningAborted(f"{self.topic}-{self.partition}: segments to replace "
                                  "changed during cleaning")
        return first

    @staticmethod
    def _index_cleaned(cleaned: LogSegment, index: IndexedBatches | None) -> None:
        if index is not None and index.bytes_valid == cleaned.size_bytes:
            cleaned.adopt_indexes(index)
            return
        if index is not None:
            logger.warning("%s: the cleaner's index covers %d of its %d bytes; rebuilding it",
                           cleaned.log_path, index.bytes_valid, cleaned.size_bytes)
        cleaned.rebuild_indexes(sealed=True)

    # ---- closing -------------------------------------------------------------------------

    def close_files(self) -> None:
        """Close every segment's files, retired ones included."""
        for segment in self.segments:
            segment.close()
        for pending in self.pending_deletions:
            pending.segment.close()
