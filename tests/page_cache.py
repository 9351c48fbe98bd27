"""Page-cache residency of test files: how many of a file's pages are cached (cachestat(2),
Linux 6.5+; the test is skipped where the kernel lacks it) and dropping a file's pages.
Stateless; safe from any thread."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

CACHESTAT_SYSCALL = 451  # the same number on every architecture


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def cached_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache."""
    libc = ctypes.CDLL(None, use_errno=True)
    result = _Cachestat()
    with open(path, "rb") as file:
        if libc.syscall(CACHESTAT_SYSCALL, file.fileno(), ctypes.byref(_CachestatRange(0, 0)),
                        ctypes.byref(result), 0) != 0:
            pytest.skip(f"no cachestat: {os.strerror(ctypes.get_errno())}")
    return result.nr_cache


def drop_from_page_cache(path: Path) -> None:
    """Write ``path``'s dirty pages back and drop all its pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
