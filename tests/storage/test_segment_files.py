"""Sealed segments open their files only when used, under a budget of open segments
(``headrace.storage.segment_files``), on real files: a reloaded log holds no more than the
budget, every record stays readable, a slice keeps its descriptor after its segment lets go
of it, and a segment retired while its files were closed is still read through an old view."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from headrace.storage import segment_files
from headrace.storage.segment_files import DESCRIPTORS_PER_SEGMENT, SealedSegmentFiles
from tests.storage.batches import build_batch
from tests.storage.helpers import NOW_MS, open_log, read_all, reopen

SMALL_BUDGET_SEGMENTS = 3
SEGMENT_BYTES = 1024
BATCHES = 120  # about 30 segments of SEGMENT_BYTES
ACTIVE_SEGMENT_DESCRIPTORS = 3
MOST_OPEN_DESCRIPTORS = SMALL_BUDGET_SEGMENTS * DESCRIPTORS_PER_SEGMENT + ACTIVE_SEGMENT_DESCRIPTORS


@pytest.fixture
def small_budget(monkeypatch) -> SealedSegmentFiles:
    """The process's open-segment budget replaced by a small one for the test."""
    files = SealedSegmentFiles(SMALL_BUDGET_SEGMENTS)
    monkeypatch.setattr(segment_files, "_sealed_segment_files", files)
    return files


def _descriptors_under(directory: Path) -> int:
    """This process's open descriptors whose file lies in ``directory``."""
    count = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, closed meanwhile
            continue
        count += target.startswith(f"{directory}/")
    return count


def _filled_log(scratch: Path):
    log = open_log(scratch, segment_bytes=SEGMENT_BYTES)
    for n in range(BATCHES):
        log.append(build_batch([f"value-{n}-".encode() * 10]), NOW_MS)
    assert len(log.segments) > 4 * SMALL_BUDGET_SEGMENTS
    return log


def test_a_reloaded_log_holds_no_more_than_the_budget_and_reads_everything(scratch,
                                                                           small_budget):
    log = _filled_log(scratch)
    expected = read_all(log)
    log = reopen(log)
    try:
        assert _descriptors_under(log.dir) <= MOST_OPEN_DESCRIPTORS
        assert read_all(log) == expected
        assert _descriptors_under(log.dir) <= MOST_OPEN_DESCRIPTORS
        assert small_budget.open_segments <= SMALL_BUDGET_SEGMENTS
    finally:
        log.close()
    assert _descriptors_under(log.dir) == 0


def test_a_slice_keeps_its_descriptor_after_its_segment_lets_go(scratch, small_budget):
    log = _filled_log(scratch)
    try:
        first = log.read(0, SEGMENT_BYTES)
        expected = first.slices[0].read_bytes()
        read_all(log)  # every other segment opens: the first one lets go of its files
        assert log.segments[0]._log_file is None
        assert first.slices[0].read_bytes() == expected
        assert os.readlink(f"/proc/self/fd/{first.slices[0].fd}") == str(
            log.segments[0].log_path)
    finally:
        log.close()


def test_a_segment_retired_while_closed_is_read_through_an_old_view(scratch, small_budget):
    log = _filled_log(scratch)
    try:
        old_segments = log.segments
        first_batches = old_segments[0].slice(old_segments[0].find_batch(0, SEGMENT_BYTES),
                                              SEGMENT_BYTES, old_segments[0].size_bytes,
                                              True).read_bytes()
        read_all(log)  # the first segment lets go of its files
        assert old_segments[0]._log_file is None
        log.delete_records_before(old_segments[1].base_offset)
        assert log.delete_old_segments(NOW_MS) == 1
        assert not old_segments[0].log_path.exists()  # renamed to .deleted
        location = old_segments[0].find_batch(0, old_segments[0].size_bytes)
        again = old_segments[0].slice(location, SEGMENT_BYTES, old_segments[0].size_bytes,
                                      True)
        assert again.read_bytes() == first_batches
    finally:
        log.close()


def test_a_pinned_segment_keeps_its_files_while_others_open(scratch, small_budget):
    """What the cleaner relies on while it walks a segment with ``segment.fd``."""
    log = _filled_log(scratch)
    try:
        walked = log.segments[0]
        with walked.pinned() as fd:
            read_all(log)  # every other sealed segment opens: more than the budget
            assert walked._log_file is not None and walked.fd == fd
            assert os.readlink(f"/proc/self/fd/{fd}") == str(walked.log_path)
        read_all(log)
        assert walked._log_file is None  # unpinned: it lets go again
    finally:
        log.close()
