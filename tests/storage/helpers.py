"""Shared assertions for storage tests: read a log back and check its indexes by scanning."""

from __future__ import annotations

from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log
from tests.record_reading import iter_headers

NOW_MS = 1_700_000_000_000


def open_log(path, now_ms=NOW_MS, **config) -> Log:
    """A fresh log "t-0" under ``path`` on the real file system, with ``config``."""
    return Log("t", 0, path / "t-0", LogConfig(**config), RealFileSystem(), now_ms,
               clean_shutdown=True)


def reopen(log: Log, clean: bool = True, recovery_point: int | None = None) -> Log:
    """Close ``log`` (flushed when ``clean``, else as after a crash) and open it again,
    recovering from ``recovery_point`` (default: the log's) after an unclean close."""
    if recovery_point is None:
        recovery_point = log.recovery_point
    if clean:
        log.close()
    else:
        log.close_without_flush()
    return Log("t", 0, log.dir, log.config, RealFileSystem(), NOW_MS,
               recovery_point=recovery_point, clean_shutdown=clean)


def read_all(log: Log, start: int | None = None, max_bytes: int = 1 << 20) -> list[tuple[int, bytes]]:
    """(base offset, batch bytes) for every batch from ``start`` (default log start) to the end."""
    offset = log.log_start_offset if start is None else start
    batches = []
    while offset < log.log_end_offset:
        result = log.read(offset, max_bytes)
        data = b"".join(piece.read_bytes() for piece in result.slices)
        assert len(data) == result.size_bytes > 0
        for position, header in iter_headers(data, verify_crc=True):
            batches.append((header.base_offset, data[position : position + header.size_bytes]))
            offset = header.next_offset
    return batches


def assert_indexes_match_scan(log: Log) -> None:
    """Every offset-index entry points at the batch with that last offset; time-index entries
    grow and never exceed the largest timestamp seen up to their offset."""
    for segment in log.segments:
        headers = {position: header for position, header in segment.iter_batches()}
        last_position = -1
        for relative, position in zip(segment.offset_index.relative_offsets,
                                      segment.offset_index.positions, strict=True):
            assert position in headers and position > last_position
            assert headers[position].last_offset == segment.base_offset + relative
            last_position = position
        running_max, max_by_offset = -1, {}
        for header in headers.values():
            running_max = max(running_max, header.max_timestamp)
            max_by_offset[header.last_offset] = running_max
        previous = -1
        for timestamp, relative in zip(segment.time_index.timestamps,
                                       segment.time_index.relative_offsets, strict=True):
            assert timestamp > previous
            assert max_by_offset.get(segment.base_offset + relative) == timestamp
            previous = timestamp
