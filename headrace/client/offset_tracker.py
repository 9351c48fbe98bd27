"""Per-partition offset tracking for an at-least-once parallel consumer, in ranges.

Owns the answer to one question (seed 003, "Offset Management"): for a partition, which offset
may be committed so that every record below it has been processed? Records are fetched in
increasing offsets with gaps (compaction and transaction markers leave holes) and completed in
any order.

Each fetched record owns a *slot*: the half-open offset range from one past the previously
fetched record (or its own offset, for the first record fetched) to one past itself. Slots tile
the fetched offsets without holes, so a run of records fetched one after another is a single
range however many gaps it spans, and completing it costs O(1): done ranges are kept as two
dicts (start -> end, end -> start) that merge neighbours on insert, and a low mark advances over
ranges that touch it. The committable offset is that mark: one past the last record of the
all-done prefix (or the first fetched offset), Kafka's convention that a committed offset is
the *next* record to read. It may name a gap offset; a fetch from there returns the next record.

Completed ranges above the mark ("done but not yet committable") can travel in the commit's
metadata string so that a restarted consumer skips them, as Confluent's Java Parallel Consumer
does. Format of that string::

    hr1:<base64 of zlib(bitmap)>

where bit ``i`` (little-endian bit order within a little-endian integer) set means offset
``committed_offset + 1 + i`` is done (gap offsets inside a done range are set too: they hold no
record). The committed offset itself is never done (else it would not be the committed offset).
The string must fit Kafka's ``offset.metadata.max.bytes`` (default 4096); when it would not,
the commit carries no metadata and the restarted consumer simply reprocesses those records
(still at-least-once).

Thread-safety: none. ``PartitionOffsets`` is guarded by the caller's lock (the work scheduler's).
"""

from __future__ import annotations

import base64
import binascii
import zlib
from bisect import bisect_right
from collections.abc import Iterable

from headrace.coordinator.config import COORDINATOR_CONFIGS

METADATA_PREFIX = "hr1:"
# Kafka broker's offset.metadata.max.bytes default
OFFSET_METADATA_MAX_BYTES_DEFAULT = COORDINATOR_CONFIGS["offset.metadata.max.bytes"].default
_ALL_SET, _NONE_SET = 0xFF, 0x00

OffsetRange = tuple[int, int]  # [start, end): end exclusive


def encode_done_ranges(committed_offset: int, done_ranges: Iterable[OffsetRange]) -> str:
    """The commit metadata string recording the ``done_ranges`` (all above committed_offset)."""
    bitmap = 0
    for start, end in done_ranges:
        if start <= committed_offset:
            raise ValueError(f"done offset {start} is not above committed {committed_offset}")
        bitmap |= ((1 << (end - start)) - 1) << (start - committed_offset - 1)
    if not bitmap:
        return ""
    raw = bitmap.to_bytes((bitmap.bit_length() + 7) // 8, "little")
    return METADATA_PREFIX + base64.b64encode(zlib.compress(raw)).decode("ascii")


def decode_done_ranges(committed_offset: int, metadata: str | None) -> list[OffsetRange]:
    """The done ranges recorded by ``encode_done_ranges``, sorted and maximal; empty for foreign
    or corrupt metadata. Runs of whole 0x00/0xFF bytes are skipped bytewise."""
    if not metadata or not metadata.startswith(METADATA_PREFIX):
        return []
    try:
        raw = zlib.decompress(base64.b64decode(metadata[len(METADATA_PREFIX) :], validate=True))
    except (binascii.Error, zlib.error, ValueError):
        return []
    ranges: list[OffsetRange] = []
    run_start: int | None = None
    base = committed_offset + 1
    for byte_index, byte in enumerate(raw):
        if byte == _ALL_SET and run_start is not None:
            continue
        if byte == _NONE_SET and run_start is None:
            continue
        for bit in range(8):
            offset = base + byte_index * 8 + bit
            if byte >> bit & 1:
                if run_start is None:
                    run_start = offset
            elif run_start is not None:
                ranges.append((run_start, offset))
                run_start = None
    if run_start is not None:
        ranges.append((run_start, base + len(raw) * 8))
    return ranges


class SkipRanges:
    """Offsets a previous owner recorded as done; queried with increasing offsets."""

    __slots__ = ("_ranges", "_starts", "_last_end")

    def __init__(self, ranges: Iterable[OffsetRange] = ()) -> None:
        self._ranges = sorted(ranges)
        self._starts = [start for start, _ in self._ranges]
        self._last_end = self._ranges[-1][1] if self._ranges else None

    def active_below(self, offset: int) -> bool:
        """True while some skip range ends above ``offset`` (else every check is False)."""
        return self._last_end is not None and offset < self._last_end

    def contains(self, offset: int) -> bool:
        index = bisect_right(self._starts, offset) - 1
        return index >= 0 and offset < self._ranges[index][1]


class PartitionOffsets:
    """Fetched, done and committable offsets of one assigned partition; see the module doc."""

    __slots__ = ("_mark", "_next_fetch_offset", "_done_by_start", "_done_by_end", "skip")

    def __init__(self, skip_ranges: Iterable[OffsetRange] = ()) -> None:
        self._mark: int | None = None  # every slot below is done; None before any fetch
        self._next_fetch_offset: int | None = None
        self._done_by_start: dict[int, int] = {}  # done ranges above the mark
        self._done_by_end: dict[int, int] = {}
        self.skip = SkipRanges(skip_ranges)

    def register_fetched(self, first_offset: int, last_offset: int) -> int:
        """Records ``first_offset``..``last_offset`` (in fetch order, gaps allowed) were fetched;
        returns the slot start of the first of them."""
        next_fetch = self._next_fetch_offset
        if next_fetch is None:
            self._mark = next_fetch = first_offset
        elif first_offset < next_fetch:
            raise ValueError(f"offset {first_offset} fetched after {next_fetch - 1}")
        if last_offset < first_offset:
            raise ValueError(f"fetched range {first_offset}..{last_offset} is reversed")
        self._next_fetch_offset = last_offset + 1
        return next_fetch

    def mark_done(self, start: int, end: int) -> None:
        """The slots in [start, end) are done (a run of consecutively fetched records)."""
        if start >= end:
            return
        if start == self._mark:
            self._advance_mark(end)
            return
        by_start, by_end = self._done_by_start, self._done_by_end
        right_end = by_start.pop(end, None)
        if right_end is not None:
            del by_end[right_end]
            end = right_end
        left_start = by_end.pop(start, None)
        if left_start is not None:
            start = left_start
        by_start[start] = end
        by_end[end] = start

    def _advance_mark(self, mark: int) -> None:
        by_start = self._done_by_start
        while mark in by_start:
            end = by_start.pop(mark)
            del self._done_by_end[end]
            mark = end
        self._mark = mark

    def committable_offset(self) -> int | None:
        """The offset to commit now, or None before anything was fetched."""
        return self._mark

    def done_ranges_above_mark(self) -> list[OffsetRange]:
        return sorted(self._done_by_start.items())

    def commit_metadata(self, offset_metadata_max_bytes: int) -> str:
        """Encoded done-above-committable ranges, or "" when none or too large."""
        if self._mark is None or not self._done_by_start:
            return ""
        encoded = encode_done_ranges(self._mark, self._done_by_start.items())
        return encoded if len(encoded.encode()) <= offset_metadata_max_bytes else ""
