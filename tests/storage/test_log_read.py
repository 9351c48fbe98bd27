"""Log.read for sequential readers: each read answers whole batches, greedy up to max_bytes
across segments, whether it starts from a remembered next-batch position or from the index,
and a remembered position never outlives the segment it points into."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.protocol.records import build_batch as records_build_batch
from headrace.storage.cleaner import Cleaner
from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log
from headrace.storage.offset_map import OffsetMap
from tests.record_reading import iter_headers

from .batches import build_batch

NOW_MS = 1_700_000_000_000


def _open(path: Path, **config) -> Log:
    return Log("t", 0, path / "t-0", LogConfig(**config), RealFileSystem(), NOW_MS,
               clean_shutdown=True)


def _batches_read(log: Log, offset: int, max_bytes: int) -> list[tuple[int, int, bytes]]:
    """(base offset, last offset, bytes) of each batch one read answers."""
    result = log.read(offset, max_bytes)
    data = b"".join(piece.read_bytes() for piece in result.slices)
    assert len(data) == result.size_bytes
    return [(header.base_offset, header.last_offset, data[position:position + header.size_bytes])
            for position, header in iter_headers(data, verify_crc=True)]


def _expected(stored: list[tuple[int, int, bytes]], offset: int, max_bytes: int):
    """Whole batches from the one holding ``offset``, at least one, then while they fit."""
    start = next(i for i, (_, last, _) in enumerate(stored) if last >= offset)
    answer, total = [], 0
    for batch in stored[start:]:
        if answer and total + len(batch[2]) > max_bytes:
            break
        answer.append(batch)
        total += len(batch[2])
    return answer


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    batch_records=st.lists(st.integers(1, 12), min_size=1, max_size=40),
    segment_bytes=st.integers(1500, 6000),
    index_interval_bytes=st.integers(1, 2000),
    steps=st.lists(st.tuples(st.integers(0, 1), st.integers(1, 5000)), min_size=1, max_size=60),
)
def test_interleaved_sequential_readers_get_whole_batches_up_to_max_bytes(
        batch_records, segment_bytes, index_interval_bytes, steps):
    directory = Path(tempfile.mkdtemp(prefix="log-read-"))
    try:
        log = _open(directory, segment_bytes=segment_bytes,
                    index_interval_bytes=index_interval_bytes)
        appended_offsets = []
        for count in batch_records:
            appended = log.append(build_batch([b"v" * (count * 7)] * count), NOW_MS)
            appended_offsets.append((appended.base_offset, appended.last_offset))
        stored = _batches_read(log, 0, 1 << 30)  # every batch, as stored
        assert [batch[:2] for batch in stored] == appended_offsets
        readers = [0, 0]  # two consumers of one partition, each at its own next offset
        for reader, max_bytes in steps:
            offset = readers[reader]
            if offset >= log.log_end_offset:
                continue
            answer = _batches_read(log, offset, max_bytes)
            assert answer == _expected(stored, offset, max_bytes)
            readers[reader] = answer[-1][1] + 1
        log.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def test_a_remembered_position_is_not_used_once_the_cleaner_replaced_its_segment(scratch):
    log = _open(scratch, segment_bytes=2000, cleanup_policy=("compact",))
    for n in range(60):
        record = (b"key-%d" % (n % 3), b"value-%d" % n, [], NOW_MS)
        log.append(records_build_batch([record]), NOW_MS)
    first = _batches_read(log, 0, 300)
    next_offset = first[-1][1] + 1  # a sequential reader's next offset, now remembered
    assert next_offset in log._local._next_batches
    assert Cleaner(OffsetMap(1 << 20)).clean(log, 0, NOW_MS) is not None
    assert log.segments[0].size_bytes < 2000  # the first segment was rewritten smaller
    stored = _batches_read(log, log.log_start_offset, 1 << 30)
    assert _batches_read(log, next_offset, 300) == _expected(stored, next_offset, 300)
    log.close()
