"""Truncation by leader epoch (``replica_fetcher.truncation_offset``) between two real
leader-epoch caches (``headrace.storage.leader_epoch_cache`` with their checkpoint files): the
follower asks for its latest epoch, the leader answers ``end_offset_for`` it, the follower
truncates and asks again until the answer is complete -- KIP-101's single step, KIP-279's
steps down through epochs the leader never had, and the fallbacks when the leader answers
UNDEFINED. The fetcher against real brokers is in tests/cluster/test_replica_fetcher.py."""

from __future__ import annotations

from headrace.broker.replica_fetcher import epoch_to_ask, truncation_offset
from headrace.storage.fs import RealFileSystem
from headrace.storage.leader_epoch_cache import LeaderEpochCache

MAX_ROUNDS = 10


class Replica:
    """A log end offset and a real epoch cache, truncated as ``Log.truncate_to`` does."""

    def __init__(self, directory, entries: list[tuple[int, int]], log_end_offset: int,
                 high_watermark: int = 0) -> None:
        directory.mkdir()
        self.log_end_offset = log_end_offset
        self.high_watermark = high_watermark
        self.cache = LeaderEpochCache(RealFileSystem(), directory, lambda: self.log_end_offset)
        for epoch, start_offset in entries:
            self.cache.assign(epoch, start_offset)

    def truncate_to(self, offset: int) -> None:
        if offset < self.log_end_offset:
            self.log_end_offset = offset
            self.cache.truncate_from_end(offset)
            self.high_watermark = min(self.high_watermark, offset)


def truncate_by_epoch(follower: Replica, leader: Replica) -> tuple[int, int]:
    """The follower's truncation loop: (final log end offset, OffsetForLeaderEpoch rounds)."""
    next_epoch = None
    for rounds in range(1, MAX_ROUNDS + 1):
        epoch = epoch_to_ask(next_epoch, follower.cache)
        leader_epoch, leader_end = leader.cache.end_offset_for(epoch)
        offset, next_epoch = truncation_offset(
            follower.log_end_offset, follower.high_watermark, leader_epoch, leader_end,
            follower.cache.end_offset_for)
        follower.truncate_to(offset)
        if next_epoch is None:
            return follower.log_end_offset, rounds
    raise AssertionError(f"truncation not complete after {MAX_ROUNDS} rounds")


def test_kip_101_truncates_to_where_the_epochs_part(tmp_path):
    # The follower led epoch 1 and wrote offsets 5-6 the new leader (epoch 2) never had.
    leader = Replica(tmp_path / "leader", [(0, 0), (2, 5)], 8)
    follower = Replica(tmp_path / "follower", [(0, 0), (1, 5)], 7, high_watermark=7)
    assert truncate_by_epoch(follower, leader) == (5, 1)


def test_kip_279_steps_down_through_an_epoch_the_leader_never_had(tmp_path):
    # Double failover: the leader has epochs 0, 1, 3; the follower 0 and 2. The leader
    # answers epoch 1 for the follower's 2, which the follower does not have: it truncates
    # to the end of its epoch 0 (3), asks again for 0, and the leader's epoch 0 ends at 2.
    leader = Replica(tmp_path / "leader", [(0, 0), (1, 2), (3, 4)], 9)
    follower = Replica(tmp_path / "follower", [(0, 0), (2, 3)], 6, high_watermark=6)
    assert truncate_by_epoch(follower, leader) == (2, 2)
    assert follower.cache.entries() == ((0, 0),)


def test_a_log_that_agrees_is_not_truncated(tmp_path):
    leader = Replica(tmp_path / "leader", [(0, 0), (1, 10)], 20)
    follower = Replica(tmp_path / "follower", [(0, 0), (1, 10)], 15, high_watermark=12)
    assert truncate_by_epoch(follower, leader) == (15, 1)


def test_the_high_watermark_only_when_the_leader_answers_undefined(tmp_path):
    # The follower's latest epoch (7) is newer than any the leader knows: UNDEFINED.
    leader = Replica(tmp_path / "leader", [(0, 0)], 20)
    follower = Replica(tmp_path / "follower", [(0, 0), (7, 12)], 15, high_watermark=11)
    assert truncate_by_epoch(follower, leader) == (11, 1)


def test_an_epoch_older_than_the_followers_first_ends_where_its_first_starts(tmp_path):
    # The leader answers epoch 2 ending at 6; the follower's cache starts at epoch 3 at 5
    # (older entries went with its log start): as Kafka's endOffsetFor, its epoch 2 ends at 5.
    leader = Replica(tmp_path / "leader", [(2, 0), (4, 6)], 9)
    follower = Replica(tmp_path / "follower", [(3, 5)], 8, high_watermark=5)
    assert truncate_by_epoch(follower, leader) == (5, 1)


def test_an_empty_follower_cache_takes_the_leaders_end(tmp_path):
    follower = Replica(tmp_path / "follower", [], 8, high_watermark=2)
    # No epoch to ask about: the fetcher truncates to the HW itself; asked about epoch 0
    # anyway (the leader answering epoch 0 ending at 6), the empty cache has no end for it,
    # so the leader's end counts.
    assert truncation_offset(8, 2, 0, 6, follower.cache.end_offset_for) == (6, None)


def test_an_epoch_entry_without_records_at_the_log_end_does_not_stall_the_steps(tmp_path):
    # The follower's epoch 3 begins at its log end (assigned, its batch never written):
    # truncating to the end of epoch 1 removes nothing, so the next question is about epoch
    # 1 itself, not 3 again; offset 5 is epoch 1 here and epoch 0 on the leader.
    leader = Replica(tmp_path / "leader", [(0, 0), (2, 6), (4, 9)], 12)
    follower = Replica(tmp_path / "follower", [(0, 0), (1, 5), (3, 8)], 8, high_watermark=8)
    assert truncate_by_epoch(follower, leader) == (5, 2)
