"""The cleaner's span passes (``segment_io.map_span`` / ``segment_io.filter_span``) against the
buffer passes they stand for (``map_batches`` / ``filter_batches`` over the whole file):
real files, chunks smaller than the batches, batches straddling chunk ends, spans resumed
where they stopped, and the early stops (compressed batch, batch larger than the buffer,
full map) and failures (truncated or corrupt batch, bad descriptor)."""

from __future__ import annotations

import errno
import json
import os
import random
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from headrace.broker.scheduling import note_broker_request
from headrace.errors import CorruptMessage
from headrace.protocol.compression import GZIP
from headrace.protocol.kernel import decode_columns
from headrace.protocol.records import build_batch
from headrace.storage import segment_io
from headrace.storage.segment_io import (
    DIRECT_READ_ALIGN_BYTES,
    DIRECT_READ_SLACK_BYTES,
    SPAN_COMPRESSED,
    SPAN_DONE,
    SPAN_FULL,
    SPAN_GROW,
    IndexState,
    OutputIndex,
    PassScope,
    filter_batches,
    filter_span,
    index_batches,
    map_batches,
    map_span,
    use_cachestat,
)
from tests.page_cache import cached_pages, drop_from_page_cache

NOW_MS = 1_700_000_000_000
HORIZON_MS = NOW_MS + 1000
ALL_KEYS = PassScope(0, 1 << 40, 0, 1 << 32)
NO_PROTECTED = np.empty(0, np.int64)
FRESH_INDEX = IndexState(0, -1, 0, 0, False)  # a segment of base offset 0 before its first batch


def fresh_output(index_interval_bytes: int = 4096) -> OutputIndex:
    return OutputIndex(0, -1, index_interval_bytes, FRESH_INDEX)


def keyed_batches(seed: int, batches: int, keys: int, max_records: int = 6,
                  value_bytes: int = 20) -> list[bytes]:
    """Consecutive uncompressed batches of random updates and deletes of ``keys`` keys."""
    rng = random.Random(seed)
    out, offset = [], 0
    for _ in range(batches):
        records = [(b"k%d" % rng.randrange(keys),
                    None if rng.random() < 0.1 else bytes(rng.randrange(256)
                                                          for _ in range(value_bytes)),
                    [], NOW_MS) for _ in range(rng.randint(1, max_records))]
        out.append(build_batch(records, base_offset=offset))
        offset += len(records)
    return out


def write_file(path: Path, batches: list[bytes]) -> int:
    """Write the batches to ``path``; returns an open read-only descriptor."""
    path.write_bytes(b"".join(batches))
    return os.open(path, os.O_RDONLY)


class Tables:
    """Offset-map tables of ``slots`` slots, as ``OffsetMap`` lays them out."""

    def __init__(self, slots: int = 4096) -> None:
        self.fingerprints = np.zeros(slots, np.uint64)
        self.words = np.zeros(slots, np.uint32)


def span_buffer(chunk_bytes: int, direct_fd: int) -> bytearray | np.ndarray:
    """A span's read buffer for chunks of ``chunk_bytes``: with a ``direct_fd``, aligned and
    with the direct-read slack."""
    if direct_fd < 0:
        return bytearray(chunk_bytes)
    return aligned_buffer(chunk_bytes + DIRECT_READ_SLACK_BYTES)


def aligned_buffer(size_bytes: int) -> np.ndarray:
    raw = np.zeros(size_bytes + DIRECT_READ_ALIGN_BYTES, np.uint8)
    start = -raw.ctypes.data % DIRECT_READ_ALIGN_BYTES
    return raw[start:start + size_bytes]


def run_map_spans(fd: int, end: int, tables: Tables, buffer_bytes: int, span_bytes: int,
                  room: int = 1 << 30, direct_fd: int = -1
                  ) -> tuple[int, int, int, list[int]]:
    """map_span calls from 0 to ``end`` (growing the buffer when asked): (records read,
    next ordinal, new keys, stops seen)."""
    buffer = span_buffer(buffer_bytes, direct_fd)
    position = records = ordinal = new_keys = 0
    stops = []
    while position < end:
        span = map_span(fd, buffer, position, end, span_bytes, tables.fingerprints,
                        tables.words, ALL_KEYS, ordinal, room - new_keys, direct_fd=direct_fd)
        assert span.position >= position
        position, ordinal = span.position, span.next_ordinal
        records += span.records_read
        new_keys += span.new_keys
        stops.append(span.stop)
        if span.stop == SPAN_GROW:
            buffer = bytearray(span.stop_bytes) if direct_fd < 0 else aligned_buffer(
                span.stop_bytes)
        elif span.stop != SPAN_DONE:
            break
    return records, ordinal, new_keys, stops


class SpansIndex:
    """The index entries filter_span calls reported, collected as the cleaner collects them."""

    def __init__(self, index_interval_bytes: int) -> None:
        self.output = fresh_output(index_interval_bytes)
        self.offset_entries: list[list[int]] = []
        self.time_entries: list[list[int]] = []
        self.first_max_timestamp_ms: int | None = None

    def add(self, span) -> None:
        indexed = span.indexed
        self.output = OutputIndex(self.output.out_position + span.bytes_written,
                                  indexed.next_offset, self.output.index_interval_bytes,
                                  indexed.state)
        self.offset_entries += indexed.offset_entries.tolist()
        self.time_entries += indexed.time_entries.tolist()
        if self.first_max_timestamp_ms is None:
            self.first_max_timestamp_ms = indexed.first_max_timestamp_ms


def run_filter_spans(fd: int, out_path: Path, end: int, tables: Tables, buffer_bytes: int,
                     span_bytes: int, index: SpansIndex | None = None, direct_fd: int = -1
                     ) -> tuple[bytes, int, int, int]:
    """filter_span calls from 0 to ``end`` into ``out_path``: (bytes written, records read,
    records kept, bytes reported written); the index they report goes into ``index``."""
    out_fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    buffer = span_buffer(buffer_bytes, direct_fd)
    position = records = kept = written = ordinal = 0
    index = index or SpansIndex(4096)
    try:
        while position < end:
            span = filter_span(fd, out_fd, buffer, position, end, span_bytes,
                               tables.fingerprints, tables.words, ALL_KEYS, ordinal, NOW_MS,
                               HORIZON_MS, NO_PROTECTED, index.output, direct_fd=direct_fd)
            index.add(span)
            position, ordinal = span.position, span.next_ordinal
            records += span.records_read
            kept += span.records_kept
            written += span.bytes_written
            if span.stop == SPAN_GROW:
                buffer = bytearray(span.stop_bytes) if direct_fd < 0 else aligned_buffer(
                    span.stop_bytes)
            else:
                assert span.stop == SPAN_DONE
    finally:
        os.close(out_fd)
    return out_path.read_bytes(), records, kept, written


@pytest.mark.parametrize("buffer_bytes,span_bytes", [(311, 1 << 20), (311, 500), (4096, 1)])
def test_map_span_fills_the_map_as_map_batches_does(tmp_path, buffer_bytes, span_bytes):
    batches = keyed_batches(1, batches=120, keys=40)
    data = b"".join(batches)
    assert max(map(len, batches)) < buffer_bytes < len(data)  # batches straddle chunk ends
    fd = write_file(tmp_path / "0.log", batches)
    try:
        spans, whole = Tables(), Tables()
        records, ordinal, new_keys, stops = run_map_spans(fd, len(data), spans, buffer_bytes,
                                                          span_bytes)
    finally:
        os.close(fd)
    expected = map_batches(data, whole.fingerprints, whole.words, ALL_KEYS, 0, 1 << 30)
    assert (records, ordinal, new_keys) == (expected.records_read, expected.next_ordinal,
                                           expected.new_keys)
    assert np.array_equal(spans.fingerprints, whole.fingerprints)
    assert np.array_equal(spans.words, whole.words)
    assert set(stops) == {SPAN_DONE} and (len(stops) > 1) == (span_bytes < len(data))


@pytest.mark.parametrize("buffer_bytes,span_bytes", [(311, 1 << 20), (200, 700)])
def test_filter_span_writes_what_filter_batches_returns(tmp_path, buffer_bytes, span_bytes):
    batches = keyed_batches(2, batches=150, keys=30)
    data = b"".join(batches)
    tables = Tables()
    map_batches(data, tables.fingerprints, tables.words, ALL_KEYS, 0, 1 << 30)
    expected = filter_batches(data, tables.fingerprints, tables.words, ALL_KEYS, 0, NOW_MS,
                              HORIZON_MS, NO_PROTECTED)
    fd = write_file(tmp_path / "0.log", batches)
    try:
        written, records, kept, reported = run_filter_spans(
            fd, tmp_path / "0.log.cleaned", len(data), tables, buffer_bytes, span_bytes)
    finally:
        os.close(fd)
    assert written == bytes(expected.data) and reported == len(written)
    assert (records, kept) == (expected.records_read, expected.records_kept)
    assert kept < records  # the workload has duplicates to drop


@pytest.mark.parametrize("buffer_bytes,span_bytes", [(311, 1 << 20), (200, 700)])
def test_filter_span_indexes_its_output_as_recovery_indexes_the_file(tmp_path, buffer_bytes,
                                                                     span_bytes):
    batches = keyed_batches(12, batches=150, keys=30)
    data = b"".join(batches)
    tables = Tables()
    map_batches(data, tables.fingerprints, tables.words, ALL_KEYS, 0, 1 << 30)
    fd = write_file(tmp_path / "0.log", batches)
    index = SpansIndex(index_interval_bytes=150)
    try:
        written, *_ = run_filter_spans(fd, tmp_path / "0.log.cleaned", len(data), tables,
                                       buffer_bytes, span_bytes, index)
    finally:
        os.close(fd)
    rebuilt = index_batches(written, 0, len(written), 0, -1, 150, FRESH_INDEX)
    assert rebuilt.bytes_valid == len(written) == index.output.out_position
    assert len(rebuilt.offset_entries) > 5  # entries on both sides of span and chunk ends
    assert index.offset_entries == rebuilt.offset_entries.tolist()
    assert index.time_entries == rebuilt.time_entries.tolist()
    assert index.output.state == rebuilt.state
    assert index.output.next_offset == rebuilt.next_offset
    assert index.first_max_timestamp_ms == rebuilt.first_max_timestamp_ms


def test_a_batch_larger_than_the_buffer_stops_the_span_to_grow_it(tmp_path):
    small = keyed_batches(3, batches=10, keys=5)
    large = build_batch([(b"big", b"x" * 5000, [], NOW_MS)], base_offset=1000)
    after = build_batch([(b"after", b"y", [], NOW_MS)], base_offset=1001)
    batches = [*small, large, after]
    fd = write_file(tmp_path / "0.log", batches)
    large_at = sum(map(len, small))
    try:
        tables = Tables()
        span = map_span(fd, bytearray(1024), 0, large_at + len(large) + len(after), 1 << 20,
                        tables.fingerprints, tables.words, ALL_KEYS, 0, 1 << 30)
        assert (span.position, span.stop, span.stop_bytes) == (large_at, SPAN_GROW, len(large))
        resumed = map_span(fd, bytearray(span.stop_bytes), span.position,
                           large_at + len(large) + len(after), 1 << 20, tables.fingerprints,
                           tables.words, ALL_KEYS, span.next_ordinal, 1 << 30)
    finally:
        os.close(fd)
    assert resumed.stop == SPAN_DONE and resumed.position == large_at + len(large) + len(after)
    assert resumed.next_ordinal == span.next_ordinal + 2


@pytest.mark.parametrize("cut_bytes", [1, 30, 70])
def test_a_truncated_last_batch_is_corrupt(tmp_path, cut_bytes):
    batches = keyed_batches(4, batches=20, keys=10)
    data = b"".join(batches)
    path = tmp_path / "0.log"
    path.write_bytes(data[:len(data) - len(batches[-1]) + cut_bytes])
    fd = os.open(path, os.O_RDONLY)
    try:
        tables = Tables()
        with pytest.raises(CorruptMessage, match="runs past the end"):
            map_span(fd, bytearray(256), 0, path.stat().st_size, 1 << 20, tables.fingerprints,
                     tables.words, ALL_KEYS, 0, 1 << 30)
        with pytest.raises(CorruptMessage, match="runs past the end"):  # file shorter than end
            map_span(fd, bytearray(1 << 16), 0, len(data), 1 << 20, tables.fingerprints,
                     tables.words, ALL_KEYS, 0, 1 << 30)
    finally:
        os.close(fd)


def test_a_corrupt_batch_is_named_by_its_chunk_position(tmp_path):
    batches = keyed_batches(5, batches=30, keys=10)
    data = bytearray(b"".join(batches))
    data[sum(map(len, batches[:20])) + 70] ^= 0xFF  # a record byte of batch 20: CRC fails
    path = tmp_path / "0.log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    tables = Tables()
    try:
        with pytest.raises(CorruptMessage, match="file position .* CRC-32C"):
            map_span(fd, bytearray(512), 0, len(data), 1 << 20, tables.fingerprints,
                     tables.words, ALL_KEYS, 0, 1 << 30)
    finally:
        os.close(fd)


def uncached_file(path: Path, batches: list[bytes]) -> tuple[int, int]:
    """Write the batches to ``path`` and drop its pages from the page cache; returns
    descriptors (buffered, O_DIRECT). Skips where the file system refuses O_DIRECT."""
    fd = write_file(path, batches)
    drop_from_page_cache(path)
    try:
        direct_fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError as error:
        os.close(fd)
        if error.errno == errno.EINVAL:
            pytest.skip("the file system refuses O_DIRECT")
        raise
    if cached_pages(path):
        os.close(fd)
        os.close(direct_fd)
        pytest.skip("the page cache kept the file")
    return fd, direct_fd


@pytest.fixture(params=["cachestat", "mincore"])
def page_cache_probe(request):
    """The spans ask the page cache with cachestat(2) or, as on kernels before 6.5, mincore."""
    previous = use_cachestat(request.param == "cachestat")
    yield request.param
    use_cachestat(previous)


_PAGE_CACHE_PROBE_CHILD = textwrap.dedent("""
    import json, os, sys
    from headrace.storage import segment_io
    from tests.kernel_features import cachestat
    path = sys.argv[1]
    probe_at_import = segment_io.page_cache_probe()
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    os.write(fd, os.urandom(64 * 4096))
    os.fsync(fd)
    cached_after_write = segment_io.page_cache_holds(fd, 0, 64 * 4096)
    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    truth = cachestat(fd)
    print(json.dumps({
        "probe_at_import": probe_at_import, "probe_after_use": segment_io.page_cache_probe(),
        "cached_after_write": cached_after_write,
        "cached_after_drop": segment_io.page_cache_holds(fd, 0, 64 * 4096),
        "cached_pages_after_drop": None if truth is None else truth.nr_cache}))
""")


@pytest.mark.parametrize("probe", [
    pytest.param("cachestat", marks=pytest.mark.required_where("cachestat")), "mincore"])
def test_each_page_cache_probe_forced_by_the_environment_tells_cached_from_dropped(tmp_path,
                                                                                   probe):
    """HEADRACE_PAGE_CACHE_PROBE, read at import in a process of its own, picks the probe the
    spans use (page_cache_probe()); that probe finds a file just written cached and, once its
    pages are dropped (cachestat's count of them as the truth, where the kernel has it), not."""
    root = str(Path(__file__).resolve().parents[2])
    environment = {**os.environ, segment_io.PAGE_CACHE_PROBE_ENV: probe,
                   "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, "-c", _PAGE_CACHE_PROBE_CHILD, str(tmp_path / "f")],
                           capture_output=True, text=True, check=True, env=environment)
    seen = json.loads(child.stdout)
    if probe == "cachestat" and seen["probe_after_use"] != "cachestat":
        pytest.skip("no cachestat(2) on this kernel: the probe fell back to mincore")
    assert (seen["probe_at_import"], seen["probe_after_use"]) == (probe, probe)
    assert seen["cached_after_write"] is True
    if seen["cached_pages_after_drop"] is None:
        pytest.skip("no cachestat(2) to tell whether the pages were dropped")
    assert seen["cached_after_drop"] is (seen["cached_pages_after_drop"] == 64)


@pytest.mark.required_where("o_direct", "cachestat")
@pytest.mark.parametrize("buffer_bytes,span_bytes", [(311, 1 << 20), (5000, 9000)])
def test_spans_read_uncached_chunks_with_o_direct_and_find_the_same(tmp_path, buffer_bytes,
                                                                     span_bytes,
                                                                     page_cache_probe):
    batches = keyed_batches(21, batches=600, keys=50)
    data = b"".join(batches)
    assert len(data) > 8 * DIRECT_READ_ALIGN_BYTES  # chunks start and end off the blocks
    path = tmp_path / "0.log"
    fd, direct_fd = uncached_file(path, batches)
    try:
        spans, whole = Tables(), Tables()
        mapped = run_map_spans(fd, len(data), spans, buffer_bytes, span_bytes,
                               direct_fd=direct_fd)
        written, records, kept, _ = run_filter_spans(
            fd, tmp_path / "0.log.cleaned", len(data), spans, buffer_bytes, span_bytes,
            direct_fd=direct_fd)
        # Direct reads leave the page cache as it was; a single buffered read fills it.
        assert cached_pages(path) == 0
        os.pread(fd, 1, 0)
        assert cached_pages(path) > 0
    finally:
        os.close(fd)
        os.close(direct_fd)
    expected_map = map_batches(data, whole.fingerprints, whole.words, ALL_KEYS, 0, 1 << 30)
    assert mapped[:3] == (expected_map.records_read, expected_map.next_ordinal,
                          expected_map.new_keys)
    assert np.array_equal(spans.words, whole.words)
    expected = filter_batches(data, whole.fingerprints, whole.words, ALL_KEYS, 0, NOW_MS,
                              HORIZON_MS, NO_PROTECTED)
    assert written == bytes(expected.data)
    assert (records, kept) == (expected.records_read, expected.records_kept)


@pytest.mark.required_where("o_direct", "cachestat")
def test_a_direct_span_asks_for_a_batch_s_size_plus_the_slack(tmp_path):
    small = keyed_batches(22, batches=10, keys=5)
    large = build_batch([(b"big", b"x" * 20000, [], NOW_MS)], base_offset=1000)
    batches = [*small, large]
    end = sum(map(len, batches))
    fd, direct_fd = uncached_file(tmp_path / "0.log", batches)
    try:
        tables = Tables()
        span = map_span(fd, aligned_buffer(4096 + DIRECT_READ_SLACK_BYTES), 0, end, 1 << 20,
                        tables.fingerprints, tables.words, ALL_KEYS, 0, 1 << 30,
                        direct_fd=direct_fd)
        assert span.stop == SPAN_GROW
        assert span.stop_bytes == len(large) + DIRECT_READ_SLACK_BYTES
        resumed = map_span(fd, aligned_buffer(span.stop_bytes), span.position, end, 1 << 20,
                           tables.fingerprints, tables.words, ALL_KEYS, span.next_ordinal,
                           1 << 30, direct_fd=direct_fd)
        with pytest.raises(ValueError, match="aligned"):
            map_span(fd, aligned_buffer(2 * DIRECT_READ_SLACK_BYTES)[1:], 0, end, 1 << 20,
                     tables.fingerprints, tables.words, ALL_KEYS, 0, 1 << 30,
                     direct_fd=direct_fd)
    finally:
        os.close(fd)
        os.close(direct_fd)
    assert (resumed.stop, resumed.position) == (SPAN_DONE, end)


def test_a_compressed_batch_stops_the_span_where_it_starts(tmp_path):
    plain = keyed_batches(6, batches=8, keys=10)
    offset = 1000
    compressed = build_batch([(b"c%d" % i, b"v", [], NOW_MS) for i in range(5)],
                             base_offset=offset, compression=GZIP)
    fd = write_file(tmp_path / "0.log", [*plain, compressed])
    plain_bytes = sum(map(len, plain))
    tables = Tables()
    try:
        span = map_span(fd, bytearray(300), 0, plain_bytes + len(compressed), 1 << 20,
                        tables.fingerprints, tables.words, ALL_KEYS, 0, 1 << 30)
        out_fd = os.open(tmp_path / "0.log.cleaned", os.O_WRONLY | os.O_CREAT)
        try:
            filtered = filter_span(fd, out_fd, bytearray(300), 0, plain_bytes + len(compressed),
                                   1 << 20, tables.fingerprints, tables.words, ALL_KEYS, 0,
                                   NOW_MS, HORIZON_MS, NO_PROTECTED, fresh_output())
        finally:
            os.close(out_fd)
    finally:
        os.close(fd)
    plain_records = len(record_offsets(b"".join(plain)))
    assert (span.position, span.stop) == (plain_bytes, SPAN_COMPRESSED)
    assert span.records_read == plain_records
    assert (filtered.position, filtered.stop) == (plain_bytes, SPAN_COMPRESSED)
    assert filtered.records_read == plain_records


def record_offsets(data: bytes) -> list[int]:
    return decode_columns(data).offsets.tolist()


def test_a_full_map_stops_pass_one(tmp_path):
    batches = keyed_batches(7, batches=100, keys=500)
    data = b"".join(batches)
    fd = write_file(tmp_path / "0.log", batches)
    tables = Tables()
    try:
        records, _ordinal, new_keys, stops = run_map_spans(fd, len(data), tables, 256, 1 << 20,
                                                           room=20)
    finally:
        os.close(fd)
    assert stops[-1] == SPAN_FULL and new_keys == 20
    assert np.count_nonzero(tables.fingerprints) == 20
    assert records < len(record_offsets(data))


def test_a_failed_read_raises_os_error(tmp_path):
    tables = Tables()
    directory_fd = os.open(tmp_path, os.O_RDONLY)  # pread fails: EISDIR
    try:
        with pytest.raises(IsADirectoryError):
            map_span(directory_fd, bytearray(256), 0, 100, 1 << 20, tables.fingerprints,
                     tables.words, ALL_KEYS, 0, 1 << 30)
    finally:
        os.close(directory_fd)


def _threads_and_nice_values() -> list[tuple[Path, int]]:
    """Each thread's /proc directory with its nice value (field 19 of its stat)."""
    threads = []
    for task in Path("/proc/self/task").iterdir():
        try:
            threads.append((task, int((task / "stat").read_text().rsplit(")", 1)[1].split()[16])))
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return threads


def _niced_and_plain_spans(fd: int, size_bytes: int, buffer_bytes: int,
                           watch: Callable[[], None], seen_enough: Callable[[], bool]):
    """Run ``watch()`` on a thread while niced map spans (niceness 5) run over the file, up
    to 500 times until ``seen_enough()``; then the same span in the caller. Returns
    ``(niced span, its tables, plain span, its tables)``."""
    stop = threading.Event()

    def watch_until_stopped() -> None:
        while not stop.is_set():
            watch()

    watcher = threading.Thread(target=watch_until_stopped)
    watcher.start()
    try:
        for _ in range(500):  # each span runs a few ms; the watcher looks meanwhile
            niced = Tables()
            span = map_span(fd, bytearray(buffer_bytes), 0, size_bytes, 1 << 30,
                            niced.fingerprints, niced.words, ALL_KEYS, 0, 1 << 30, niceness=5)
            if seen_enough():
                break
    finally:
        stop.set()
        watcher.join()
    plain = Tables()
    expected = map_span(fd, bytearray(buffer_bytes), 0, size_bytes, 1 << 30, plain.fingerprints,
                        plain.words, ALL_KEYS, 0, 1 << 30)
    return span, niced, expected, plain


def test_a_niced_span_works_on_a_nicer_thread_and_leaves_the_caller_as_it_was(tmp_path):
    batches = keyed_batches(13, batches=3000, keys=500)
    data = b"".join(batches)
    fd = write_file(tmp_path / "0.log", batches)
    own_nice = os.getpriority(os.PRIO_PROCESS, 0)  # Linux: the calling thread's
    seen: set[int] = set()
    niced_names: set[str] = set()

    def watch() -> None:
        for task, nice in _threads_and_nice_values():
            seen.add(nice)
            if nice == own_nice + 5:
                try:
                    niced_names.add((task / "comm").read_text().strip())
                except (FileNotFoundError, ProcessLookupError):
                    continue

    try:
        span, niced, expected, plain = _niced_and_plain_spans(
            fd, len(data), 311, watch, lambda: own_nice + 5 in seen)
    finally:
        os.close(fd)
    assert own_nice + 5 in seen
    assert "hr-clean-span" in niced_names  # named for top -H / ps -L
    assert os.getpriority(os.PRIO_PROCESS, 0) == own_nice
    assert span == expected and span.stop == SPAN_DONE
    assert np.array_equal(niced.fingerprints, plain.fingerprints)


def _voluntary_switches_of_threads_niced(nice: int) -> int:
    """The most voluntary context switches (sleeps) of any thread at ``nice``."""
    most = 0
    for task, task_nice in _threads_and_nice_values():
        if task_nice != nice:
            continue
        try:
            for line in (task / "status").read_text().splitlines():
                if line.startswith("voluntary_ctxt_switches:"):
                    most = max(most, int(line.split()[1]))
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return most


def test_a_niced_span_pauses_while_the_broker_receives_requests_and_cleans_the_same(tmp_path):
    # Read from the page cache, a span's thread sleeps only in its cooperative pauses: with
    # requests noted all along, it must be seen with voluntary context switches.
    batches = keyed_batches(17, batches=3000, keys=500)
    data = b"".join(batches)
    fd = write_file(tmp_path / "0.log", batches)
    niced_value = os.getpriority(os.PRIO_PROCESS, 0) + 5
    most_switches = 0

    def busy_broker() -> None:
        nonlocal most_switches
        note_broker_request()
        most_switches = max(most_switches, _voluntary_switches_of_threads_niced(niced_value))

    try:
        span, niced, expected, plain = _niced_and_plain_spans(
            fd, len(data), 4096, busy_broker, lambda: most_switches > 0)
    finally:
        os.close(fd)
    assert most_switches > 0
    assert span == expected and span.stop == SPAN_DONE
    assert np.array_equal(niced.fingerprints, plain.fingerprints)
