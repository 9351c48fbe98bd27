"""``PartitionLeader``'s rules on a real log and a hand-driven clock: Kafka's last-caught-up
time (a follower always one produce behind stays in sync; a stuck one does not), the high
watermark over the maximal ISR and over caught-up followers outside it, expansion only at the
high watermark and the epoch's start, and the acks=all waits it completes."""

from __future__ import annotations

import asyncio

from headrace.cluster.partition_leader import PURGE_INTERVAL_REQUESTS, PartitionLeader
from headrace.cluster.zookeeper_records import PartitionState
from headrace.errors import FencedLeaderEpoch, NotEnoughReplicasAfterAppend, UnknownLeaderEpoch
from headrace.protocol.records import build_batch
from tests.storage.helpers import NOW_MS, open_log

LAG_TIME_MAX_MS = 10_000
LEADER, FOLLOWER, OTHER = 1, 2, 3


def _leader(path, isr=(LEADER, FOLLOWER, OTHER), min_insync_replicas: int = 1):
    log = open_log(path, min_insync_replicas=min_insync_replicas)
    log.manage_high_watermark(0)
    state = PartitionState(leader=LEADER, leader_epoch=0, isr=tuple(isr), controller_epoch=1)
    return PartitionLeader(LEADER, log, state, 0, (LEADER, FOLLOWER, OTHER), NOW_MS,
                           LAG_TIME_MAX_MS)


def _append(leader: PartitionLeader, count: int = 1) -> int:
    for _ in range(count):
        leader.log.append(build_batch([(b"k", b"v", [], NOW_MS)]), NOW_MS, True)
    return leader.log.log_end_offset


def test_a_follower_always_one_produce_behind_stays_in_sync_and_a_stuck_one_does_not(tmp_path):
    leader = _leader(tmp_path)
    now = NOW_MS
    for _ in range(5):  # each fetch reaches the leader's end as of the previous fetch
        now += LAG_TIME_MAX_MS // 2
        end_before = leader.log.log_end_offset
        _append(leader)
        leader.record_follower_fetch(FOLLOWER, end_before, 0, -1, now)
    assert leader.followers[FOLLOWER].log_end_offset < leader.log.log_end_offset
    assert leader.out_of_sync_followers(now) == {OTHER}  # OTHER never fetched


def test_the_high_watermark_waits_for_the_maximal_isr_and_caught_up_followers(tmp_path):
    leader = _leader(tmp_path, isr=(LEADER, FOLLOWER))
    leader.record_follower_fetch(OTHER, _append(leader), 0, -1, NOW_MS)  # caught up, not in ISR
    end = _append(leader, 2)
    leader.record_follower_fetch(FOLLOWER, end, 0, -1, NOW_MS)
    assert leader.maybe_advance_high_watermark(NOW_MS)
    assert leader.log.high_watermark == 1
    later = NOW_MS + LAG_TIME_MAX_MS + 1  # OTHER no longer caught up: it holds nothing back
    leader.record_follower_fetch(FOLLOWER, end, 0, -1, later)
    assert leader.maybe_advance_high_watermark(later)
    assert leader.log.high_watermark == end
    leader.propose(frozenset({LEADER, FOLLOWER, OTHER}))  # an expansion in flight counts
    end = _append(leader)
    leader.record_follower_fetch(FOLLOWER, end, 0, -1, later)
    assert not leader.maybe_advance_high_watermark(later)
    assert leader.log.high_watermark == end - 1


def test_a_follower_joins_only_at_the_high_watermark_and_the_epochs_start(tmp_path):
    leader = _leader(tmp_path, isr=(LEADER, FOLLOWER))
    end = _append(leader, 2)
    leader.record_follower_fetch(FOLLOWER, end, 0, -1, NOW_MS)
    leader.maybe_advance_high_watermark(NOW_MS)
    leader.record_follower_fetch(OTHER, end - 1, 0, -1, NOW_MS)
    assert not leader.follower_to_add(OTHER)
    leader.record_follower_fetch(OTHER, end, 0, -1, NOW_MS)
    assert leader.follower_to_add(OTHER)


def test_acks_all_waits_complete_with_the_isr_they_end_with(tmp_path):
    async def scenario() -> tuple[int, int]:
        leader = _leader(tmp_path, isr=(LEADER, FOLLOWER), min_insync_replicas=2)
        end = _append(leader)
        replicated = leader.wait_for(end)
        assert not replicated.done()
        leader.record_follower_fetch(FOLLOWER, end, 0, -1, NOW_MS)
        leader.maybe_advance_high_watermark(NOW_MS)
        end = _append(leader)
        after_shrink = leader.wait_for(end)
        leader.isr_written(frozenset({LEADER}), 1)  # FOLLOWER left; a flush made it durable
        leader.log.flush()
        leader.maybe_advance_high_watermark(NOW_MS + LAG_TIME_MAX_MS + 1)
        return replicated.result(), after_shrink.result()

    assert asyncio.run(scenario()) == (0, NotEnoughReplicasAfterAppend.code)


def test_waits_that_timed_out_are_purged_from_the_purgatory(tmp_path):
    async def scenario() -> int:
        leader = _leader(tmp_path)
        for _ in range(3 * PURGE_INTERVAL_REQUESTS):
            leader.wait_for(1).cancel()  # as a produce request's timeout does
        return leader.waiter_count

    assert asyncio.run(scenario()) <= PURGE_INTERVAL_REQUESTS


def test_a_fetch_in_another_leader_epoch_is_refused_and_records_nothing(tmp_path):
    # Kafka's checkCurrentLeaderEpoch on the leader's own epoch (2 here): a follower of a newer
    # epoch never moves a deposed leader's high watermark; -1 names no epoch.
    log = open_log(tmp_path)
    log.manage_high_watermark(0)
    leader = PartitionLeader(LEADER, log, PartitionState(LEADER, 2, (LEADER, FOLLOWER), 1), 0,
                             (LEADER, FOLLOWER, OTHER), NOW_MS, LAG_TIME_MAX_MS)
    end = _append(leader, 3)
    refused = []
    for epoch, error in ((3, UnknownLeaderEpoch), (1, FencedLeaderEpoch)):
        try:
            leader.record_follower_fetch(FOLLOWER, end, 0, epoch, NOW_MS)
        except error:
            refused.append(epoch)
    leader.maybe_advance_high_watermark(NOW_MS)
    assert (refused, leader.followers[FOLLOWER].log_end_offset, leader.log.high_watermark) \
        == ([3, 1], -1, 0)
    leader.record_follower_fetch(FOLLOWER, end, 0, 2, NOW_MS)  # its own epoch: recorded
    leader.maybe_advance_high_watermark(NOW_MS)
    assert leader.log.high_watermark == end
