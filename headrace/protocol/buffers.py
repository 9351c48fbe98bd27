"""Byte regions reused once nothing refers to them: receive buffers and Arrow column buffers.

Owns ``RegionPool``, used by the broker for large request frames (``wire.FrameReceiver``) and
by the Spark source for Fetch responses and the Arrow columns decoded from them. Fresh
multi-MiB buffers cost a page fault per 4 KiB page (glibc serves them with mmap and unmaps them
when freed), which measured as much as decoding a Fetch response itself. A pool hands out
``bytearray`` regions and takes one back for reuse only when its sole remaining reference is
the pool's own -- that is, when every memoryview, Arrow buffer and record batch made from it
has been released (CPython reference counts; exporting a buffer holds a reference). So nothing
handed out is ever overwritten while in use, whoever keeps it and for however long; a region
still referenced is simply not reused, and the pool allocates another (keeping at most
``max_regions``, none larger than ``max_kept_region_bytes`` and at most ``max_kept_bytes`` in
all, when those are given).

A pool made with ``lazily_committed=True`` allocates anonymous private mappings (``mmap``)
instead of ``bytearray``s: only the pages written are resident (a ``bytearray`` is zeroed, so
committed, whole at once), so a region taken for a frame that announced 100 MiB costs the
memory of the bytes received into it, not of the announcement. Transparent huge pages are
refused for them (``MADV_NOHUGEPAGE``), so one byte written commits one page, not 2 MiB. Fresh
mappings cost a page fault per page written; reused ones do not.

Pools are meant to live as long as the process (a Spark Python worker runs task after task), so
a task's first responses reuse the regions of the one before; ``take`` is thread-safe (a lock),
and any thread may release what it handed out. Memory kept: at most ``max_regions`` regions,
of which only the pages ever written are resident.
"""

from __future__ import annotations

import mmap
import sys
import threading

REGION_ROUNDING_BYTES = 1 << 20  # regions grow in whole MiB, so sizes that vary a little fit


def _reference_count(regions: list, index: int) -> int:
    return sys.getrefcount(regions[index])


# The count ``_reference_count`` sees for a region that only its list refers to, measured
# once here in the same way: the interpreter's own temporary references vary by version.
_UNREFERENCED_COUNT = _reference_count([bytearray()], 0)


Region = bytearray | mmap.mmap


def lazily_committed_region(size_bytes: int) -> mmap.mmap:
    """``size_bytes`` of zeroes of which only the pages written become resident."""
    region = mmap.mmap(-1, size_bytes, flags=mmap.MAP_PRIVATE)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        region.madvise(mmap.MADV_NOHUGEPAGE)
    return region


def _rounded(size_bytes: int) -> int:
    return max(1, -(-size_bytes // REGION_ROUNDING_BYTES)) * REGION_ROUNDING_BYTES


class RegionPool:
    """At most ``max_regions`` reusable regions; ``take(n)`` returns one of at least n bytes
    that nothing else refers to (contents undefined)."""

    def __init__(self, max_regions: int, max_kept_region_bytes: int | None = None,
                 lazily_committed: bool = False, max_kept_bytes: int | None = None) -> None:
        self.max_regions = max_regions
        self.max_kept_region_bytes = max_kept_region_bytes
        self.max_kept_bytes = max_kept_bytes  # of all kept regions together (None: no bound)
        self.lazily_committed = lazily_committed
        self._regions: list[Region] = []
        self.kept_bytes = 0
        self._lock = threading.Lock()
        self.allocated_bytes = 0  # by this pool so far: tells reuse from fresh allocation

    def take(self, size_bytes: int) -> Region:
        with self._lock:
            return self._take(size_bytes)

    def _take(self, size_bytes: int) -> Region:
        if not self._keeps(size_bytes):
            return self._allocate(size_bytes)
        for index in range(len(self._regions)):
            if _reference_count(self._regions, index) != _UNREFERENCED_COUNT:
                continue
            if len(self._regions[index]) >= size_bytes:
                return self._regions[index]
            self.kept_bytes -= len(self._regions.pop(index))  # free but too small: replaced
            break
        region = self._allocate(size_bytes)
        if len(self._regions) < self.max_regions and (
                self.max_kept_bytes is None or
                self.kept_bytes + len(region) <= self.max_kept_bytes):
            self._regions.append(region)
            self.kept_bytes += len(region)
        return region

    def _keeps(self, size_bytes: int) -> bool:
        return self.max_kept_region_bytes is None or \
            _rounded(size_bytes) <= self.max_kept_region_bytes

    def _allocate(self, size_bytes: int) -> Region:
        size = _rounded(size_bytes)
        self.allocated_bytes += size
        return lazily_committed_region(size) if self.lazily_committed else bytearray(size)
