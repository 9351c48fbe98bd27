"""The leader-epoch cache (``leader_epoch_cache``) on its own, against the cases of Kafka's
``LeaderEpochFileCacheTest``, and inside a ``Log``: every append stamps its epoch into the
batches, the first append of an epoch records where it starts, the checkpoint survives a
restart, a torn checkpoint is rebuilt from the batches, and recovery, retention and
DeleteRecords keep the cache within the log."""

from __future__ import annotations

import random

import pytest

from headrace.errors import FencedLeaderEpoch
from headrace.storage.checkpoint import CheckpointCorrupt
from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.leader_epoch_cache import (
    LEADER_EPOCH_CHECKPOINT,
    UNDEFINED_EPOCH,
    EpochEntry,
    LeaderEpochCache,
)
from headrace.storage.log import Log
from headrace.storage.log_loader import rebuild_producer_state
from headrace.storage.producer_state import ProducerStateManager
from tests.record_reading import iter_headers
from tests.storage.batches import build_batch
from tests.storage.faulty_fs import CrashingFileSystem
from tests.storage.helpers import NOW_MS, open_log, read_all, reopen

UNDEFINED = (-1, -1)


def _cache(directory, entries=(), log_end_offset=100) -> LeaderEpochCache:
    cache = LeaderEpochCache(RealFileSystem(), directory, lambda: log_end_offset)
    for epoch, start_offset in entries:
        cache.assign(epoch, start_offset)
    return cache


# (assigned entries, requested epoch, expected (epoch, end offset)); log end offset 100.
END_OFFSET_CASES = [
    ([], 0, UNDEFINED),  # shouldReturnUnsupportedIfNoEpochRecorded
    ([], UNDEFINED_EPOCH, UNDEFINED),
    ([(2, 5)], UNDEFINED_EPOCH, UNDEFINED),  # shouldReturnUndefinedOffsetIfUndefinedEpochRequested
    ([(2, 5)], 2, (2, 100)),  # the latest epoch: the log end offset
    ([(2, 6), (3, 8)], 4, UNDEFINED),  # newer than any epoch the cache tracks
    ([(5, 11), (6, 12), (7, 13)], 4, (4, 11)),  # older than the first: the first's start
    ([(0, 10), (2, 13), (4, 17)], 1, (0, 13)),  # largest epoch <= 1, next epoch's start
    ([(0, 10), (2, 13), (4, 17)], 2, (2, 17)),
    ([(0, 10), (2, 13), (4, 17)], 3, (2, 17)),
    ([(1, 11), (1, 12), (2, 13), (2, 14), (3, 15), (3, 16)], 2, (2, 15)),
    ([(5, 11), (6, 12), (7, 13), (7, 12)], 5, (5, 12)),  # epoch 7 moved to an earlier start
    ([(5, 11), (6, 12), (7, 13), (7, 12)], 6, (5, 12)),
    ([(0, 0), (1, 5), (2, 10)], 0, (0, 5)),
    ([(0, 0), (1, 5), (2, 10)], 1, (1, 10)),
]


@pytest.mark.parametrize(("entries", "requested", "expected"), END_OFFSET_CASES)
def test_end_offset_for_answers_as_kafka(scratch, entries, requested, expected):
    assert _cache(scratch, entries).end_offset_for(requested) == expected


@pytest.mark.parametrize(("entries", "expected"), [
    ([(2, 6), (2, 7), (2, 9)], [(2, 6)]),  # the same epoch never moves to a later start
    ([(2, 6), (3, 8), (1, 9)], [(1, 9)]),  # an older epoch removes every later entry
    ([(2, 6), (3, 8), (4, 7)], [(2, 6), (4, 7)]),  # an earlier start removes the later ones
    ([(2, 6), (3, 8), (3, 7)], [(2, 6), (3, 7)]),
])
def test_assign_keeps_epochs_and_start_offsets_increasing(scratch, entries, expected):
    assert _cache(scratch, entries).entries() == tuple(EpochEntry(*e) for e in expected)


def test_assign_refuses_negative_epochs_and_offsets(scratch):
    cache = _cache(scratch)
    for epoch, start_offset in ((-1, 0), (0, -1)):
        with pytest.raises(ValueError):
            cache.assign(epoch, start_offset)
    assert cache.entries() == ()


ENTRIES = [(2, 6), (3, 8), (4, 11)]


@pytest.mark.parametrize(("offset", "expected"), [
    (8, [(2, 6)]),  # shouldDropEntriesOnEpochBoundaryWhenRemovingLatestEntries
    (9, [(2, 6), (3, 8)]),  # shouldDropEntriesBetweenEpochBoundaryWhenRemovingNewest
    (-1, ENTRIES),  # shouldNotResetEpochHistoryTailIfUndefinedPassed
    (12, ENTRIES),
    (6, []),
])
def test_truncate_from_end(scratch, offset, expected):
    cache = _cache(scratch, ENTRIES)
    cache.truncate_from_end(offset)
    assert cache.entries() == tuple(EpochEntry(*e) for e in expected)
    assert _cache(scratch).entries() == cache.entries()  # written to the checkpoint


@pytest.mark.parametrize(("offset", "expected"), [
    (8, [(3, 8), (4, 11)]),  # shouldPreserveResetOffsetOnClearEarliestIfOneExists
    (9, [(3, 9), (4, 11)]),  # shouldUpdateSavedOffsetWhenOffsetToClearToIsBetweenEpochs
    (1, ENTRIES),  # shouldNotClearAnythingIfOffsetToEarly
    (6, ENTRIES),  # shouldNotClearAnythingIfOffsetToFirstOffset
    (11, [(4, 11)]),  # shouldRetainLatestEpochOnClearAllEarliest
    (15, [(4, 15)]),  # shouldRetainLatestEpochOnClearAllEarliestAndUpdateItsOffset
    (-1, ENTRIES),  # shouldNotResetEpochHistoryHeadIfUndefinedPassed
])
def test_truncate_from_start(scratch, offset, expected):
    cache = _cache(scratch, ENTRIES)
    cache.truncate_from_start(offset)
    assert cache.entries() == tuple(EpochEntry(*e) for e in expected)
    assert _cache(scratch).entries() == cache.entries()


def test_checkpoint_round_trip_in_kafkas_format(scratch):
    cache = _cache(scratch, [(0, 0), (3, 120), (7, 4000)])
    assert (scratch / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n3\n0 0\n3 120\n7 4000\n"
    assert _cache(scratch).entries() == cache.entries()
    assert cache.epoch_for_offset(119) == 0 and cache.epoch_for_offset(120) == 3
    assert cache.epoch_for_offset(10**6) == 7


@pytest.mark.parametrize("content", [
    "0\n2\n0 0\n", "0\n1\n0 0\n3 1", "1\n0\n", "", "0\n2\n3 5\n1 9\n", "0\n1\nx 0\n",
])
def test_a_checkpoint_that_does_not_parse_is_reported(scratch, content):
    (scratch / LEADER_EPOCH_CHECKPOINT).write_text(content)
    with pytest.raises(CheckpointCorrupt):
        _cache(scratch)


def _stored_epochs(log) -> list[tuple[int, int]]:
    """(base offset, partitionLeaderEpoch) of every batch the log holds."""
    found = []
    for _, data in read_all(log):
        for _, header in iter_headers(data, verify_crc=True):
            found.append((header.base_offset, header.partition_leader_epoch))
    return found


def _append_each_way(log, leader_epoch: int) -> None:
    """One batch through the kernel's single-batch path (once a general append opened it),
    an idempotent producer's batch, two batches in one request, a transaction marker."""
    log.append(build_batch([b"a", b"b"]), NOW_MS, leader_epoch=leader_epoch)
    log.append(build_batch([b"c"]), NOW_MS, leader_epoch=leader_epoch)
    log.append(build_batch([b"d"], producer_id=leader_epoch + 100, producer_epoch=0,
                           base_sequence=0), NOW_MS, leader_epoch=leader_epoch)
    log.append(build_batch([b"e"]) + build_batch([b"f"]), NOW_MS, leader_epoch=leader_epoch)
    log.append_transaction_marker(leader_epoch + 100, 0, True, 0, NOW_MS,
                                  leader_epoch=leader_epoch)


def test_every_append_path_stamps_the_epoch_and_new_epochs_are_recorded(scratch):
    log = open_log(scratch)
    _append_each_way(log, 0)
    _append_each_way(log, 3)
    _append_each_way(log, 4)
    stored = _stored_epochs(log)
    assert [epoch for _, epoch in stored] == [0] * 6 + [3] * 6 + [4] * 6
    assert log.leader_epoch_cache.entries() == ((0, 0), (3, 7), (4, 14))
    assert log.leader_epoch_cache.end_offset_for(3) == (3, 14)
    assert log.leader_epoch_cache.end_offset_for(4) == (4, log.log_end_offset)
    log = reopen(log)
    assert log.leader_epoch_cache.entries() == ((0, 0), (3, 7), (4, 14))
    assert _stored_epochs(log) == stored
    log.close()


def test_an_append_in_an_older_epoch_is_fenced_and_writes_nothing(scratch):
    log = open_log(scratch)
    log.append(build_batch([b"a"]), NOW_MS, leader_epoch=5)
    with pytest.raises(FencedLeaderEpoch):
        log.append(build_batch([b"b"]), NOW_MS, leader_epoch=4)
    assert log.log_end_offset == 1 and log.leader_epoch_cache.entries() == ((5, 0),)
    log.close()


def test_a_torn_checkpoint_is_rebuilt_from_the_batches(scratch):
    log = open_log(scratch)
    for epoch in (1, 1, 2, 6, 6):
        log.append(build_batch([b"x", b"y"]), NOW_MS, leader_epoch=epoch)
    log.close()
    (log.dir / LEADER_EPOCH_CHECKPOINT).write_text("0\n3\n1 0\n2 4")  # torn mid-write
    log = open_log(scratch)
    assert log.leader_epoch_cache.entries() == ((1, 0), (2, 4), (6, 6))
    assert (log.dir / LEADER_EPOCH_CHECKPOINT).read_text() == "0\n3\n1 0\n2 4\n6 6\n"
    log.close()


def test_recovery_drops_entries_past_the_recovered_log_end(scratch):
    """A crash loses the unflushed batches of epoch 2 but the checkpoint (written before
    them) names the epoch: loading truncates the cache to the recovered log."""
    log = open_log(scratch)
    log.append(build_batch([b"a", b"b"]), NOW_MS, leader_epoch=1)
    log.flush()
    log.append(build_batch([b"c"]), NOW_MS, leader_epoch=2)
    segment = log.segments[-1].log_path
    assert log.leader_epoch_cache.entries() == ((1, 0), (2, 2))
    log.close_without_flush()
    with open(segment, "r+b") as file:  # the unflushed batch never reached the disk
        file.truncate(len(read_all_bytes_below(segment, 2)))
    log = reopen(log, clean=False, recovery_point=2)
    assert log.log_end_offset == 2
    assert log.leader_epoch_cache.entries() == ((1, 0),)
    log.append(build_batch([b"d"]), NOW_MS, leader_epoch=3)
    assert log.leader_epoch_cache.entries() == ((1, 0), (3, 2))
    log.close()


def read_all_bytes_below(path, offset: int) -> bytes:
    data = path.read_bytes()
    for position, header in iter_headers(data, verify_crc=True):
        if header.base_offset >= offset:
            return data[:position]
    return data


def test_retention_and_delete_records_move_the_first_entry(scratch):
    log = open_log(scratch, segment_bytes=200)
    for epoch in (1, 1, 1, 2, 2, 2, 3, 3):
        log.append(build_batch([b"v" * 40]), NOW_MS, leader_epoch=epoch)
    assert log.leader_epoch_cache.entries() == ((1, 0), (2, 3), (3, 6))
    log.delete_records_before(4)
    assert log.leader_epoch_cache.entries() == ((2, 4), (3, 6))
    log.delete_old_segments(NOW_MS)
    assert log.leader_epoch_cache.entries()[0].start_offset == log.log_start_offset
    log = reopen(log)
    assert log.leader_epoch_cache.entries() == ((2, log.log_start_offset), (3, 6))
    log.close()


def _epochs_of_batches(log) -> tuple[EpochEntry, ...]:
    """The cache the log's batches imply: each epoch from its first batch on."""
    entries: list[EpochEntry] = []
    for offset, epoch in _stored_epochs(log):
        if not entries or epoch > entries[-1].epoch:
            entries.append(EpochEntry(epoch, offset))
    return tuple(entries)


def _replayed_producers(log) -> bytes:
    """The producer state a replay of the whole log (no snapshot) computes."""
    replayed = ProducerStateManager(RealFileSystem(), log.dir / "no-snapshots")
    rebuild_producer_state(replayed, list(log.segments), -1, log.log_end_offset)
    return replayed.encode()


def test_epochs_and_producer_state_match_the_log_after_crashes(scratch):
    """Seeded crashes losing the unsynced tail (torn, garbled) of a log written across
    epochs by idempotent producers: after recovery the epoch cache is exactly what the
    surviving batches say, and producer state is what a full replay computes."""
    rng = random.Random(4242)
    for round_number in range(12):
        fs = CrashingFileSystem(rng)
        path = scratch / f"round-{round_number}"
        (path / "no-snapshots").mkdir(parents=True)
        log = Log("t", 0, path, LogConfig(segment_bytes=600), fs, NOW_MS, clean_shutdown=True)
        epoch, sequences = 0, {1: 0, 2: 0}
        for _ in range(rng.randint(5, 30)):
            epoch += rng.random() < 0.3
            producer_id = rng.choice([1, 2])
            log.append(build_batch([b"v"] * 2, producer_id=producer_id, producer_epoch=0,
                                   base_sequence=sequences[producer_id]), NOW_MS,
                       leader_epoch=epoch)
            sequences[producer_id] += 2
            if rng.random() < 0.2:
                log.flush()
        recovery_point = log.recovery_point
        log.close_without_flush()
        fs.crash()
        log = Log("t", 0, path, LogConfig(segment_bytes=600), RealFileSystem(), NOW_MS,
                  recovery_point=recovery_point, clean_shutdown=False)
        assert log.leader_epoch_cache.entries() == _epochs_of_batches(log)
        assert log.producer_state.encode() == _replayed_producers(log)
        log.close()


def test_retention_moves_the_first_entry_to_the_new_log_start(scratch):
    log = open_log(scratch, segment_bytes=200, retention_bytes=250)
    for epoch in (1, 1, 1, 2, 2, 2, 3, 3):
        log.append(build_batch([b"v" * 40]), NOW_MS, leader_epoch=epoch)
    assert log.delete_old_segments(NOW_MS) > 0 and log.log_start_offset > 3
    assert log.leader_epoch_cache.entries()[0] == (2, log.log_start_offset)
    log.close()


def test_appends_without_an_epoch_stamp_the_one_the_log_was_given(scratch):
    """Produce, the coordinators' records and transaction markers name no epoch: they take
    the one ``set_leader_epoch`` gave the log (0 until then)."""
    log = open_log(scratch)
    log.append(build_batch([b"a"]), NOW_MS)
    log.set_leader_epoch(6)
    log.append(build_batch([b"b"]), NOW_MS)
    log.append(build_batch([b"c"]) + build_batch([b"d"]), NOW_MS)
    log.append_transaction_marker(9, 0, False, 0, NOW_MS)
    assert [epoch for _, epoch in _stored_epochs(log)] == [0, 6, 6, 6, 6]
    assert log.leader_epoch_cache.entries() == ((0, 0), (6, 1))
    for stale in (5, -1):
        with pytest.raises(ValueError):
            log.set_leader_epoch(stale)
    assert log.leader_epoch == 6
    log.close()


def test_the_first_append_of_an_epoch_is_not_hinted_free_of_io(scratch):
    """It writes and fsyncs the checkpoint, so the broker must not run it on its event loop."""
    log = open_log(scratch)
    request = build_batch([b"a"])
    assert not log.append_needs_no_io_wait(len(request), NOW_MS, request)  # the first append
    log.append(request, NOW_MS)
    assert log.append_needs_no_io_wait(len(request), NOW_MS, request)
    assert not log.append_needs_no_io_wait(len(request), NOW_MS, request, leader_epoch=3)
    log.set_leader_epoch(2)
    assert not log.append_needs_no_io_wait(len(request), NOW_MS, request)
    log.append(request, NOW_MS)
    assert log.append_needs_no_io_wait(len(request), NOW_MS, request)
    assert log.append_needs_no_io_wait(len(request), NOW_MS, request, leader_epoch=2)
    log.close()
