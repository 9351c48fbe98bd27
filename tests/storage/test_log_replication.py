"""The storage side of replication on real files: the managed high watermark and reads
bounded by it, a follower's appends of the leader's batches (offsets, epochs, producer state
and transactions kept), truncation by a follower (``truncate_to``) and a restart at a new
offset (``truncate_fully_and_start_at``)."""

from __future__ import annotations

import pytest

from headrace.errors import CorruptMessage, OffsetOutOfRange
from headrace.protocol.records import build_batch
from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log, UnexpectedAppendOffset
from tests.record_reading import iter_headers
from tests.storage.faulty_fs import MetadataForgettingFileSystem
from tests.storage.helpers import NOW_MS, assert_indexes_match_scan, open_log, read_all, reopen

PRODUCER_ID = 4_000
PRODUCER_EPOCH = 2


def _plain(count: int = 2, tag: bytes = b"v") -> bytes:
    return build_batch([(None, tag + b"%d" % i, (), NOW_MS) for i in range(count)])


def _idempotent(sequence: int, count: int = 2, transactional: bool = False) -> bytes:
    records = [(b"k%d" % i, b"v%d" % (sequence + i), (), NOW_MS) for i in range(count)]
    return build_batch(records, producer_id=PRODUCER_ID, producer_epoch=PRODUCER_EPOCH,
                       base_sequence=sequence, transactional=transactional)


def _offsets(log) -> list[int]:
    return [offset for offset, _ in read_all(log)]


def _copy(leader, follower, batch_by_batch: bool = False) -> None:
    """What a follower's fetch does: the leader's bytes from the follower's log end on (in
    one append, or one per batch, as small fetches would)."""
    batches = [batch for _, batch in read_all(leader, follower.log_end_offset)]
    for data in batches if batch_by_batch else [b"".join(batches)]:
        follower.append_as_follower(data, NOW_MS)


# ---- the high watermark -----------------------------------------------------------------

def test_the_high_watermark_follows_the_log_end_until_managed(scratch):
    log = open_log(scratch)
    log.append(_plain(3), NOW_MS)
    assert log.high_watermark == 3 and not log.high_watermark_managed
    log.manage_high_watermark(1)
    log.append(_plain(2), NOW_MS)
    assert (log.high_watermark, log.log_end_offset) == (1, 5)
    assert not log.update_high_watermark(0)  # never backwards
    assert log.update_high_watermark(3) and log.high_watermark == 3
    assert log.update_high_watermark(99) and log.high_watermark == 5  # clamped to the log end
    log.follow_log_end_offset()
    log.append(_plain(1), NOW_MS)
    assert log.high_watermark == 6
    with pytest.raises(ValueError):
        log.update_high_watermark(6)
    log.manage_high_watermark(-5)  # clamped to the log start
    assert log.high_watermark == 0
    log.close()


def test_reads_below_the_high_watermark_and_the_last_stable_offset_under_it(scratch):
    log = open_log(scratch)
    for _ in range(3):
        log.append(_plain(2), NOW_MS)
    log.append(_idempotent(0, transactional=True), NOW_MS)  # an open transaction at 6
    log.manage_high_watermark(4)
    result = log.read(0, 1 << 20, max_offset=log.high_watermark)
    data = b"".join(piece.read_bytes() for piece in result.slices)
    assert [h.base_offset for _, h in iter_headers(data, verify_crc=True)] == [0, 2]
    assert result.high_watermark == 4
    assert log.last_stable_offset == 4  # the transaction starts above the high watermark
    log.update_high_watermark(8)
    assert log.last_stable_offset == 6
    assert log.read(4, 1 << 20, max_offset=4).slices == ()
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(9)  # above the high watermark... and the log end
    log.manage_high_watermark(2)
    with pytest.raises(OffsetOutOfRange):
        log.delete_records_before(4)  # DeleteRecords stops at the high watermark
    log.close()


# ---- a follower's appends ---------------------------------------------------------------

def _leader_with_history(scratch):
    """A leader log across epochs 1 and 3 with plain, idempotent and transactional batches:
    an aborted transaction, a committed one, and one still open."""
    leader = open_log(scratch / "leader", segment_bytes=200)
    leader.append(_plain(2), NOW_MS, leader_epoch=1)
    leader.append(_idempotent(0), NOW_MS, leader_epoch=1)
    leader.append(_idempotent(2, transactional=True), NOW_MS, leader_epoch=1)
    leader.append_transaction_marker(PRODUCER_ID, PRODUCER_EPOCH, False, 0, NOW_MS,
                                     leader_epoch=1)
    leader.append(_plain(3), NOW_MS, leader_epoch=3)
    leader.append(_idempotent(4, transactional=True), NOW_MS, leader_epoch=3)
    leader.append_transaction_marker(PRODUCER_ID, PRODUCER_EPOCH, True, 0, NOW_MS,
                                     leader_epoch=3)
    leader.append(_idempotent(6, transactional=True), NOW_MS, leader_epoch=3)
    return leader


def test_a_follower_copies_batches_byte_for_byte_with_epochs_and_transactions(scratch):
    leader = _leader_with_history(scratch)
    follower = open_log(scratch / "follower", segment_bytes=200)
    early = b"".join(batch for offset, batch in read_all(leader) if offset < 9)
    assert follower.append_as_follower(early, NOW_MS).last_offset == 9  # a first fetch
    _copy(leader, follower)  # and a second
    assert read_all(follower) == read_all(leader)
    assert follower.log_end_offset == leader.log_end_offset == 15
    assert follower.leader_epoch_cache.entries() == leader.leader_epoch_cache.entries()
    assert follower.last_stable_offset == leader.last_stable_offset == 13
    assert follower.collect_aborted_transactions(0, 15) == \
        leader.collect_aborted_transactions(0, 15)
    assert len(follower.collect_aborted_transactions(0, 15)) == 1
    assert_indexes_match_scan(follower)
    follower = reopen(follower)
    assert follower.leader_epoch_cache.entries() == ((1, 0), (3, 7))
    assert read_all(follower) == read_all(leader)
    follower.close()
    leader.close()


def test_a_follower_turned_leader_recognises_an_idempotent_retry(scratch):
    leader = open_log(scratch / "leader")
    leader.append(_idempotent(0), NOW_MS, leader_epoch=1)
    first = leader.append(_idempotent(2), NOW_MS, leader_epoch=1)
    follower = open_log(scratch / "follower")
    _copy(leader, follower)
    retried = follower.append(_idempotent(2), NOW_MS, leader_epoch=2)  # the producer's retry
    assert retried.duplicate and (retried.base_offset, retried.last_offset) == \
        (first.base_offset, first.last_offset)
    assert follower.log_end_offset == 4
    assert follower.append(_idempotent(4), NOW_MS, leader_epoch=2).base_offset == 4
    assert follower.leader_epoch_cache.entries() == ((1, 0), (2, 4))
    follower.close()
    leader.close()


def _three_leader_batches(scratch) -> list[tuple[int, bytes]]:
    """(offset, bytes) of three two-record batches a leader of epoch 1 wrote."""
    leader = open_log(scratch / "leader")
    for _ in range(3):
        leader.append(_plain(2), NOW_MS, leader_epoch=1)
    batches = read_all(leader)
    leader.close()
    return batches


def test_a_follower_refuses_a_gap_an_overlap_and_a_bad_crc(scratch):
    batches = _three_leader_batches(scratch)
    follower = open_log(scratch / "follower")
    with pytest.raises(UnexpectedAppendOffset):
        follower.append_as_follower(batches[1][1], NOW_MS)  # offsets 2..3 onto an empty log
    follower.append_as_follower(batches[0][1], NOW_MS)
    with pytest.raises(UnexpectedAppendOffset):
        follower.append_as_follower(batches[0][1], NOW_MS)  # 0..1 again
    with pytest.raises(UnexpectedAppendOffset):  # a gap inside one fetch
        follower.append_as_follower(batches[1][1] + batches[1][1], NOW_MS)
    damaged = bytearray(batches[1][1])
    damaged[-1] ^= 1
    with pytest.raises(CorruptMessage):
        follower.append_as_follower(bytes(damaged), NOW_MS)
    assert follower.log_end_offset == 2 and _offsets(follower) == [0]
    follower.append_as_follower(batches[1][1] + batches[2][1][:30], NOW_MS)  # partial tail
    assert _offsets(follower) == [0, 2] and follower.log_end_offset == 4
    follower.close()


def test_a_compacted_follower_takes_the_gaps_the_leaders_cleaner_left(scratch):
    batches = _three_leader_batches(scratch)
    follower = open_log(scratch / "follower", cleanup_policy="compact")
    follower.append_as_follower(batches[0][1] + batches[2][1], NOW_MS)
    assert _offsets(follower) == [0, 4] and follower.log_end_offset == 6
    follower.close()


# ---- truncation -------------------------------------------------------------------------

def test_truncate_to_mid_segment_and_across_segments(scratch):
    leader = _leader_with_history(scratch)
    follower = open_log(scratch / "follower", segment_bytes=200, index_interval_bytes=1)
    _copy(leader, follower, batch_by_batch=True)
    assert len(follower.segments) >= 3
    assert all(segment.offset_index.entries for segment in follower.segments)
    expected = [(offset, batch) for offset, batch in read_all(leader) if offset < 6]
    follower.manage_high_watermark(15)
    assert follower.truncate_to(6, NOW_MS)  # drops the abort marker at 6 and everything after
    assert read_all(follower) == expected and follower.log_end_offset == 6
    assert follower.high_watermark == 6
    assert follower.leader_epoch_cache.entries() == ((1, 0),)
    assert follower.collect_aborted_transactions(0, 15) == []  # its marker is gone
    assert follower.last_stable_offset == 4  # the transaction at 4 is open again
    assert_indexes_match_scan(follower)
    assert not follower.truncate_to(6) and not follower.truncate_to(50)
    _copy(leader, follower)  # the follower catches up again from 6
    assert read_all(follower) == read_all(leader)
    assert follower.collect_aborted_transactions(0, 15) == \
        leader.collect_aborted_transactions(0, 15)
    follower = reopen(follower)
    assert follower.leader_epoch_cache.entries() == ((1, 0), (3, 7))
    assert read_all(follower) == read_all(leader)
    follower.close()
    leader.close()


def test_truncation_rebuilds_producer_state_from_an_older_snapshot(scratch):
    """Producer sequences written after the truncation point are forgotten: the retry of
    a truncated batch is appended again, not taken for a duplicate."""
    log = open_log(scratch, segment_bytes=200)
    for sequence in range(0, 12, 2):
        log.append(_idempotent(sequence), NOW_MS, leader_epoch=1)  # rolls take snapshots
    assert len(log.segments) >= 3
    log.truncate_to(6, NOW_MS)
    snapshots = log.producer_state.snapshot_offsets()
    assert snapshots and max(snapshots) <= 6
    again = log.append(_idempotent(6), NOW_MS, leader_epoch=2)
    assert not again.duplicate and again.base_offset == 6
    assert log.append(_idempotent(4), NOW_MS, leader_epoch=2).duplicate
    assert log.leader_epoch_cache.entries() == ((1, 0), (2, 6))
    log = reopen(log, clean=False, recovery_point=0)
    assert log.append(_idempotent(6), NOW_MS, leader_epoch=2).duplicate
    log.close()


def test_truncate_fully_and_start_at_restarts_an_empty_log(scratch):
    log = open_log(scratch, segment_bytes=300)
    for sequence in range(0, 8, 2):
        log.append(_idempotent(sequence), NOW_MS, leader_epoch=1)
    log.manage_high_watermark(4)
    log.truncate_fully_and_start_at(100, NOW_MS)
    assert (log.log_start_offset, log.log_end_offset, log.high_watermark) == (100, 100, 100)
    assert log.leader_epoch_cache.entries() == () and read_all(log) == []
    assert log.producer_state.snapshot_offsets() == []
    assert not log.append(_idempotent(0), NOW_MS, leader_epoch=4).duplicate  # state cleared
    log.truncate_to(50, NOW_MS)  # below the log start: restarted there
    assert (log.log_start_offset, log.log_end_offset) == (50, 50)
    log = reopen(log)
    assert (log.log_start_offset, log.log_end_offset) == (50, 50)
    log.append(_plain(2), NOW_MS, leader_epoch=5)
    assert _offsets(log) == [50]
    log.close()


def test_a_segment_truncated_mid_way_keeps_only_what_lies_below(scratch):
    """``LogSegment.truncate_to`` on its own: file, offset and time index entries and the
    aborted-transaction entries of the dropped batches go."""
    log = open_log(scratch, index_interval_bytes=1)
    log.append(_idempotent(0, transactional=True), NOW_MS)
    log.append_transaction_marker(PRODUCER_ID, PRODUCER_EPOCH, False, 0, NOW_MS)  # at 2
    log.append(_idempotent(2, transactional=True), NOW_MS)
    log.append_transaction_marker(PRODUCER_ID, PRODUCER_EPOCH, False, 0, NOW_MS)  # at 5
    log.append(_plain(2), NOW_MS)
    segment = log.segments[-1]
    assert [entry.last_offset for entry in segment.txn_index.entries] == [2, 5]
    positions = {header.base_offset: position for position, header in segment.iter_batches()}
    assert list(segment.offset_index.positions) == [positions[2], positions[3], positions[5],
                                                    positions[6]]
    size_before = segment.size_bytes
    assert segment.truncate_to(4) == size_before - positions[3]  # the bytes removed
    assert segment.size_bytes == positions[3]
    assert [entry.last_offset for entry in segment.txn_index.entries] == [2]
    assert list(segment.offset_index.positions) == [positions[2]]  # none past the cut
    assert segment.truncate_to(10) == 0
    log.close_without_flush()


class SyncCountingFileSystem(RealFileSystem):
    def __init__(self) -> None:
        self.fsyncs = 0

    def fsync(self, fd: int) -> None:
        self.fsyncs += 1
        super().fsync(fd)


def test_flush_up_to_syncs_only_what_is_not_yet_durable(scratch):
    fs = SyncCountingFileSystem()
    log = Log("t", 0, scratch / "t-0", LogConfig(), fs, NOW_MS, clean_shutdown=True)
    log.append(_plain(3), NOW_MS)
    log.append(_plain(2), NOW_MS)
    assert log.recovery_point == 0
    before = fs.fsyncs
    assert log.flush_up_to(3) == 5 and log.recovery_point == 5
    assert fs.fsyncs > before
    synced = fs.fsyncs
    assert log.flush_up_to(5) == 5 and fs.fsyncs == synced  # already durable: no fsync
    log.close()


def test_retention_keeps_what_lies_above_the_high_watermark(scratch):
    """A leader's followers may still need the records above the high watermark: retention
    deletes only segments wholly below it (Kafka's deletableSegments)."""
    log = open_log(scratch, segment_bytes=100, retention_bytes=0)
    for _ in range(6):
        log.append(_plain(2), NOW_MS)
    bases = [segment.base_offset for segment in log.segments]
    assert len(bases) >= 4
    log.manage_high_watermark(bases[2])
    assert log.delete_old_segments(NOW_MS) == 2
    assert log.log_start_offset == bases[2] and log.segments[0].base_offset == bases[2]
    log.update_high_watermark(log.log_end_offset)
    assert log.delete_old_segments(NOW_MS) == len(bases) - 3  # all sealed ones now
    log.close()


# ---- divergence after leader changes (KIP-101, KIP-279), on the storage API ---------------

def _truncate_by_epoch(follower, leader) -> int:
    """A follower's truncation as KIP-101/KIP-279 specify it, over the two logs' caches: ask
    the leader where the follower's latest epoch ends; when the leader answers an older
    epoch, the follower's own end of that epoch bounds the cut too; UNDEFINED falls back to
    the high watermark."""
    requested = follower.leader_epoch_cache.latest_epoch()
    if requested is None:
        offset = follower.high_watermark
    else:
        epoch, leader_end = leader.leader_epoch_cache.end_offset_for(requested)
        if epoch < 0:
            offset = follower.high_watermark
        else:
            _, own_end = follower.leader_epoch_cache.end_offset_for(epoch)
            offset = min(leader_end, own_end)
    follower.truncate_to(offset, NOW_MS)
    return offset


def _records(log) -> list[tuple[int, int, bytes]]:
    """(offset, epoch, batch bytes) of every batch."""
    return [(offset, int.from_bytes(batch[12:16], "big", signed=True), batch)
            for offset, batch in read_all(log)]


def test_kip_101_a_follower_truncates_by_epoch_not_by_high_watermark(scratch):
    """A (leader, epoch 1) writes m1 m2; B copies both, but A's high watermark reached only
    m1 when it failed over to B (epoch 2), which writes m3. A returning must keep m2 (a
    truncation to its high watermark would drop it, then re-copy it) and then copy m3."""
    a, b = open_log(scratch / "a"), open_log(scratch / "b")
    for log in (a, b):
        log.manage_high_watermark(0)
    a.append(_plain(1, b"m1"), NOW_MS, leader_epoch=1)
    a.append(_plain(1, b"m2"), NOW_MS, leader_epoch=1)
    _copy(a, b)
    a.update_high_watermark(1)
    b.append(_plain(1, b"m3"), NOW_MS, leader_epoch=2)
    assert _truncate_by_epoch(a, b) == 2  # B's epoch 1 ends at 2: nothing to cut
    _copy(b, a)
    assert _records(a) == _records(b)
    assert a.leader_epoch_cache.entries() == ((1, 0), (2, 2))
    a.close()
    b.close()


def test_kip_101_diverged_logs_converge_on_the_new_leader(scratch):
    """A and B both hold m1 (epoch 1); A alone also m2. Both fail; B returns first, leads in
    epoch 2 and writes m3 at offset 1. A returning must drop m2 and copy m3: a high-watermark
    truncation (HW 2 on A) would keep m2 where B has m3."""
    a, b = open_log(scratch / "a"), open_log(scratch / "b")
    a.manage_high_watermark(0)
    a.append(_plain(1, b"m1"), NOW_MS, leader_epoch=1)
    _copy(a, b)
    a.append(_plain(1, b"m2"), NOW_MS, leader_epoch=1)
    a.update_high_watermark(2)
    b.append(_plain(1, b"m3"), NOW_MS, leader_epoch=2)
    assert _truncate_by_epoch(a, b) == 1
    _copy(b, a)
    assert _records(a) == _records(b)
    assert a.leader_epoch_cache.entries() == ((1, 0), (2, 1)) and a.log_end_offset == 2
    a.close()
    b.close()


def test_kip_279_a_double_leader_change_converges(scratch):
    """A leads epoch 1 (m1 m2), B copies m1 only. B leads epoch 2 and writes m3 at 1, then
    fails before anyone copies it; A leads epoch 3 and writes m4 at 2. B returning asks for
    epoch 2, which A never had: A answers epoch 1 ending at 2, B's own epoch 1 ends at 1, so
    B cuts at 1 (dropping m3) and copies m2 m4 -- where a cut at A's answer alone would keep
    B's m3 at offset 1 against A's m2."""
    a, b = open_log(scratch / "a"), open_log(scratch / "b")
    a.append(_plain(1, b"m1"), NOW_MS, leader_epoch=1)
    _copy(a, b)
    a.append(_plain(1, b"m2"), NOW_MS, leader_epoch=1)
    b.append(_plain(1, b"m3"), NOW_MS, leader_epoch=2)
    a.append(_plain(1, b"m4"), NOW_MS, leader_epoch=3)
    assert a.leader_epoch_cache.end_offset_for(2) == (1, 2)
    assert _truncate_by_epoch(b, a) == 1
    _copy(a, b)
    assert _records(b) == _records(a)
    assert b.leader_epoch_cache.entries() == ((1, 0), (3, 2))
    a.close()
    b.close()


def test_a_truncation_survives_a_power_loss_right_after_it(scratch):
    """The cut file and the retired segments are durable when truncate_to returns: a power
    loss right after it, with a recovery point checkpointed before the cut (the worst case:
    loading trusts everything below it), does not bring the dropped tail back."""
    fs = MetadataForgettingFileSystem()
    config = LogConfig(segment_bytes=200, index_interval_bytes=1)
    log = Log("t", 0, scratch / "t-0", config, fs, NOW_MS, clean_shutdown=True)
    for _ in range(8):  # one epoch: the cut rewrites no epoch checkpoint (no directory sync)
        log.append(_plain(2), NOW_MS, leader_epoch=1)
    log.flush()
    checkpointed_recovery_point = log.recovery_point
    assert len(log.segments) >= 3 and checkpointed_recovery_point == 16
    log.truncate_to(6, NOW_MS)
    kept = read_all(log)
    log.close_without_flush()
    fs.crash()
    log = Log("t", 0, scratch / "t-0", config, RealFileSystem(), NOW_MS,
              recovery_point=checkpointed_recovery_point, clean_shutdown=False)
    assert log.log_end_offset == 6 and read_all(log) == kept
    assert log.leader_epoch_cache.entries() == ((1, 0),)
    log.close()


def test_a_restart_at_a_new_offset_survives_a_power_loss_right_after_it(scratch):
    fs = MetadataForgettingFileSystem()
    config = LogConfig(segment_bytes=200)
    log = Log("t", 0, scratch / "t-0", config, fs, NOW_MS, clean_shutdown=True)
    for offset in range(0, 12, 2):  # copied batches from before leader epochs (-1)
        log.append_as_follower(build_batch([(None, b"v", (), NOW_MS)] * 2, base_offset=offset,
                                           partition_leader_epoch=-1), NOW_MS)
    log.flush()
    assert log.leader_epoch_cache.entries() == ()  # so no checkpoint write syncs the directory
    log.truncate_fully_and_start_at(100, NOW_MS)
    log.close_without_flush()
    fs.crash()
    log = Log("t", 0, scratch / "t-0", config, RealFileSystem(), NOW_MS, recovery_point=12,
              clean_shutdown=False)
    assert (log.log_start_offset, log.log_end_offset, read_all(log)) == (100, 100, [])
    log.close()
