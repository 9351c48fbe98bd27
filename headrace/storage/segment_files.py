"""Open descriptors of segment files: opened when used, closed again under a budget, so a
broker with many partitions and segments does not hold one descriptor per file.

Owns ``SharedDescriptor`` (one open descriptor of a segment's ``.log``, ``.index`` or
``.timeindex`` file, shared by whoever holds the object -- the segment, a ``FileSlice`` on
its way to ``sendfile``, an operation in progress -- and closed when the last holder lets go,
so a descriptor is never closed, or its number reused, under a reader) and
``SealedSegmentFiles``: the sealed segments whose files are open, least recently used first.
When one more sealed segment opens its files and more than ``max_open_segments`` are open,
the segment used longest ago that is not pinned lets go of its descriptors (they close once
no slice or operation holds them) and reopens them from its path at its next use.

The budget: ``SEALED_SEGMENT_DESCRIPTOR_SHARE`` of the process's soft RLIMIT_NOFILE as it is
at first use (half the quarter the log manager keeps free for connections, reads and rolls),
``DESCRIPTORS_PER_SEGMENT`` per segment, at least ``MIN_OPEN_SEALED_SEGMENTS``. Active
segments keep their files open and are not counted (the log manager's descriptor check at
topic creation counts them). No files of its own.

Thread-safety: ``SealedSegmentFiles`` takes its lock to register, unregister, pin and evict;
``touch`` (on every read of a sealed segment) is a lock-free move to the end of the order, a
no-op for a segment evicted meanwhile. A ``SharedDescriptor`` is immutable.
"""

from __future__ import annotations

import contextlib
import resource
import threading
from collections import OrderedDict
from typing import Protocol

from headrace.storage.fs import FileSystem

DESCRIPTORS_PER_SEGMENT = 3  # .log, .index and .timeindex
SEALED_SEGMENT_DESCRIPTOR_SHARE = 0.125  # of the soft RLIMIT_NOFILE
MIN_OPEN_SEALED_SEGMENTS = 4
MAX_OPEN_SEALED_SEGMENTS = 100_000  # where RLIMIT_NOFILE is unlimited


class SharedDescriptor:
    """An open descriptor, closed when the last reference to this object goes."""

    __slots__ = ("fd", "_fs")

    def __init__(self, fs: FileSystem, fd: int) -> None:
        self.fd = fd
        self._fs = fs

    def __del__(self) -> None:
        try:  # no module globals: this may run while the interpreter shuts down
            self._fs.close(self.fd)
        except OSError:
            pass


class SegmentFilesOwner(Protocol):
    """What ``SealedSegmentFiles`` needs of a segment."""

    def release_files(self) -> None: ...


class SealedSegmentFiles:
    """The sealed segments with open files, in least recently used order."""

    def __init__(self, max_open_segments: int) -> None:
        self.max_open_segments = max_open_segments
        self._lock = threading.Lock()
        self._open: OrderedDict[SegmentFilesOwner, None] = OrderedDict()
        self._pins: dict[SegmentFilesOwner, int] = {}

    @property
    def open_segments(self) -> int:
        return len(self._open)

    def opened(self, segment: SegmentFilesOwner) -> None:
        """``segment`` (sealed) opened a file: it becomes the most recently used, and the
        least recently used unpinned segments beyond the budget let go of theirs."""
        with self._lock:
            self._open[segment] = None
            self._open.move_to_end(segment)
            evicted = self._evict_beyond_budget(keep=segment)
        for victim in evicted:
            victim.release_files()

    def _evict_beyond_budget(self, keep: SegmentFilesOwner) -> list[SegmentFilesOwner]:
        evicted = []
        excess = len(self._open) - self.max_open_segments
        for candidate in list(self._open):
            if excess <= 0:
                break
            if candidate is keep or self._pins.get(candidate):
                continue
            del self._open[candidate]
            evicted.append(candidate)
            excess -= 1
        return evicted

    def touch(self, segment: SegmentFilesOwner) -> None:
        """``segment`` was read: it becomes the most recently used."""
        with contextlib.suppress(KeyError):
            self._open.move_to_end(segment)

    def forget(self, segment: SegmentFilesOwner) -> None:
        """``segment`` closed or became active: no longer counted."""
        with self._lock:
            self._open.pop(segment, None)
            self._pins.pop(segment, None)

    def pin(self, segment: SegmentFilesOwner) -> None:
        """Keep ``segment``'s files open until ``unpin`` (a long read: the cleaner's)."""
        with self._lock:
            self._pins[segment] = self._pins.get(segment, 0) + 1

    def unpin(self, segment: SegmentFilesOwner) -> None:
        with self._lock:
            pins = self._pins.get(segment, 0) - 1
            if pins > 0:
                self._pins[segment] = pins
            else:
                self._pins.pop(segment, None)


def default_max_open_sealed_segments() -> int:
    """The budget from the soft RLIMIT_NOFILE now (see the module docstring)."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return MAX_OPEN_SEALED_SEGMENTS
    share = int(soft * SEALED_SEGMENT_DESCRIPTOR_SHARE) // DESCRIPTORS_PER_SEGMENT
    return min(MAX_OPEN_SEALED_SEGMENTS, max(MIN_OPEN_SEALED_SEGMENTS, share))


_sealed_segment_files: SealedSegmentFiles | None = None
_creation_lock = threading.Lock()


def sealed_segment_files() -> SealedSegmentFiles:
    """The process's ``SealedSegmentFiles``, its budget read from RLIMIT_NOFILE at first use
    (after the broker has set its limit)."""
    global _sealed_segment_files
    files = _sealed_segment_files
    if files is None:
        with _creation_lock:
            if _sealed_segment_files is None:
                _sealed_segment_files = SealedSegmentFiles(default_max_open_sealed_segments())
            files = _sealed_segment_files
    return files
