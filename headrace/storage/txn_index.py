"""The aborted-transaction index of one segment: ``<20-digit base offset>.txnindex``, as
Kafka's ``TransactionIndex``.

Owns the entries (Kafka's ``AbortedTxn``) of the transactions whose abort marker lies in the
segment, in marker order. File format: entries of 34 bytes, big-endian, no header::

    version int16 (0), producer_id int64, first_offset int64, last_offset int64,
    last_stable_offset int64

``first_offset`` is the transaction's first data offset in the partition, ``last_offset`` its
abort marker's offset, ``last_stable_offset`` the partition's LSO once the marker was written
(the first offset of the earliest other ongoing transaction, else ``last_offset + 1``): a
read_committed fetch up to an offset may stop looking at the first entry whose
``last_stable_offset`` reaches it (``collect_aborted``). A trailing partial entry (a crash
mid-append) is ignored; recovery rewrites the entries of the replayed range (``truncate_to``,
then ``append``), so the file need not be synced before the segment is.

The file is created by the first entry; each append opens, writes and closes it (aborts are
rare next to appends, and a segment then holds no extra descriptor); ``flush`` fsyncs it
after appends.

Thread-safety: one writer (under the owning log's lock); readers on any thread see the
entries as an immutable tuple, replaced whole on each change. Loading the file and changing
the entries take the index's own lock, so a reader's first load never overwrites an entry
the writer has just added.
"""

from __future__ import annotations

import os
import struct
import threading
from dataclasses import dataclass
from pathlib import Path

from headrace.storage.fs import FileSystem, read_whole_file, write_file_atomically

TXN_INDEX_SUFFIX = ".txnindex"
ABORTED_TXN_VERSION = 0
_ENTRY = struct.Struct(">hqqqq")
ABORTED_TXN_BYTES = _ENTRY.size  # 34
_APPEND_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT


@dataclass(frozen=True, slots=True)
class AbortedTxn:
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int

    def encode(self) -> bytes:
        return _ENTRY.pack(ABORTED_TXN_VERSION, self.producer_id, self.first_offset,
                           self.last_offset, self.last_stable_offset)


def decode_entries(raw: bytes) -> tuple[AbortedTxn, ...]:
    """The whole entries of a ``.txnindex`` file (a trailing partial one ignored)."""
    whole = len(raw) - len(raw) % ABORTED_TXN_BYTES
    return tuple(AbortedTxn(*fields[1:]) for fields in _ENTRY.iter_unpack(raw[:whole]))


class TransactionIndex:
    """The aborted transactions of one segment, loaded from its file at first use."""

    __slots__ = ("fs", "path", "_entries", "_unsynced", "_lock")

    def __init__(self, fs: FileSystem, path: Path) -> None:
        self.fs = fs
        self.path = path
        self._entries: tuple[AbortedTxn, ...] | None = None
        self._unsynced = False
        self._lock = threading.Lock()

    @property
    def entries(self) -> tuple[AbortedTxn, ...]:
        entries = self._entries
        if entries is None:
            with self._lock:
                entries = self._loaded_locked()
        return entries

    def _loaded_locked(self) -> tuple[AbortedTxn, ...]:
        if self._entries is None:
            raw = read_whole_file(self.fs, self.path) if self.fs.exists(self.path) else b""
            self._entries = decode_entries(raw)
        return self._entries

    def append(self, aborted: AbortedTxn) -> None:
        with self._lock:
            previous = self._loaded_locked()
            if previous and aborted.last_offset <= previous[-1].last_offset:
                raise ValueError(f"{self.path}: aborted transaction ending at "
                                 f"{aborted.last_offset} after one ending at "
                                 f"{previous[-1].last_offset}")
            fd = self.fs.open(self.path, _APPEND_FLAGS)
            try:
                self.fs.write(fd, aborted.encode())
            finally:
                self.fs.close(fd)
            self._entries = previous + (aborted,)
            self._unsynced = True

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker lies at or after ``offset`` (recovery replays them)."""
        entries = self.entries
        kept = tuple(entry for entry in entries if entry.last_offset < offset)
        if len(kept) != len(entries) or (not kept and self.fs.exists(self.path)):
            self.replace(kept)

    def replace(self, entries: tuple[AbortedTxn, ...]) -> None:
        """Rewrite the file to hold exactly ``entries`` (durably; removed when empty)."""
        with self._lock:
            if entries:
                write_file_atomically(self.fs, self.path,
                                      b"".join(e.encode() for e in entries))
            elif self.fs.exists(self.path):
                self.fs.remove(self.path)
            self._entries = entries
            self._unsynced = False

    def flush(self) -> None:
        if self._unsynced:
            fd = self.fs.open(self.path, os.O_RDONLY)
            try:
                self.fs.fsync(fd)
            finally:
                self.fs.close(fd)
            self._unsynced = False

    def collect_aborted(self, fetch_offset: int, upper_bound_offset: int
                        ) -> tuple[list[AbortedTxn], bool]:
        """The entries overlapping [fetch_offset, upper_bound_offset) and whether the search
        is complete (an entry's last stable offset reached the bound: no later segment can
        hold one that matters), as Kafka's ``collectAbortedTxns``."""
        found = []
        for entry in self.entries:
            if entry.last_offset >= fetch_offset and entry.first_offset < upper_bound_offset:
                found.append(entry)
            if entry.last_stable_offset >= upper_bound_offset:
                return found, True
        return found, False
