"""One log segment: ``<base>.log`` with its ``<base>.index`` and ``<base>.timeindex``, and
``<base>.txnindex`` once a transaction aborts in it (see ``txn_index``).

File names are the segment's base offset as 20 zero-padded digits, as in Kafka. The ``.log``
file holds v2 record batches byte-for-byte as received (only the base offset rewritten,
LogAppendTime stamped when configured, and the batch recompressed when the topic's
compression.type names another codec). Index formats: see ``headrace.storage.index``; an
offset index entry maps a batch's *last* offset to the batch's position, as Kafka writes it.

Owns: appending batches and maintaining the indexes (one entry per ``index.interval.bytes``),
locating the batch that holds an offset (index lookup, then a short scan of 27-byte header
prefixes), carving ``FileSlice`` ranges of whole batches for sendfile, recovery (a CRC scan
from a known-good position that truncates at the first bad byte and rebuilds the index entries
after it; ``scan_chunk`` is its step, shared with ``headrace repair``; without truncation, for
sealed segments, a bad byte is a KafkaStorageError naming the file and byte), the header walk
to a segment's end that finds its next offset (gap detection at load), renaming/removing its
files, and its times as Kafka's ``LogSegment`` defines them: the largest timestamp (the
largest valid batch max timestamp, else the log file's last-modified time, read through the
injected file system: -1 is never read as 1970), the first batch's timestamp (Kafka's rolling
base) and the creation time.

Descriptors: the active segment (``make_active``) keeps its three files open. A sealed one
opens them when used and lets go of them when the process's open-segment budget evicts it
(``segment_files``); every read holds the ``SharedDescriptor`` it reads through, a
``FileSlice`` holds its own until it is sent, and a long reader (the cleaner) holds the
segment ``pinned()``. A segment renamed to ``.deleted`` reopens its file under that name, so
a reader with an older snapshot still reads it until ``close``; after ``close`` a read is a
KafkaStorageError.

Thread-safety: mutations (append, recover, truncate, flush, close) come from the owning log's
writer; ``find_batch``/``slice`` are safe from any thread because they are bounded by a size
the caller read from an immutable log snapshot, and indexes only ever grow between restarts.
``largest_timestamp_ms`` and ``first_batch_timestamp`` may be called from any thread (the
cleaner's): the first reads an fstat of the open descriptor, the second caches an idempotent
read of the first batch header. Reopening a let-go descriptor and renaming to ``.deleted``
are ordered by a per-segment lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from headrace.errors import CorruptMessage, KafkaStorageError
from headrace.protocol.batch import (
    BATCH_HEADER_BYTES,
    LOG_OVERHEAD_BYTES,
    BatchHeader,
    parse_header,
)
from headrace.protocol.kernel import decode_columns
from headrace.storage.fs import APPEND_CREATE_FLAGS, FileSystem
from headrace.storage.index import IndexCorrupt, OffsetIndex, TimeIndex
from headrace.storage.segment_files import SharedDescriptor, sealed_segment_files
from headrace.storage.segment_io import IndexedBatches, IndexState, index_batches
from headrace.storage.txn_index import TXN_INDEX_SUFFIX, TransactionIndex

logger = logging.getLogger(__name__)

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
DELETED_SUFFIX = ".deleted"
MAX_RELATIVE_OFFSET = 2**31 - 1
REOPEN_FLAGS = os.O_RDWR | os.O_APPEND  # no O_CREAT: a vanished file is not an empty one
RECOVERY_READ_CHUNK_BYTES = 4 * 1024 * 1024  # also bounds the index rebuild after a cleaning
_HEADER_PREFIX = struct.Struct(">qiibIhi")  # base_offset .. last_offset_delta: 27 bytes
HEADER_PREFIX_BYTES = _HEADER_PREFIX.size


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


def scan_chunk(pread, chunk: bytes, chunk_start: int, file_size: int, base_offset: int,
               next_offset: int, index_interval_bytes: int, state: IndexState
               ) -> tuple[IndexedBatches, bytes, bool]:
    """One step of a segment's CRC scan (recovery, ``headrace repair``): validate and index
    the batches of ``chunk`` (read at ``chunk_start`` of a ``file_size``-byte log) with the
    kernel's ``index_batches``; a first batch larger than the chunk is read whole with
    ``pread(size, position)``. Returns (the scan, the bytes it covered, whether the scan
    stops here: a bad byte at ``chunk_start + scan.bytes_valid``, or the end of the file)."""
    scan = index_batches(chunk, chunk_start, file_size, base_offset, next_offset,
                         index_interval_bytes, state)
    if scan.bytes_valid == 0 and not scan.stopped and len(chunk) >= BATCH_HEADER_BYTES:
        chunk = pread(parse_header(chunk).size_bytes, chunk_start)
        scan = index_batches(chunk, chunk_start, file_size, base_offset, next_offset,
                             index_interval_bytes, state)
    at_file_end = chunk_start + len(chunk) >= file_size
    stop = scan.stopped or scan.bytes_valid == 0 or (
        scan.bytes_valid < len(chunk) and at_file_end)
    return scan, chunk, stop


@dataclass(frozen=True, slots=True)
class FileSlice:
    """Bytes ``[position, position + length)`` of an open file, for ``os.sendfile``. A slice
    of a segment holds its ``descriptor``, so ``fd`` stays open while the slice exists."""

    fd: int
    position: int
    length: int
    descriptor: SharedDescriptor | None = field(default=None, compare=False, repr=False)

    def read_bytes(self) -> bytes:
        """The slice's bytes via pread, for callers that cannot sendfile."""
        chunks, done = [], 0
        while done < self.length:
            chunk = os.pread(self.fd, self.length - done, self.position + done)
            if not chunk:
                raise CorruptMessage(f"file slice ends early at byte {self.position + done}")
            chunks.append(chunk)
            done += len(chunk)
        return b"".join(chunks)


@dataclass(slots=True)
class BatchLocation:
    """Where one batch lies in a segment's log file."""

    position: int
    size_bytes: int
    base_offset: int
    last_offset: int


class LogSegment:
    """A segment file and its indexes; loaded or recovered by ``LogLoader``, created and
    retired by ``LocalLog``."""

    # Slots: every append reads and writes several of these attributes.
    __slots__ = ("fs", "directory", "base_offset", "index_interval_bytes", "log_path",
                 "_log_file", "_active", "_deleted", "_files_lock", "_open_files",
                 "size_bytes", "offset_index", "time_index", "bytes_since_last_index_entry",
                 "max_timestamp_ms", "offset_of_max_timestamp", "first_batch_timestamp_ms",
                 "created_ms", "closed", "txn_index")

    def __init__(self, fs: FileSystem, directory: Path, base_offset: int, index_max_bytes: int,
                 index_interval_bytes: int, created_ms: int, active: bool = False) -> None:
        self.fs = fs
        self.directory = directory
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.log_path = directory / segment_file_name(base_offset, LOG_SUFFIX)
        self._files_lock = threading.Lock()  # orders reopening against renaming
        self._active = active
        self._deleted = False
        self._open_files = sealed_segment_files()
        self._log_file: SharedDescriptor | None = SharedDescriptor(
            fs, fs.open(self.log_path, APPEND_CREATE_FLAGS))
        self.size_bytes = fs.size(self._log_file.fd)
        self.offset_index = OffsetIndex(
            fs, directory / segment_file_name(base_offset, INDEX_SUFFIX), base_offset, index_max_bytes)
        self.time_index = TimeIndex(
            fs, directory / segment_file_name(base_offset, TIME_INDEX_SUFFIX), base_offset,
            index_max_bytes)
        self.txn_index = TransactionIndex(
            fs, directory / segment_file_name(base_offset, TXN_INDEX_SUFFIX))
        self.bytes_since_last_index_entry = 0
        self.max_timestamp_ms = -1
        self.offset_of_max_timestamp = base_offset
        self.first_batch_timestamp_ms: int | None = None
        self.created_ms = created_ms
        self.closed = False
        if not active:
            self._open_files.opened(self)

    # ---- writing -------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview,
               batches: list[tuple[int, int, int, int]], now_ms: int) -> None:
        """Write ``data`` (whole batches) at the end; ``batches`` lists each batch's
        (size_bytes, last_offset, max_timestamp_ms, position within data)."""
        start = self.size_bytes
        self.fs.write(self.log_file().fd, data)
        self._index_batches(start, batches)
        self.size_bytes = start + len(data)

    def append_batch(self, data: bytes | bytearray | memoryview, last_offset: int,
                     max_timestamp_ms: int, now_ms: int) -> None:
        """``append`` of exactly one batch (``data``), the common produce request: the same
        writes and index entries without building per-batch tuples."""
        self.fs.write(self.log_file().fd, data)
        self.note_written_batch(len(data), last_offset, max_timestamp_ms, now_ms)

    def note_written_batch(self, size_bytes: int, last_offset: int, max_timestamp_ms: int,
                           now_ms: int) -> bool:
        """Account for one batch of ``size_bytes`` just written at the end of the log file
        (by ``append_batch``, or by the kernel's ``append_plain_batch`` straight to ``fd``):
        timestamps, an index entry each index.interval.bytes, the size. True when that entry
        filled an index, so the segment must roll before the next append."""
        start = self.size_bytes
        self.size_bytes = start + size_bytes
        if self.first_batch_timestamp_ms is None:
            self.first_batch_timestamp_ms = max_timestamp_ms
        if max_timestamp_ms > self.max_timestamp_ms:
            self.max_timestamp_ms = max_timestamp_ms
            self.offset_of_max_timestamp = last_offset
        if self.bytes_since_last_index_entry <= self.index_interval_bytes:
            self.bytes_since_last_index_entry += size_bytes
            return False
        self.bytes_since_last_index_entry = size_bytes
        offset_index, time_index = self.offset_index, self.time_index
        offset_index.append(last_offset, start)
        time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
        return offset_index.is_full or time_index.is_full

    def _index_batches(self, start: int, batches: Sequence[tuple[int, int, int, int]]) -> None:
        """Track timestamps and add index entries (one per index.interval.bytes) for batches
        written at ``start`` + their relative positions. Runs for every appended batch."""
        if self.first_batch_timestamp_ms is None:
            self.first_batch_timestamp_ms = batches[0][2]
        interval_bytes = self.index_interval_bytes
        for size_bytes, last_offset, max_timestamp_ms, relative_position in batches:
            if max_timestamp_ms > self.max_timestamp_ms:
                self.max_timestamp_ms = max_timestamp_ms
                self.offset_of_max_timestamp = last_offset
            if self.bytes_since_last_index_entry > interval_bytes:
                self.offset_index.append(last_offset, start + relative_position)
                self.time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
                self.bytes_since_last_index_entry = 0
            self.bytes_since_last_index_entry += size_bytes

    def flush(self) -> None:
        """Write pending index entries and fsync the log and both indexes."""
        self.offset_index.flush()
        self.time_index.flush()
        held = self.log_file()
        self.fs.fsync(held.fd)
        self.offset_index.fsync()
        self.time_index.fsync()
        self.txn_index.flush()

    def seal(self) -> None:
        """The segment stops being active (roll or close): record the final largest
        timestamp in the time index, as Kafka does, so a reload needs no scan. Its files
        are now open only while used (see ``segment_files``)."""
        if self.max_timestamp_ms >= 0:
            self.time_index.maybe_append(self.max_timestamp_ms, self.offset_of_max_timestamp)
        self.offset_index.flush()
        self.time_index.flush()
        if self._active:
            self._active = False
            self._open_files.opened(self)

    def make_active(self) -> None:
        """The segment takes appends: its files stay open until it is sealed or closed."""
        with self._files_lock:  # a release_files racing with this one either ran or sees it
            self._active = True
        self._open_files.forget(self)
        self.log_file()

    def close(self) -> None:
        """Let go of the files for good; a descriptor a ``FileSlice`` still holds closes
        when that slice goes."""
        with self._files_lock:
            if self.closed:
                return
            self.closed = True
        self._open_files.forget(self)
        self.offset_index.close()
        self.time_index.close()
        self._log_file = None

    # ---- descriptors ---------------------------------------------------------------------

    @property
    def fd(self) -> int:
        """The log file's descriptor: the active segment's (open until sealed), or a sealed
        one's inside ``pinned()``; anything else holds ``log_file()`` while it reads."""
        held = self._log_file
        if held is not None and self._active:  # every append: no call, no touch
            return held.fd
        return self.log_file().fd

    def log_file(self) -> SharedDescriptor:
        """The log file's descriptor, opened again from its path if the segment let go of
        it; open while the caller holds the returned object."""
        held = self._log_file
        if held is None:
            return self._reopen_log_file()
        if not self._active:
            self._open_files.touch(self)
        return held

    def _reopen_log_file(self) -> SharedDescriptor:
        with self._files_lock:
            if self.closed:
                raise KafkaStorageError(f"{self.log_path}: the segment is closed")
            path = self.log_path.with_name(self.log_path.name + DELETED_SUFFIX) \
                if self._deleted else self.log_path
            held = SharedDescriptor(self.fs, self.fs.open(path, REOPEN_FLAGS))
            self._log_file = held
            counted = not self._active
        if counted:
            self._open_files.opened(self)
        return held

    def release_files(self) -> None:
        """Let go of the descriptors of a sealed segment (they close once no slice or
        operation holds them); the next use opens them again."""
        with self._files_lock:
            if self._active:
                return
            self._log_file = None
            self.offset_index.release_file()
            self.time_index.release_file()

    @contextlib.contextmanager
    def pinned(self) -> Iterator[int]:
        """The log file's descriptor, kept open for the block (a long read: the cleaner's)."""
        self._open_files.pin(self)
        try:
            held = self.log_file()
            yield held.fd
        finally:
            self._open_files.unpin(self)

    # ---- reading -------------------------------------------------------------------------

    def _header_prefix(self, position: int) -> tuple[int, int, int]:
        """(base_offset, size_bytes, last_offset) of the batch at ``position``."""
        held = self.log_file()
        raw = os.pread(held.fd, HEADER_PREFIX_BYTES, position)
        if len(raw) < HEADER_PREFIX_BYTES:
            raise CorruptMessage(f"{self.log_path}: batch header truncated at byte {position}")
        base_offset, length, _, _, _, _, last_offset_delta = _HEADER_PREFIX.unpack(raw)
        return base_offset, length + LOG_OVERHEAD_BYTES, base_offset + last_offset_delta

    def find_batch(self, offset: int, max_position: int) -> BatchLocation | None:
        """The first batch below ``max_position`` whose last offset is >= ``offset``."""
        _, position = self.offset_index.lookup(offset)
        while position < max_position:
            base_offset, size_bytes, last_offset = self._header_prefix(position)
            if last_offset >= offset:
                return BatchLocation(position, size_bytes, base_offset, last_offset)
            position += size_bytes
        return None

    def slice(self, start: BatchLocation, max_bytes: int, max_position: int,
              min_one_batch: bool) -> FileSlice | None:
        """Whole batches from ``start`` totalling at most ``max_bytes`` (at least the first
        one when ``min_one_batch``), never past ``max_position``."""
        return self.slice_and_next(start, max_bytes, max_position, min_one_batch)[0]

    def slice_and_next(self, start: BatchLocation, max_bytes: int, max_position: int,
                       min_one_batch: bool) -> tuple[FileSlice | None, BatchLocation | None]:
        """``slice``, and the batch right after the slice when its header was read on the
        way (where a sequential reader's next read starts), else None."""
        limit = start.position + max_bytes
        following = None
        if limit >= max_position:
            end = max_position
        else:
            _, end = self.offset_index.lookup_position(limit)
            end = max(end, start.position)
            while end < limit:
                base_offset, size_bytes, last_offset = self._header_prefix(end)
                if end + size_bytes > limit:
                    following = BatchLocation(end, size_bytes, base_offset, last_offset)
                    break
                end += size_bytes
        if end == start.position:
            if not min_one_batch:
                return None, None
            end = start.position + start.size_bytes
            following = None
        held = self.log_file()
        return FileSlice(held.fd, start.position, end - start.position, held), following

    def iter_batches(self, start_position: int = 0, end_position: int | None = None):
        """Yield ``(position, header)`` for each batch header in the range (no CRC check)."""
        end = self.size_bytes if end_position is None else end_position
        position = start_position
        while position < end:
            header = self.header_at(position)
            yield position, header
            position += header.size_bytes

    def header_at(self, position: int) -> BatchHeader:
        """The batch header at ``position``; a CorruptMessage names the file and the byte."""
        try:
            held = self.log_file()
            return parse_header(os.pread(held.fd, BATCH_HEADER_BYTES, position))
        except CorruptMessage as error:
            raise CorruptMessage(f"{self.log_path}: bad record batch header at byte "
                                 f"{position}: {error}") from None

    def offset_at_or_after_timestamp(self, timestamp_ms: int, starting_offset: int,
                                     max_position: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record at or after ``starting_offset`` whose
        timestamp is >= ``timestamp_ms``, or None (Kafka's ``findOffsetByTimestamp``): the
        time index and batch headers find the batch, the compiled kernel decodes just that
        batch to find the record. Records without a timestamp (-1) never match."""
        start_offset = max(self.time_index.lookup(timestamp_ms), starting_offset)
        location = self.find_batch(start_offset, max_position)
        if location is None:
            return None
        for position, header in self.iter_batches(location.position, max_position):
            if header.max_timestamp >= timestamp_ms and header.last_offset >= starting_offset:
                found = self._first_record_at_or_after(position, header, timestamp_ms,
                                                       starting_offset)
                if found is not None:
                    return found
        return None

    def _first_record_at_or_after(self, position: int, header: BatchHeader, timestamp_ms: int,
                                  starting_offset: int) -> tuple[int, int] | None:
        held = self.log_file()
        columns = decode_columns(os.pread(held.fd, header.size_bytes, position), skip_control=True)
        if columns.offsets.size == 0:  # a control batch or a batch emptied by compaction
            return max(header.base_offset, starting_offset), header.max_timestamp
        later = np.flatnonzero((columns.timestamps_ms >= timestamp_ms)
                               & (columns.offsets >= starting_offset))
        if later.size == 0:
            return None
        first = int(later[0])
        return int(columns.offsets[first]), int(columns.timestamps_ms[first])

    def record_with_timestamp(self, offset: int, timestamp_ms: int, max_position: int
                              ) -> tuple[int, int]:
        """(offset, timestamp) of the first record carrying ``timestamp_ms`` in the batch that
        holds ``offset`` (the index records batches; ListOffsets MAX_TIMESTAMP wants the record)."""
        location = self.find_batch(offset, max_position)
        if location is None:
            return offset, timestamp_ms
        held = self.log_file()
        header = parse_header(os.pread(held.fd, BATCH_HEADER_BYTES, location.position))
        found = self._first_record_at_or_after(location.position, header, timestamp_ms,
                                               header.base_offset)
        return (offset, timestamp_ms) if found is None else found

    # ---- loading and recovery ------------------------------------------------------------

    def load_indexes(self) -> bool:
        """Load and sanity-check the index files; False (indexes cleared) when they are
        damaged and the caller must rebuild them with ``recover``."""
        try:
            self.offset_index.load(self.size_bytes)
            self.time_index.load(self._offset_upper_bound())
        except IndexCorrupt as error:
            logger.warning("rebuilding indexes of %s: %s", self.log_path, error)
            self.offset_index.clear()
            self.time_index.clear()
            return False
        last = self.time_index.last_entry()
        if last is not None:
            self.max_timestamp_ms, self.offset_of_max_timestamp = last
        return True

    def rebuild_indexes(self, sealed: bool) -> None:
        """Rebuild damaged index files from the log (a full scan of this segment). A bad
        byte in it is damage (KafkaStorageError naming the file and byte), never truncated:
        the segment may hold acknowledged, flushed records after it."""
        self.recover(0, truncate=False)
        if sealed:
            self.seal()
        self.flush()

    def adopt_indexes(self, index: IndexedBatches) -> None:
        """Give a fresh, sealed segment the index ``index_batches`` computed over its whole
        file (what ``rebuild_indexes`` would compute, without reading the file)."""
        self.apply_index(index)
        self.seal()
        self.flush()

    def _offset_upper_bound(self) -> int:
        last_offset, _ = self.offset_index.last_entry()
        return last_offset + MAX_RELATIVE_OFFSET

    def next_offset_after(self, start_position: int) -> int:
        """The offset after the last batch, walking headers (no CRC) from ``start_position``
        (a batch boundary) to the end; -1 if there is none. KafkaStorageError naming the
        file and byte for a bad header or a batch running past the end of the file."""
        next_offset = -1
        try:
            for position, header in self.iter_batches(start_position):
                if position + header.size_bytes > self.size_bytes:
                    raise KafkaStorageError(
                        f"{self.log_path}: record batch at byte {position} runs past the end "
                        f"of the file ({self.size_bytes} bytes)")
                next_offset = header.next_offset
        except CorruptMessage as error:
            raise KafkaStorageError(str(error)) from None
        return next_offset

    def _note_timestamp(self, header: BatchHeader) -> None:
        if self.first_batch_timestamp_ms is None:
            self.first_batch_timestamp_ms = header.max_timestamp
        if header.max_timestamp > self.max_timestamp_ms:
            self.max_timestamp_ms = header.max_timestamp
            self.offset_of_max_timestamp = header.last_offset

    def recover(self, start_position: int, on_batch=None, truncate: bool = True
                ) -> tuple[int, int]:
        """Validate every batch from ``start_position`` (a known batch boundary; index entries
        after it are dropped and rebuilt) and truncate at the first bad byte: a short or
        implausible header, a batch running past the end of the file, a CRC mismatch. With
        ``truncate`` False (a sealed segment, whose bytes are all below the recovery point)
        a bad byte is damage: KafkaStorageError naming the file and the byte, file unchanged.

        Returns (next offset after the last valid batch or -1 if none, bytes truncated).
        ``on_batch(header)`` is called for each valid batch (producer-state replay)."""
        self._drop_index_entries_from(start_position)
        held = self.log_file()
        file_size = self.fs.size(held.fd)
        position, next_offset = start_position, -1
        self.bytes_since_last_index_entry = self._bytes_after_last_entry(start_position)
        while position < file_size:
            length = min(RECOVERY_READ_CHUNK_BYTES, file_size - position)
            chunk = self.fs.pread(held.fd, length, position)
            consumed, next_offset, stop = self._recover_chunk(
                held, chunk, position, file_size, next_offset, on_batch)
            position += consumed
            if stop:
                break
        truncated = file_size - position
        if truncated and not truncate:
            raise KafkaStorageError(f"{self.log_path}: unreadable record batch at byte "
                                    f"{position} of {file_size} in a sealed segment")
        if truncated:
            self.fs.truncate(held.fd, position)
        self.size_bytes = position
        return next_offset, truncated

    def _recover_chunk(self, held: SharedDescriptor, chunk: bytes, chunk_start: int,
                       file_size: int, next_offset: int, on_batch) -> tuple[int, int, bool]:
        """Validate the batches in ``chunk`` and index them, in one kernel call (no Python per
        batch unless ``on_batch`` is given): (bytes consumed, next offset, stop)."""
        last_time_entry = self.time_index.last_entry()
        state = IndexState(self.bytes_since_last_index_entry, self.max_timestamp_ms,
                           self.offset_of_max_timestamp,
                           last_time_entry[0] if last_time_entry else 0,
                           last_time_entry is not None)
        scan, chunk, stop = scan_chunk(
            lambda size, position: self.fs.pread(held.fd, size, position), chunk, chunk_start,
            file_size, self.base_offset, next_offset, self.index_interval_bytes, state)
        self.apply_index(scan)
        if on_batch is not None:
            for position in scan.batch_positions.tolist():
                on_batch(parse_header(chunk, position))
        return scan.bytes_valid, scan.next_offset, stop

    def apply_index(self, scan: IndexedBatches) -> None:
        """Take the index entries and timestamp state ``index_batches`` computed (over this
        segment's bytes from where its index left off)."""
        if self.first_batch_timestamp_ms is None:
            self.first_batch_timestamp_ms = scan.first_max_timestamp_ms
        self.bytes_since_last_index_entry = scan.state.bytes_since_last_entry
        self.max_timestamp_ms = scan.state.max_timestamp_ms
        self.offset_of_max_timestamp = scan.state.offset_of_max_timestamp
        if len(scan.offset_entries):
            self.offset_index.append_entries(scan.offset_entries[:, 0],
                                             scan.offset_entries[:, 1])
        if len(scan.time_entries):
            self.time_index.append_entries(scan.time_entries[:, 0], scan.time_entries[:, 1])

    def _drop_index_entries_from(self, position: int) -> None:
        positions = self.offset_index.positions
        keep = 0
        while keep < len(positions) and positions[keep] < position:
            keep += 1
        if keep < len(positions):
            self.offset_index.truncate_to_entries(keep)
        last_offset, _ = self.offset_index.last_entry() if keep else (self.base_offset - 1, 0)
        times = self.time_index
        keep_times = 0
        while keep_times < times.entries and times.base_offset + times.relative_offsets[keep_times] <= last_offset:
            keep_times += 1
        if keep_times < times.entries:
            times.truncate_to_entries(keep_times)
        if position == 0:
            self.max_timestamp_ms, self.offset_of_max_timestamp = -1, self.base_offset
            self.first_batch_timestamp_ms = None
        else:
            self._restore_timestamps_before(position)

    def _restore_timestamps_before(self, position: int) -> None:
        self.max_timestamp_ms, self.offset_of_max_timestamp = -1, self.base_offset
        self.first_batch_timestamp_ms = None
        last = self.time_index.last_entry()
        _, indexed_position = self.offset_index.last_entry()
        if last is not None:
            self.max_timestamp_ms, self.offset_of_max_timestamp = last
            self.first_batch_timestamp_ms = self._first_batch_timestamp()
        for _, header in self.iter_batches(indexed_position, position):
            self._note_timestamp(header)

    def _first_batch_timestamp(self) -> int | None:
        for _, header in self.iter_batches(0, min(self.size_bytes, 1)):
            return header.max_timestamp
        return None

    def _bytes_after_last_entry(self, position: int) -> int:
        _, indexed_position = self.offset_index.last_entry()
        return position - indexed_position if self.offset_index.entries else position

    # ---- truncation (a follower's) -------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Drop the batch holding ``offset`` and every later one (Kafka's
        ``LogSegment.truncateTo``): the file, the index entries of dropped batches, the
        timestamps, the aborted-transaction entries whose marker is dropped. Returns the bytes
        removed (0: nothing at or after ``offset``)."""
        location = self.find_batch(offset, self.size_bytes)
        if location is None:
            return 0
        position = location.position
        truncated = self.size_bytes - position
        self._drop_index_entries_from(position)
        held = self.log_file()
        self.fs.truncate(held.fd, position)
        self.size_bytes = position
        self.bytes_since_last_index_entry = self._bytes_after_last_entry(position)
        self.txn_index.truncate_to(offset)
        return truncated

    # ---- deletion ------------------------------------------------------------------------

    def file_paths(self) -> list[Path]:
        """The segment's files; the aborted-transaction index only when it exists."""
        paths = [self.log_path, self.offset_index.path, self.time_index.path]
        if self.fs.exists(self.txn_index.path):
            paths.append(self.txn_index.path)
        return paths

    def rename_to_deleted(self) -> list[Path]:
        """Rename the three files to ``*.deleted``; open descriptors stay valid, and the log
        file is reopened under its new name."""
        renamed = []
        with self._files_lock:
            for path in self.file_paths():
                if self.fs.exists(path):
                    target = path.with_name(path.name + DELETED_SUFFIX)
                    self.fs.rename(path, target)
                    renamed.append(target)
            self._deleted = True
        return renamed

    # ---- time -----------------------------------------------------------------------------

    def last_modified_ms(self) -> int:
        """The log file's last-modified time (Kafka's ``lastModified``), read through the
        injected file system from the open descriptor, so a concurrent rename to
        ``.deleted`` cannot make it fail."""
        held = self.log_file()
        return self.fs.fd_mtime_ms(held.fd)

    def largest_timestamp_ms(self) -> int:
        """Kafka's ``largestTimestamp``: the largest batch timestamp if any batch has a valid
        one (>= 0), else the file's last-modified time -- never -1 read as 1970, so records
        without timestamps age from when they were written."""
        if self.max_timestamp_ms >= 0:
            return self.max_timestamp_ms
        return self.last_modified_ms()

    def first_batch_timestamp(self) -> int | None:
        """The first batch's max timestamp (Kafka's ``rollingBasedTimestamp``), read from the
        file once and remembered; None while the segment is empty. May be -1."""
        if self.first_batch_timestamp_ms is None and self.size_bytes:
            self.first_batch_timestamp_ms = self._first_batch_timestamp()
        return self.first_batch_timestamp_ms
