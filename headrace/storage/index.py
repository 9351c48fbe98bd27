"""Sparse offset and time indexes of one log segment, in Kafka's file formats.

``<base>.index``: 8-byte entries, big-endian ``int32 relative_offset, int32 position`` --
the byte position in ``<base>.log`` of the batch whose base offset is
``base_offset + relative_offset``. One entry per ``index.interval.bytes`` of log.

``<base>.timeindex``: 12-byte entries, big-endian ``int64 timestamp, int32 relative_offset`` --
the largest timestamp seen so far in the segment and the offset it was seen at; entries are
added only when that largest timestamp grows.

Design choice (documented per the issue): indexes are plain files, not preallocated mmaps.
The entries live in memory in ``array`` columns (bisect works on them directly; appending
never invalidates a concurrent reader, unlike a resized buffer) and are appended to the file
on ``flush``; the file therefore always has exactly ``entries * entry_size`` bytes, so
nothing needs trimming on roll or close. ``segment.index.bytes`` bounds the entry count
(``max_entries``); a full index rolls the segment, as in Kafka.

The file's descriptor is opened with the index and let go of by ``release_file`` (a sealed
segment closing its files under the open-segment budget, see ``segment_files``); the next
load, flush or truncation opens it again. Lookups never touch the file.

Thread-safety: one writer (the log's append lock); any number of readers may call ``lookup``
concurrently -- they see a prefix of the entries, which is always a valid index.
``release_file`` may come from any thread: an operation holds the descriptor it uses.
"""

from __future__ import annotations

import bisect
import os
import struct
import sys
from array import array
from pathlib import Path

import numpy as np

from headrace.errors import KafkaStorageError
from headrace.protocol.batch import NO_TIMESTAMP
from headrace.storage.fs import FileSystem
from headrace.storage.segment_files import SharedDescriptor

OFFSET_ENTRY_BYTES = 8
TIME_ENTRY_BYTES = 12
_TIME_ENTRY = struct.Struct(">qi")
_TIME_ENTRY_DTYPE = np.dtype([("timestamp", ">i8"), ("relative_offset", ">i4")])
_NEEDS_BYTESWAP = sys.byteorder == "little"


class IndexCorrupt(Exception):
    """An index file failed its sanity check; the caller rebuilds it from the log."""


class _IndexFile:
    """Appends pending entries to a plain file on flush. Its descriptor is opened when the
    file is created (``__init__``) and again at the next use after ``release`` (a sealed
    segment letting go of its files); each operation holds it while it runs."""

    def __init__(self, fs: FileSystem, path: Path, entry_bytes: int) -> None:
        self.fs = fs
        self.path = path
        self.entry_bytes = entry_bytes
        self._descriptor: SharedDescriptor | None = SharedDescriptor(
            fs, fs.open(path, os.O_RDWR | os.O_CREAT))
        self._closed = False
        self.persisted_entries = 0

    def descriptor(self) -> SharedDescriptor:
        held = self._descriptor
        if held is None:
            if self._closed:
                raise KafkaStorageError(f"{self.path} is closed")
            held = self._descriptor = SharedDescriptor(self.fs,
                                                       self.fs.open(self.path, os.O_RDWR))
        return held

    def read_all(self) -> bytes:
        held = self.descriptor()
        size_bytes = self.fs.size(held.fd)
        return self.fs.pread(held.fd, size_bytes, 0) if size_bytes else b""

    def write_pending(self, encoded_entries: bytes, total_entries: int) -> None:
        if encoded_entries:
            held = self.descriptor()
            os.lseek(held.fd, self.persisted_entries * self.entry_bytes, os.SEEK_SET)
            self.fs.write(held.fd, encoded_entries)
        self.persisted_entries = total_entries

    def reset(self, entries: int) -> None:
        self.fs.truncate(self.descriptor().fd, entries * self.entry_bytes)
        self.persisted_entries = entries

    def fsync(self) -> None:
        held = self.descriptor()
        self.fs.fsync(held.fd)

    def release(self) -> None:
        """Let go of the descriptor (it closes once no operation holds it)."""
        self._descriptor = None

    def close(self) -> None:
        self._closed = True
        self._descriptor = None


class OffsetIndex:
    """Maps offsets to byte positions in the segment's log file."""

    def __init__(self, fs: FileSystem, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // OFFSET_ENTRY_BYTES)
        self.relative_offsets = array("i")
        self.positions = array("i")
        self._file = _IndexFile(fs, path, OFFSET_ENTRY_BYTES)

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def entries(self) -> int:
        return len(self.positions)

    @property
    def is_full(self) -> bool:
        return len(self.positions) >= self.max_entries

    def load(self, log_size_bytes: int) -> None:
        """Read the file and sanity-check it (Kafka's ``sanityCheck``): whole entries,
        strictly increasing offsets and positions, positions inside the log."""
        raw = self._file.read_all()
        if len(raw) % OFFSET_ENTRY_BYTES:
            raise IndexCorrupt(f"{self.path}: size {len(raw)} is not a multiple of 8")
        columns = array("i", raw)
        if _NEEDS_BYTESWAP:
            columns.byteswap()
        relative_offsets, positions = columns[0::2], columns[1::2]
        for column in (relative_offsets, positions):
            if any(column[i] >= column[i + 1] for i in range(len(column) - 1)):
                raise IndexCorrupt(f"{self.path}: entries are not increasing")
        if positions and (positions[0] < 0 or positions[-1] >= max(log_size_bytes, 1)):
            raise IndexCorrupt(f"{self.path}: position beyond the log size {log_size_bytes}")
        if relative_offsets and relative_offsets[0] < 0:
            raise IndexCorrupt(f"{self.path}: negative relative offset")
        self.relative_offsets, self.positions = relative_offsets, positions
        self._file.persisted_entries = len(positions)

    def truncate_to_entries(self, entries: int) -> None:
        del self.relative_offsets[entries:]
        del self.positions[entries:]
        self._file.reset(entries)

    def clear(self) -> None:
        self.truncate_to_entries(0)

    def append(self, offset: int, position: int) -> None:
        self.relative_offsets.append(offset - self.base_offset)
        self.positions.append(position)

    def append_entries(self, offsets: np.ndarray, positions: np.ndarray) -> None:
        """Append entries in bulk (int64 columns; each offset and position increasing), as
        ``segment_io.index_batches`` computes them for a recovered or cleaned segment."""
        self.relative_offsets.frombytes((offsets - self.base_offset).astype(np.int32).tobytes())
        self.positions.frombytes(positions.astype(np.int32).tobytes())

    def lookup(self, offset: int) -> tuple[int, int]:
        """The (offset, position) of the last entry at or below ``offset``, or the segment
        start when there is none."""
        count = len(self.positions)
        slot = bisect.bisect_right(self.relative_offsets, offset - self.base_offset, 0, count) - 1
        if slot < 0:
            return self.base_offset, 0
        return self.base_offset + self.relative_offsets[slot], self.positions[slot]

    def lookup_position(self, position: int) -> tuple[int, int]:
        """The (offset, position) of the last entry whose position is <= ``position``."""
        count = len(self.positions)
        slot = bisect.bisect_right(self.positions, position, 0, count) - 1
        if slot < 0:
            return self.base_offset, 0
        return self.base_offset + self.relative_offsets[slot], self.positions[slot]

    def last_entry(self) -> tuple[int, int]:
        if not self.positions:
            return self.base_offset, 0
        return self.base_offset + self.relative_offsets[-1], self.positions[-1]

    def flush(self) -> None:
        start = self._file.persisted_entries
        count = len(self.positions)
        if start >= count:
            return
        pairs = array("i", bytes(8 * (count - start)))
        pairs[0::2] = self.relative_offsets[start:count]
        pairs[1::2] = self.positions[start:count]
        if _NEEDS_BYTESWAP:
            pairs.byteswap()
        self._file.write_pending(pairs.tobytes(), count)

    def fsync(self) -> None:
        self._file.fsync()

    def release_file(self) -> None:
        """Let go of the file's descriptor until the next use (entries stay in memory)."""
        self._file.release()

    def close(self) -> None:
        self._file.close()


class TimeIndex:
    """Maps timestamps to the first offset at which the segment's largest timestamp reached
    them."""

    def __init__(self, fs: FileSystem, path: Path, base_offset: int, max_index_bytes: int) -> None:
        self.base_offset = base_offset
        self.max_entries = max(1, max_index_bytes // TIME_ENTRY_BYTES)
        self.timestamps = array("q")
        self.relative_offsets = array("i")
        self._file = _IndexFile(fs, path, TIME_ENTRY_BYTES)

    @property
    def path(self) -> Path:
        return self._file.path

    @property
    def entries(self) -> int:
        return len(self.timestamps)

    @property
    def is_full(self) -> bool:
        return len(self.timestamps) >= self.max_entries

    def load(self, next_offset: int) -> None:
        raw = self._file.read_all()
        if len(raw) % TIME_ENTRY_BYTES:
            raise IndexCorrupt(f"{self.path}: size {len(raw)} is not a multiple of 12")
        timestamps, relative_offsets = array("q"), array("i")
        for timestamp, relative_offset in _TIME_ENTRY.iter_unpack(raw):
            if timestamps and (timestamp <= timestamps[-1] or relative_offset < relative_offsets[-1]):
                raise IndexCorrupt(f"{self.path}: entries are not increasing")
            timestamps.append(timestamp)
            relative_offsets.append(relative_offset)
        if relative_offsets and self.base_offset + relative_offsets[-1] >= max(next_offset, 1):
            raise IndexCorrupt(f"{self.path}: offset beyond the log end {next_offset}")
        self.timestamps, self.relative_offsets = timestamps, relative_offsets
        self._file.persisted_entries = len(timestamps)

    def truncate_to_entries(self, entries: int) -> None:
        del self.timestamps[entries:]
        del self.relative_offsets[entries:]
        self._file.reset(entries)

    def clear(self) -> None:
        self.truncate_to_entries(0)

    def maybe_append(self, timestamp_ms: int, offset: int) -> None:
        """Add an entry if ``timestamp_ms`` is larger than the last one, or for the first
        entry larger than NO_TIMESTAMP (Kafka's ``maybeAppend``: an empty index's last entry
        is ``(-1, base offset)``), so a batch without timestamps never gets an entry."""
        if timestamp_ms <= (self.timestamps[-1] if self.timestamps else NO_TIMESTAMP):
            return
        self.timestamps.append(timestamp_ms)
        self.relative_offsets.append(offset - self.base_offset)

    def append_entries(self, timestamps_ms: np.ndarray, offsets: np.ndarray) -> None:
        """Append entries in bulk (int64 columns; timestamps increasing and above the last
        entry's), as ``segment_io.index_batches`` computes them."""
        self.timestamps.frombytes(timestamps_ms.astype(np.int64).tobytes())
        self.relative_offsets.frombytes((offsets - self.base_offset).astype(np.int32).tobytes())

    def lookup(self, timestamp_ms: int) -> int:
        """The offset of the last entry whose timestamp is < ``timestamp_ms`` (the batches
        before it cannot hold a timestamp >= ``timestamp_ms``), or the segment base."""
        count = len(self.timestamps)
        slot = bisect.bisect_left(self.timestamps, timestamp_ms, 0, count) - 1
        if slot < 0:
            return self.base_offset
        return self.base_offset + self.relative_offsets[slot]

    def last_entry(self) -> tuple[int, int] | None:
        if not self.timestamps:
            return None
        return self.timestamps[-1], self.base_offset + self.relative_offsets[-1]

    def flush(self) -> None:
        start = self._file.persisted_entries
        count = len(self.timestamps)
        if start >= count:
            return
        entries = np.empty(count - start, _TIME_ENTRY_DTYPE)
        entries["timestamp"] = self.timestamps[start:count]
        entries["relative_offset"] = self.relative_offsets[start:count]
        self._file.write_pending(entries.tobytes(), count)

    def fsync(self) -> None:
        self._file.fsync()

    def release_file(self) -> None:
        """Let go of the file's descriptor until the next use (entries stay in memory)."""
        self._file.release()

    def close(self) -> None:
        self._file.close()
