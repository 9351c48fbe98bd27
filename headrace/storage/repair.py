"""Offline repair of a stopped broker's partition logs (``headrace repair``).

Finds the first damage in a partition directory (``<topic>-<partition>/``, segment files as in
``segment``) that would take it offline at start-up, and repairs it the way an operator chooses:

- a bad byte in a segment (a CRC mismatch, a torn or implausible header, a batch running past
  the end of the file), found by a CRC scan of every segment with the kernel's
  ``index_batches`` (``segment.scan_chunk``): the segment is truncated before the bad batch,
  its index files are removed (the broker rebuilds them) and the later segments are deleted;
- a gap between segments (a segment's next offset below the next segment's base offset, in a
  log that is not compacted): the later segments are deleted, or with ``accept_gaps`` the gap
  is recorded in the partition's ``accepted-gaps`` file (``log.accept_gap``) and kept;
- an overlap (a next offset above the next segment's base): the later segments are deleted.

``find_damage`` only reads; ``repair_partition`` changes files only when not ``dry_run``.
Not thread-safe, and never to be run on the directory of a running broker.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from headrace.errors import CorruptMessage, KafkaStorageError
from headrace.storage.fs import FileSystem
from headrace.storage.log_loader import accept_gap, read_accepted_gaps
from headrace.storage.segment import (
    INDEX_SUFFIX,
    LOG_SUFFIX,
    RECOVERY_READ_CHUNK_BYTES,
    TIME_INDEX_SUFFIX,
    scan_chunk,
)
from headrace.storage.segment_io import IndexState

# Written into a partition directory by the broker when its scrub finds damage there (the
# reason, UTF-8): the partition stays offline at later starts, even after a clean shutdown
# (which skips the CRC scan of sealed segments), until a repair removes it.
SCRUB_DAMAGE_MARK_FILE = "scrub-damage"
NO_INDEX_INTERVAL_BYTES = 2**62  # the scan computes no index entries


@dataclass(frozen=True, slots=True)
class SegmentScan:
    """One segment file's CRC scan: its valid prefix and the offset after it."""

    path: Path
    base_offset: int
    size_bytes: int
    valid_bytes: int
    next_offset: int  # offset after the last valid batch; the base offset if none


@dataclass(frozen=True, slots=True)
class Damage:
    """The first damage of a partition: ``kind`` is "bad batch", "gap" or "overlap";
    ``segment`` is the last segment to keep (cut to ``keep_bytes`` for a bad batch)."""

    kind: str
    segment: SegmentScan
    keep_bytes: int
    later: tuple[Path, ...]  # the log files of the segments after it
    description: str


def segment_bases(fs: FileSystem, partition_dir: Path) -> list[int]:
    names = fs.listdir(partition_dir)
    return sorted(int(name[: -len(LOG_SUFFIX)]) for name in names
                  if name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit())


def scan_segment(fs: FileSystem, path: Path, base_offset: int) -> SegmentScan:
    """CRC-scan the whole segment file, reading it only."""
    fd = fs.open(path, os.O_RDONLY)
    try:
        file_size = fs.size(fd)
        position, next_offset = 0, -1
        state = IndexState(0, -1, base_offset, 0, False)
        while position < file_size:
            chunk = fs.pread(fd, min(RECOVERY_READ_CHUNK_BYTES, file_size - position), position)
            try:
                scan, _, stop = scan_chunk(lambda size, at: fs.pread(fd, size, at), chunk,
                                           position, file_size, base_offset, next_offset,
                                           NO_INDEX_INTERVAL_BYTES, state)
            except CorruptMessage:
                break
            position, next_offset, state = position + scan.bytes_valid, scan.next_offset, scan.state
            if stop:
                break
    finally:
        fs.close(fd)
    return SegmentScan(path, base_offset, file_size, position, max(next_offset, base_offset))


def find_damage(fs: FileSystem, partition_dir: Path, compacted: bool,
                accepted_gaps: set[tuple[int, int]] | None = None) -> Damage | None:
    """The first damage of the partition's log, or None. ``compacted`` logs may have gaps;
    gaps in ``accepted_gaps`` (default: the partition's ``accepted-gaps`` file) are not damage."""
    accepted = read_accepted_gaps(fs, partition_dir) if accepted_gaps is None else accepted_gaps
    bases = segment_bases(fs, partition_dir)
    paths = [partition_dir / f"{base:020d}{LOG_SUFFIX}" for base in bases]
    for index, (base, path) in enumerate(zip(bases, paths, strict=True)):
        scan = scan_segment(fs, path, base)
        later = tuple(paths[index + 1:])
        if scan.valid_bytes < scan.size_bytes:
            return Damage("bad batch", scan, scan.valid_bytes, later,
                          f"{path}: unreadable record batch at byte {scan.valid_bytes} of "
                          f"{scan.size_bytes} (offsets from {scan.next_offset} on)")
        if not later:
            return None
        following = bases[index + 1]
        if scan.next_offset > following:
            return Damage("overlap", scan, scan.size_bytes, later,
                          f"overlap: {path} ends at offset {scan.next_offset} but "
                          f"{later[0].name} starts at {following}")
        if scan.next_offset < following and not compacted and \
                (scan.next_offset, following) not in accepted:
            return Damage("gap", scan, scan.size_bytes, later,
                          f"gap: {path} ends at offset {scan.next_offset} but "
                          f"{later[0].name} starts at {following} (offsets "
                          f"{scan.next_offset}..{following - 1} are missing)")
    return None


def repair_partition(fs: FileSystem, partition_dir: Path, compacted: bool, accept_gaps: bool,
                     dry_run: bool) -> list[str]:
    """Repair every damage of the partition, first to last (or, with ``dry_run``, say what
    would be done and change nothing). Returns one line per damage: what was found and what
    was (would be) done."""
    lines: list[str] = []
    assumed_gaps = read_accepted_gaps(fs, partition_dir)  # plus those a dry run would accept
    previous: Damage | None = None
    while (damage := find_damage(fs, partition_dir, compacted, assumed_gaps)) is not None:
        if damage == previous:
            raise KafkaStorageError(f"repair made no progress: {damage.description}")
        previous = damage
        verb = "would" if dry_run else "did"
        if damage.kind == "gap" and accept_gaps:
            gap = (damage.segment.next_offset, int(damage.later[0].name[: -len(LOG_SUFFIX)]))
            lines.append(f"{damage.description}; {verb} accept the gap")
            assumed_gaps.add(gap)
            if not dry_run:
                accept_gap(fs, partition_dir, *gap)
            continue
        lines.append(f"{damage.description}; {verb} {_truncation(damage)}")
        if dry_run:
            break  # what follows the damage goes with it
        _truncate(fs, damage)
    mark = partition_dir / SCRUB_DAMAGE_MARK_FILE
    if fs.exists(mark):
        lines.append(f"{mark}: the broker's scrub mark; {'would' if dry_run else 'did'} "
                     "remove it")
        if not dry_run:
            fs.remove(mark)
            fs.fsync_dir(partition_dir)
    return lines


def _truncation(damage: Damage) -> str:
    scan = damage.segment
    action = (f"truncate {scan.path.name} to {damage.keep_bytes} bytes (log end offset "
              f"{scan.next_offset})" if damage.keep_bytes < scan.size_bytes
              else f"keep {scan.path.name} whole (log end offset {scan.next_offset})")
    if damage.later:
        action += f" and delete the {len(damage.later)} later segment(s) " + \
            ", ".join(path.name for path in damage.later)
    return action


def _truncate(fs: FileSystem, damage: Damage) -> None:
    scan = damage.segment
    for log_path in damage.later:
        for path in _segment_paths(log_path):
            if fs.exists(path):
                fs.remove(path)
    if damage.keep_bytes < scan.size_bytes:
        fd = fs.open(scan.path, os.O_WRONLY)
        try:
            fs.truncate(fd, damage.keep_bytes)
            fs.fsync(fd)
        finally:
            fs.close(fd)
        for path in _segment_paths(scan.path)[1:]:  # rebuilt by the broker at its next start
            if fs.exists(path):
                fs.remove(path)
    fs.fsync_dir(scan.path.parent)


def _segment_paths(log_path: Path) -> list[Path]:
    stem = log_path.name[: -len(LOG_SUFFIX)]
    return [log_path] + [log_path.with_name(stem + suffix)
                         for suffix in (INDEX_SUFFIX, TIME_INDEX_SUFFIX)]
