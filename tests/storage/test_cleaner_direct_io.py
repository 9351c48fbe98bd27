"""The cleaner's ``O_DIRECT`` I/O: the ``.cleaned`` output in whole aligned stages written by
the kernel's spans and by the recompressed-chunk path, the unaligned tail padded and
truncated; segments out of the page cache read with ``O_DIRECT``, leaving it as it was; and
plain reads and writes on a file system that refuses ``O_DIRECT`` -- byte for byte the same
log."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from headrace.storage.cleaner import DIRECT_IO_ALIGNMENT_BYTES, Cleaner
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log
from headrace.storage.offset_map import OffsetMap
from tests.page_cache import cached_pages, drop_from_page_cache

from .cleaner_workload import NOW_MS, append_workload, compact_config, latest_values, read_records


class DirectIORefusingFileSystem(RealFileSystem):
    """Fails every open that asks for ``O_DIRECT`` with ``EINVAL``, as file systems without
    direct I/O do."""

    def open(self, path: Path, flags: int) -> int:
        if flags & os.O_DIRECT:
            raise OSError(errno.EINVAL, "O_DIRECT not supported", str(path))
        return super().open(path, flags)


def _cleaned_file_is_direct() -> list[bool]:
    """For each open ``.cleaned`` file of this process: whether its descriptor has O_DIRECT."""
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
            with open(f"/proc/self/fdinfo/{name}") as info:
                flags = next(int(line.split()[1], 8) for line in info
                             if line.startswith("flags:"))
        except (FileNotFoundError, StopIteration):
            continue
        if target.endswith(".log.cleaned"):
            found.append(bool(flags & os.O_DIRECT))
    return found


def _clean_and_watch(log: Log, stage_bytes: int) -> set[bool]:
    """Clean ``log`` with a ``stage_bytes`` stage; returns the O_DIRECT states of the
    ``.cleaned`` files seen open between spans."""
    seen: set[bool] = set()
    cleaner = Cleaner(OffsetMap(1 << 20), io_chunk_bytes=4096, span_bytes=4096,
                      direct_stage_bytes=stage_bytes,
                      on_chunk=lambda _log, _bytes: seen.update(_cleaned_file_is_direct()))
    cleaner.clean(log, 0, NOW_MS)
    return seen


def _segment_files(log: Log) -> dict[int, bytes]:
    return {segment.base_offset: segment.log_path.read_bytes() for segment in log.segments}


@pytest.fixture
def direct_io_supported(scratch):
    probe = scratch / "direct-io-probe"
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
    except OSError as error:
        if error.errno != errno.EINVAL:
            raise
        pytest.skip("the test directory's file system refuses O_DIRECT")
    finally:
        probe.unlink(missing_ok=True)


def _workload_log(path: Path, fs: RealFileSystem) -> tuple[Log, dict]:
    log = Log("t", 0, path, compact_config(segment_bytes=64 * 1024), fs, NOW_MS,
              recovery_point=0)
    oracle = append_workload(log, 31, keys=400, batches=1500, delete_fraction=0.1)
    log.roll(NOW_MS)
    return log, oracle


@pytest.mark.required_where("o_direct")
def test_direct_output_is_the_log_plain_writes_make(scratch, direct_io_supported, caplog):
    direct, oracle = _workload_log(scratch / "direct-0", RealFileSystem())
    plain, _ = _workload_log(scratch / "plain-0", DirectIORefusingFileSystem())
    # a one-block stage: both the spans and the recompressed chunks write whole stages
    assert _clean_and_watch(direct, DIRECT_IO_ALIGNMENT_BYTES) == {True}
    assert _clean_and_watch(plain, DIRECT_IO_ALIGNMENT_BYTES) == {False}
    direct_files = _segment_files(direct)
    assert direct_files == _segment_files(plain)
    closed_sizes = [len(data) for base, data in direct_files.items()
                    if base != direct.segments[-1].base_offset]
    assert any(size > DIRECT_IO_ALIGNMENT_BYTES for size in closed_sizes)
    assert any(size % DIRECT_IO_ALIGNMENT_BYTES for size in closed_sizes)  # unaligned tails
    assert latest_values(read_records(direct)) == oracle
    assert not [p for p in (scratch / "direct-0").iterdir() if p.name.endswith(".cleaned")]
    assert "rebuilding" not in caplog.text  # the cleaner's index covered each file exactly


@pytest.mark.required_where("o_direct")
def test_a_stage_larger_than_the_output_writes_only_the_padded_tail(scratch,
                                                                     direct_io_supported):
    direct, oracle = _workload_log(scratch / "direct-0", RealFileSystem())
    plain, _ = _workload_log(scratch / "plain-0", DirectIORefusingFileSystem())
    assert _clean_and_watch(direct, 1 << 20) == {True}
    _clean_and_watch(plain, 1 << 20)
    assert _segment_files(direct) == _segment_files(plain)
    assert latest_values(read_records(direct)) == oracle


def _cached_share_after_cleaning(log: Log) -> float:
    """Drop ``log``'s closed segments from the page cache, clean it in 64 KiB chunks and
    return the share of the pages of its segment files (those read, now ``.deleted``, and
    those written) that are in the page cache afterwards."""
    for segment in log.segments[:-1]:
        drop_from_page_cache(segment.log_path)
    Cleaner(OffsetMap(1 << 20), io_chunk_bytes=64 * 1024, span_bytes=64 * 1024).clean(
        log, 0, NOW_MS)
    active = log.segments[-1].log_path.name
    files = [path for path in log.dir.iterdir()
             if ".log" in path.name and path.name != active]
    pages = sum(-(-path.stat().st_size // 4096) for path in files)
    return sum(map(cached_pages, files)) / pages


@pytest.mark.required_where("o_direct", "cachestat")
def test_segments_out_of_the_page_cache_are_cleaned_without_filling_it(scratch,
                                                                        direct_io_supported):
    direct, oracle = _workload_log(scratch / "direct-0", RealFileSystem())
    plain, _ = _workload_log(scratch / "plain-0", DirectIORefusingFileSystem())
    # Only the pages the segments' header reads bring in (with their readahead: a quarter
    # of these small segments) are cached after a cleaning with direct reads; buffered
    # reads cache all they read.
    assert _cached_share_after_cleaning(direct) < 0.5
    assert _cached_share_after_cleaning(plain) > 0.9
    assert _segment_files(direct) == _segment_files(plain)
    assert latest_values(read_records(direct)) == oracle


def test_a_stage_that_is_not_whole_blocks_is_refused():
    with pytest.raises(ValueError, match="multiple"):
        Cleaner(OffsetMap(1 << 16), direct_stage_bytes=DIRECT_IO_ALIGNMENT_BYTES + 512)
