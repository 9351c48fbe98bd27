"""Background scrub of sealed segments: CRC-32C verification of every batch at rest.

Owns ``verify_segment`` (one sealed segment's file, read as the cleaner reads: chunks through
``segment_io.read_chunk``, from an ``O_DIRECT`` descriptor unless the chunk is in the page cache,
so a scrub does not fill the page cache; every batch validated by the kernel's
``index_batches`` as recovery does) and ``Scrubber`` (one pass over the sealed segments of
the given logs, reporting the first bad byte of a damaged segment). Kafka checks CRCs only at
recovery; a bit flipped in a sealed segment later would be served as is. The scrub finds it
and the caller (``headrace.broker.scrub_service``) takes the partition offline through the
log manager's failed-log mechanism.

A segment is read through a descriptor of its own, opened from its path, never the log's, and
never under the log's lock: a segment deleted (retention, DeleteRecords) or replaced (a
cleaning's swap) meanwhile is either gone (skipped) or read whole as it was. Damage is only
reported while the segment is still one of the log's sealed segments.

Thread-safety: a ``Scrubber`` is used by one thread (the broker's ``hr-scrub``); ``status``
may be read from any thread (a dict replaced whole).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from headrace.errors import CorruptMessage
from headrace.storage.clock import Clock
from headrace.storage.fs import FileSystem
from headrace.storage.log import Log
from headrace.storage.repair import NO_INDEX_INTERVAL_BYTES
from headrace.storage.segment import LogSegment, scan_chunk
from headrace.storage.segment_io import (
    DIRECT_READ_SLACK_BYTES,
    IndexState,
    aligned_buffer,
    read_chunk,
)

logger = logging.getLogger(__name__)

SCRUB_CHUNK_BYTES = 1024 * 1024  # one read; small enough for fine-grained throttling


@dataclass(frozen=True, slots=True)
class SegmentDamage:
    """The first bad byte of a sealed segment's log file."""

    path: Path
    position: int
    size_bytes: int


@dataclass(frozen=True, slots=True)
class PartitionScrub:
    """The last complete pass over one partition's sealed segments."""

    last_pass_ms: int
    segments: int
    bytes_verified: int


def _open_direct(fs: FileSystem, path: Path) -> int:
    try:
        return fs.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return -1  # no O_DIRECT here: buffered reads only


def verify_segment(fs: FileSystem, path: Path, base_offset: int, buffer: bytearray,
                   on_bytes: Callable[[int], None],
                   stopped: Callable[[], bool] = lambda: False
                   ) -> tuple[int, SegmentDamage | None]:
    """CRC-verify every batch of the segment file at ``path``; ``on_bytes(n)`` after each
    chunk (the throttle); ``stopped()`` before each chunk ends the verification early
    (no damage). Returns the bytes found valid and the first bad byte (None for a healthy
    or stopped segment). Raises ``FileNotFoundError``
    when the file is gone (the caller skips it)."""
    fd = fs.open(path, os.O_RDONLY)
    direct_fd = _open_direct(fs, path)
    try:
        file_size = fs.size(fd)
        position, next_offset = 0, -1
        state = IndexState(0, -1, base_offset, 0, False)
        chunk_room = len(buffer) - DIRECT_READ_SLACK_BYTES
        while position < file_size:
            if stopped():
                return position, None
            chunk = read_chunk(fd, direct_fd, buffer, position,
                               min(chunk_room, file_size - position))
            try:
                scan, covered, stop = scan_chunk(
                    lambda size, at: fs.pread(fd, size, at), chunk, position, file_size,
                    base_offset, next_offset, NO_INDEX_INTERVAL_BYTES, state)
            except CorruptMessage:
                break
            on_bytes(len(covered))
            position, next_offset, state = (position + scan.bytes_valid, scan.next_offset,
                                            scan.state)
            if stop:
                break
    finally:
        if direct_fd >= 0:
            fs.close(direct_fd)
        fs.close(fd)
    damage = None if position >= file_size else SegmentDamage(path, position, file_size)
    return position, damage


class Scrubber:
    """Passes over the sealed segments of logs, verifying each batch's CRC-32C."""

    def __init__(self, fs: FileSystem, clock: Clock, on_bytes: Callable[[int], None],
                 on_damage: Callable[[Log, SegmentDamage], None],
                 stopped: Callable[[], bool] = lambda: False,
                 chunk_bytes: int = SCRUB_CHUNK_BYTES) -> None:
        self._fs = fs
        self._clock = clock
        self._on_bytes = on_bytes
        self._on_damage = on_damage
        self._stopped = stopped
        self._buffer = aligned_buffer(chunk_bytes + DIRECT_READ_SLACK_BYTES)
        self.status: dict[tuple[str, int], PartitionScrub] = {}

    def scrub_pass(self, logs: Iterable[Log]) -> int:
        """Verify every sealed segment of ``logs``; returns the damaged partitions found.
        Stops early (without recording the pass) when ``stopped()`` turns true."""
        damaged = 0
        for log in logs:
            if self._stopped():
                break
            found = self.scrub_log(log)
            damaged += found is not None
        return damaged

    def scrub_log(self, log: Log) -> SegmentDamage | None:
        """Verify ``log``'s sealed segments; the first damage found is reported (once, to
        ``on_damage``) and ends the log's pass."""
        segments, verified_bytes = log.segments[:-1], 0
        for segment in segments:
            if self._stopped():
                return None
            valid_bytes, damage = self._verify(segment)
            verified_bytes += valid_bytes
            if self._stopped():
                return None
            if damage is None:
                continue
            if segment in log.segments[:-1]:  # still sealed and served: not a swap or delete
                self._on_damage(log, damage)
                return damage
        status = dict(self.status)
        status[(log.topic, log.partition)] = PartitionScrub(
            self._clock.now_ms(), len(segments), verified_bytes)
        self.status = status
        return None

    def _verify(self, segment: LogSegment) -> tuple[int, SegmentDamage | None]:
        try:
            return verify_segment(self._fs, segment.log_path, segment.base_offset,
                                  self._buffer, self._on_bytes, self._stopped)
        except FileNotFoundError:
            return 0, None  # deleted or swapped away since the log listed it
