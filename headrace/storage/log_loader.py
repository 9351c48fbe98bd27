"""Loading one partition's log from its directory, as Kafka's ``LogLoader``: the segments
found on disk, checked and recovered, and the producer state rebuilt from them.

Owns the start-up rules for the files of ``<topic>-<partition>/`` (formats: ``segment``,
``index``, ``producer_state``):

- leftovers are deleted: ``*.deleted`` (retention or a cleaning not yet removed), ``*.tmp``,
  ``*.cleaned`` (a cleaning that never reached its commit point), and index files whose
  segment is gone;
- a ``<base>.log.swap`` file (a cleaning past its commit point) is completed: the segments
  whose base offsets lie in its offset range are deleted, it becomes ``<base>.log`` and its
  indexes are rebuilt;
- a segment whose ``.index`` file is missing gets its indexes rebuilt (a full CRC scan);
- after a clean shutdown the sealed segments' indexes are sanity-checked and the active
  segment's tail after its last index entry is CRC-checked all the same (the marker does not
  vouch for the disk): a torn or garbled tail is truncated to its last valid batch with a
  WARNING naming the file and byte;
- after an unclean shutdown every batch after the recovery point is CRC-checked; the log is
  truncated at the first bad byte (later segments are deleted) and the indexes of the
  segments touched are rebuilt, so the work grows with the unflushed tail, not the log;
- damage loading must not repair raises ``KafkaStorageError`` naming the file and byte: a
  bad byte in a sealed segment whose index is being rebuilt (it may hold flushed,
  acknowledged records after it), and a gap or overlap between segments (a header walk of
  each sealed segment's tail). Compacted logs may have gaps; others only those listed in
  ``accepted-gaps`` (``ACCEPTED_GAPS_FILE``: lines ``<end offset> <next base offset>``,
  written by ``headrace repair --accept-gap``).

If loading fails, the segments it opened are closed and the offset index files it created
for segments that had none are removed, so the next start meets the same damage.

Thread-safety: a ``LogLoader`` is used once, by the thread constructing the ``Log``, before
the log is published to any other thread.
"""

from __future__ import annotations

import bisect
import logging
import os
from dataclasses import dataclass
from pathlib import Path

from headrace.errors import CorruptMessage, KafkaStorageError
from headrace.protocol.batch import BATCH_HEADER_BYTES, BatchHeader, parse_header
from headrace.protocol.control_records import marker_of_batch
from headrace.storage.config import LogConfig
from headrace.storage.fs import FileSystem, read_whole_file, write_file_atomically
from headrace.storage.local_log import CLEANED_SUFFIX, SWAP_SUFFIX, open_segment
from headrace.storage.producer_state import ProducerStateManager
from headrace.storage.segment import (
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    TIME_INDEX_SUFFIX,
    LogSegment,
    segment_file_name,
)
from headrace.storage.txn_index import TXN_INDEX_SUFFIX

logger = logging.getLogger(__name__)

LEFTOVER_SUFFIXES = (DELETED_SUFFIX, ".tmp", CLEANED_SUFFIX)
ACCEPTED_GAPS_FILE = "accepted-gaps"


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


@dataclass(frozen=True, slots=True)
class LoadedSegments:
    """What loading found: the checked segments (the last one active), the log end offset,
    and the offset up to which producer-state snapshots may be trusted."""

    segments: list[LogSegment]
    log_end_offset: int
    snapshot_limit: int


class LogLoader:
    """Opens, completes, checks and recovers the segments of one partition directory."""

    def __init__(self, topic: str, partition: int, directory: Path, config: LogConfig,
                 fs: FileSystem) -> None:
        self.topic = topic
        self.partition = partition
        self.dir = directory
        self.config = config
        self.fs = fs
        self._opened: list[LogSegment] = []  # closed again if loading fails
        self._missing_index_bases: set[int] = set()

    def load(self, now_ms: int, recovery_point: int, log_start_offset: int,
             clean_shutdown: bool) -> LoadedSegments:
        """Open and check the segments. Raises KafkaStorageError naming the file and byte
        for damage that loading must not repair (a bad sealed segment, a gap or overlap
        between segments)."""
        try:
            segments = self._open_segments(now_ms, log_start_offset)
            if clean_shutdown:
                log_end_offset = self._load_clean(segments)
                snapshot_limit = log_end_offset
            else:
                segments, log_end_offset = self._recover(segments, recovery_point)
                snapshot_limit = recovery_point
            self._check_contiguous(segments)
        except BaseException:
            self._abandon_loading()
            raise
        segments[-1].make_active()
        return LoadedSegments(segments, log_end_offset, snapshot_limit)

    def _abandon_loading(self) -> None:
        """Close what ``_open_segments`` opened and remove the offset index files it created
        for segments that had none, so the next start meets the same damage rather than an
        empty index that passes the sanity check."""
        for segment in self._opened:
            segment.close()
        for base in self._missing_index_bases:
            path = self.dir / segment_file_name(base, INDEX_SUFFIX)
            if self.fs.exists(path):
                self.fs.remove(path)

    # ---- finding the segments ------------------------------------------------------------

    def _open_segments(self, now_ms: int, log_start_offset: int) -> list[LogSegment]:
        needs_index_rebuild = self._complete_swaps()
        bases = self._segment_bases()
        # Kafka's sanity check: a flushed segment whose offset index file is missing is
        # rebuilt (``_load_indexes``); one after the recovery point is recovered anyway
        self._missing_index_bases = {base for base in bases if not self.fs.exists(
            self.dir / segment_file_name(base, INDEX_SUFFIX))}
        if not bases:
            bases.add(max(log_start_offset, 0))
        segments = self._opened
        for base in sorted(bases):
            segments.append(open_segment(self.fs, self.dir, self.config, base, now_ms))
        for segment in segments[:-1]:  # the active segment's tail is scanned anyway
            if segment.base_offset in needs_index_rebuild and segment.size_bytes:
                segment.rebuild_indexes(sealed=True)
        return segments

    def _segment_bases(self) -> set[int]:
        """The base offsets of the ``.log`` files, after deleting leftovers and the indexes
        that have lost their segment (as Kafka does)."""
        names = self.fs.listdir(self.dir)
        bases = set()
        for name in names:
            path = self.dir / name
            if name.endswith(LEFTOVER_SUFFIXES):
                self.fs.remove(path)
            elif name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit():
                bases.add(int(name[: -len(LOG_SUFFIX)]))
        for name in names:
            for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX):
                stem = name[: -len(suffix)]
                if name.endswith(suffix) and stem.isdigit() and int(stem) not in bases:
                    self.fs.remove(self.dir / name)
        return bases

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
                        other.endswith((LOG_SUFFIX, INDEX_SUFFIX, TIME_INDEX_SUFFIX,
                                        TXN_INDEX_SUFFIX)):
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

    # ---- after a clean shutdown ----------------------------------------------------------

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

    def _load_indexes(self, segment: LogSegment) -> None:
        """Load a sealed, flushed segment's indexes; rebuild them when they fail the sanity
        check or the offset index file was missing (a bad byte then is damage)."""
        if segment.base_offset in self._missing_index_bases or not segment.load_indexes():
            segment.rebuild_indexes(sealed=True)

    # ---- after an unclean shutdown -------------------------------------------------------

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

    @staticmethod
    def _trusted_start(segment: LogSegment, recovery_point: int) -> int:
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

    # ---- gap detection -------------------------------------------------------------------

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


def rebuild_producer_state(state: ProducerStateManager, segments: list[LogSegment],
                           snapshot_limit: int, log_end_offset: int) -> None:
    """Load the newest snapshot at or below ``snapshot_limit`` and replay the batches after
    it, markers included, so deduplication and ongoing transactions survive restarts. The
    aborted-transaction index entries of the replayed range are rewritten from its markers
    (Kafka rebuilds them in its segment recovery): dropped from the replay point on, then
    appended again as the replay meets each abort marker."""
    replay_from = max(state.load_latest_snapshot(min(snapshot_limit, log_end_offset)), 0)
    for index, segment in enumerate(segments):
        if index + 1 < len(segments) and segments[index + 1].base_offset <= replay_from:
            continue
        segment.txn_index.truncate_to(replay_from)
        location = segment.find_batch(replay_from, segment.size_bytes)
        if location is None:
            continue
        for position, header in segment.iter_batches(location.position):
            if header.base_offset >= replay_from:
                _replay_batch(state, segment, position, header)
    state.remove_snapshots(above_offset=log_end_offset)


def _replay_batch(state: ProducerStateManager, segment: LogSegment, position: int,
                  header: BatchHeader) -> None:
    marker = None
    if header.is_control and header.producer_id >= 0:
        raw = segment.fs.pread(segment.log_file().fd, header.size_bytes, position)
        found = marker_of_batch(raw)
        marker = None if found is None else (found.commit, found.coordinator_epoch)
    completed = state.replay(header, marker)
    if completed is not None and completed.aborted:
        segment.txn_index.append(state.aborted_entry(completed))
