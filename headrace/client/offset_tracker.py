"""Per-partition offset tracking for an at-least-once parallel consumer.

Owns the answer to one question (seed 003, "Offset Management"): for a partition, which offset
may be committed so that every record below it has been processed? Records are registered in the
order they are fetched (increasing offsets, gaps allowed: compaction and transaction markers leave
holes) and completed in any order. The committable offset is the first fetched offset that is not
yet done, or one past the last fetched offset when everything fetched is done -- Kafka's
convention that a committed offset is the *next* record to read.

Completed offsets above the committable one ("done but not yet committable") can travel in the
commit's metadata string so that a restarted consumer skips them, as Confluent's Java Parallel
Consumer does. Format of that string::

    hr1:<base64 of zlib(bitmap)>

where bit ``i`` (little-endian bit order within a little-endian integer) set means offset
``committed_offset + 1 + i`` is done. The committed offset itself is never done (else it would
not be the committed offset). The string must fit Kafka's ``offset.metadata.max.bytes`` (default
4096); when it would not, the commit carries no metadata and the restarted consumer simply
reprocesses those records (still at-least-once).

Thread-safety: none. ``PartitionOffsets`` is guarded by the caller's lock (the work scheduler's).
"""

from __future__ import annotations

import base64
import binascii
import zlib
from collections import deque

METADATA_PREFIX = "hr1:"
OFFSET_METADATA_MAX_BYTES_DEFAULT = 4096  # Kafka broker's offset.metadata.max.bytes default


def encode_done_offsets(committed_offset: int, done_offsets: set[int]) -> str:
    """The commit metadata string recording ``done_offsets`` (all > committed_offset)."""
    if not done_offsets:
        return ""
    bitmap = 0
    for offset in done_offsets:
        if offset <= committed_offset:
            raise ValueError(f"done offset {offset} is not above committed {committed_offset}")
        bitmap |= 1 << (offset - committed_offset - 1)
    raw = bitmap.to_bytes((bitmap.bit_length() + 7) // 8, "little")
    return METADATA_PREFIX + base64.b64encode(zlib.compress(raw)).decode("ascii")


def decode_done_offsets(committed_offset: int, metadata: str | None) -> set[int]:
    """The done offsets recorded by ``encode_done_offsets``; empty for foreign or bad metadata."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return set()
    try:
        raw = zlib.decompress(base64.b64decode(metadata[len(METADATA_PREFIX) :], validate=True))
    except (binascii.Error, zlib.error, ValueError):
        return set()
    bitmap = int.from_bytes(raw, "little")
    done = set()
    position = 0
    while bitmap:
        if bitmap & 1:
            done.add(committed_offset + 1 + position)
        bitmap >>= 1
        position += 1
    return done


class PartitionOffsets:
    """Fetched, done and committable offsets of one assigned partition."""

    def __init__(self, skip_offsets: set[int] | None = None) -> None:
        self._pending: deque[int] = deque()  # fetched offsets, increasing, not yet below the mark
        self._done_above_mark: set[int] = set()
        self._next_fetch_offset: int | None = None
        self._skip_offsets = set(skip_offsets or ())

    def should_skip(self, offset: int) -> bool:
        """True when a previous owner recorded ``offset`` as done in its commit metadata."""
        return offset in self._skip_offsets

    def register_fetched(self, offset: int) -> None:
        if self._next_fetch_offset is not None and offset < self._next_fetch_offset:
            raise ValueError(f"offset {offset} fetched after {self._next_fetch_offset - 1}")
        self._pending.append(offset)
        self._next_fetch_offset = offset + 1
        self._skip_offsets.discard(offset)

    def mark_done(self, offset: int) -> None:
        self._done_above_mark.add(offset)
        while self._pending and self._pending[0] in self._done_above_mark:
            self._done_above_mark.discard(self._pending.popleft())

    def committable_offset(self) -> int | None:
        """The offset to commit now, or None before anything was fetched."""
        if self._pending:
            return self._pending[0]
        return self._next_fetch_offset

    def commit_metadata(self, offset_metadata_max_bytes: int) -> str:
        """Encoded done-above-committable offsets, or "" when none or too large."""
        committable = self.committable_offset()
        if committable is None or not self._done_above_mark:
            return ""
        encoded = encode_done_offsets(committable, self._done_above_mark)
        return encoded if len(encoded.encode()) <= offset_metadata_max_bytes else ""

    @property
    def incomplete_count(self) -> int:
        return len(self._pending) - len(self._done_above_mark)
