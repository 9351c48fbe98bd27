"""Fetch data that is not in the page cache, read off the event loop with ``O_DIRECT``.

A Fetch response's records go out by ``sendfile`` from the page cache. For a slice that is not
there -- a consumer catching up on old segments -- ``sendfile`` would wait on the disk on the
event loop thread, stalling every connection, and a buffered read of cold data (page-cache
allocation, readahead) was measured to stall the machine's other threads too: a paced
producer's p99 went from 0.44 ms to 16.8 ms while a consumer read 3 GB of cold log, where
``O_DIRECT`` reads left it near idle (BENCHMARKS.md, "Catch-up consumer"). So a slice whose
pages are not all cached (``segment_io.page_cache_holds``) is read on a worker thread, through a
second descriptor of its file opened ``O_DIRECT`` (reopened by ``/proc/self/fd``, which also
works for a segment already renamed for deletion), into an aligned buffer
(``segment_io.read_chunk``), and the response sends those bytes instead. A file system that refuses
``O_DIRECT`` gets a buffered read on the worker thread. Cold data so never enters the page cache
for one reader and leaves the cache to the hot data other consumers read.

Thread-safety: ``cold_slices`` runs on the event loop thread; ``read_slices`` on any thread
(it touches only the slices' files and fresh buffers).
"""

from __future__ import annotations

import os
from typing import Any

from headrace.errors import CorruptMessage
from headrace.storage.segment_io import (
    DIRECT_READ_SLACK_BYTES,
    aligned_buffer,
    page_cache_holds,
    read_chunk,
)

IN_MEMORY = (bytes, bytearray, memoryview)  # response parts that are not file slices


def cold_slices(parts: tuple[Any, ...]) -> list[int]:
    """The indexes of the file slices among ``parts`` not wholly in the page cache."""
    return [index for index, part in enumerate(parts)
            if not isinstance(part, IN_MEMORY) and part.length
            and not page_cache_holds(part.fd, part.position, part.length)]


def read_slices(parts: tuple[Any, ...], cold: list[int]) -> tuple[Any, ...]:
    """``parts`` with the file slices at the indexes ``cold`` replaced by their bytes, read
    with ``O_DIRECT`` where the file system allows it. Blocks on the disk: call off the event
    loop. Raises ``CorruptMessage`` if a slice runs past the end of its file."""
    read = list(parts)
    for index in cold:
        read[index] = _read_cold(parts[index])
    return tuple(read)


def _read_cold(part: Any) -> memoryview:
    buffer = aligned_buffer(part.length + DIRECT_READ_SLACK_BYTES)
    try:
        direct_fd = os.open(f"/proc/self/fd/{part.fd}", os.O_RDONLY | os.O_DIRECT)
    except OSError:  # no O_DIRECT on this file system (or no /proc): a buffered read
        direct_fd = -1
    try:
        data = read_chunk(part.fd, direct_fd, buffer, part.position, part.length)
    finally:
        if direct_fd >= 0:
            os.close(direct_fd)
    if len(data) < part.length:
        raise CorruptMessage(f"file slice ends early at byte {part.position + len(data)}")
    return data
