"""Page-cache residency of test files: how many of a file's pages are cached (cachestat(2),
Linux 6.5+; the test is skipped where the kernel lacks it) and dropping a file's pages.
Stateless; safe from any thread."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.kernel_features import cachestat


def cached_pages(path: Path) -> int:
    """Pages of ``path`` in the page cache."""
    with open(path, "rb") as file:
        result = cachestat(file.fileno())
    if result is None:
        pytest.skip("no cachestat(2) on this kernel")
    return result.nr_cache


def drop_from_page_cache(path: Path) -> None:
    """Write ``path``'s dirty pages back and drop all its pages from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
