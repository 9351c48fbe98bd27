"""The leader's state of one partition it leads: followers, ISR, high watermark, acks=all.

Owns ``FollowerState`` (what the leader knows of one follower, Kafka's ``Replica`` state) and
``PartitionLeader`` (one led partition: its leader epoch, committed and proposed ISR, its
followers, the high watermark rule and the acks=all purgatory). ``leader_replicas`` drives it
(state changes from ZooKeeper, the ISR writes, the shrink timer, flushes); the Fetch and
Produce handlers call it. No I/O here but the log's high watermark and reads of its offsets.

Rules, as Kafka's ZooKeeper-mode ``Partition`` and ``Replica``:

* A follower fetch at offset ``o`` (within the leader's log) at ``now``: the follower's log end
  offset becomes ``o``; its last caught-up time becomes ``now`` when ``o`` reaches the leader's
  log end offset, else the previous fetch's time when ``o`` reaches the leader's log end offset
  of that previous fetch (``Replica.updateFetchStateOrThrow``). A fetch from a broker outside
  the assignment is UNKNOWN_LEADER_EPOCH when it named a leader epoch, else
  NOT_LEADER_OR_FOLLOWER (``followerReplicaOrThrow``). A fetch naming another leader epoch
  than this leader's (``current_leader_epoch``, -1: none named) is FENCED_LEADER_EPOCH when
  older, UNKNOWN_LEADER_EPOCH when newer (``checkCurrentLeaderEpoch`` on the partition's own
  epoch), and records nothing: a follower of a newer epoch never moves a deposed leader's
  high watermark, even while this broker's metadata already has that epoch and its replica
  manager has not applied it yet.
* Caught up: the follower's log end offset equals the leader's, or it was caught up within
  ``replica.lag.time.max.ms``.
* High watermark: the least log end offset over the leader and every follower that is in the
  maximal ISR or caught up (a caught-up follower outside the ISR holds it back until it can
  join); it only moves forward. The maximal ISR is the committed ISR together with the
  proposal in flight (KIP-497): a shrink never advances the high watermark before ZooKeeper
  accepted it. Partitions with one replica keep the single-node rule (high watermark = log end
  offset, ``Log.follow_log_end_offset``).
* Expansion: a follower outside the ISR whose log end offset reached the high watermark and
  the start offset of the leader's epoch (``isFollowerInSync``). Shrink: the ISR followers
  not caught up (``getOutOfSyncReplicas``). One proposal in flight at a time.
* acks=all: NOT_ENOUGH_REPLICAS before the append when the committed ISR is smaller than
  min.insync.replicas; after it the request waits here (a future per partition and required
  offset, completed by the high watermark passing it: no polling) and is answered
  NOT_ENOUGH_REPLICAS_AFTER_APPEND when the maximal ISR is then below min.insync.replicas
  (``checkEnoughReplicasReachOffset``); leadership lost: NOT_LEADER_OR_FOLLOWER. Waits that
  ended otherwise (the request timed out) are purged every ``PURGE_INTERVAL_REQUESTS``.

The last replica standing (KIP-966's case), decided: a replicated partition whose maximal ISR
is the leader alone counts the leader's log end offset as its recovery point (what is fsynced)
in the high watermark, so it acknowledges acks=all writes and shows consumers only records
that survive its own power loss; the produce path flushes such a partition after each append
(``flush_after_append``), and ``leader_replicas`` flushes the log when the leader becomes the
only ISR member (elected so, or its shrink accepted) and before it proposes a shrink to itself
alone, so records the departing followers held are durable here first. Then whatever the last
replica standing acknowledged is on its disk after a crash, and it is still the right leader
when it comes back: followers that truncate to it lose nothing acknowledged.

Thread-safety: event loop thread, except ``leader_epoch``, ``isr`` and
``flush_after_append``, which the append thread reads (attributes replaced, never mutated).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
from dataclasses import dataclass, replace

from headrace.cluster.zookeeper_records import PartitionState
from headrace.errors import (
    FencedLeaderEpoch,
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    NotLeaderOrFollower,
    UnknownLeaderEpoch,
)

log = logging.getLogger(__name__)

UNKNOWN_OFFSET = -1
NO_LEADER_EPOCH = -1
# Kafka's producer.purgatory.purge.interval.requests default: waits that ended otherwise
# (timed out, cancelled) are dropped from the purgatory every this many new waits
PURGE_INTERVAL_REQUESTS = 1000


@dataclass(slots=True)
class FollowerState:
    """Kafka's ``ReplicaState`` of one follower, as its leader sees it."""

    log_end_offset: int = UNKNOWN_OFFSET
    log_start_offset: int = UNKNOWN_OFFSET
    last_fetch_leader_log_end_offset: int = UNKNOWN_OFFSET
    last_fetch_ms: int = 0
    last_caught_up_ms: int = 0

    def record_fetch(self, fetch_offset: int, log_start_offset: int, now_ms: int,
                     leader_log_end_offset: int) -> None:
        if fetch_offset >= leader_log_end_offset:
            self.last_caught_up_ms = max(self.last_caught_up_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            self.last_caught_up_ms = max(self.last_caught_up_ms, self.last_fetch_ms)
        self.log_end_offset = fetch_offset
        self.log_start_offset = log_start_offset
        self.last_fetch_leader_log_end_offset = max(leader_log_end_offset,
                                                    self.last_fetch_leader_log_end_offset)
        self.last_fetch_ms = now_ms

    def is_caught_up(self, leader_log_end_offset: int, now_ms: int, lag_time_max_ms: int
                     ) -> bool:
        return (self.log_end_offset == leader_log_end_offset
                or now_ms - self.last_caught_up_ms <= lag_time_max_ms)


class PartitionLeader:
    """One partition this broker leads in ``state.leader_epoch``."""

    def __init__(self, broker_id: int, log_, state: PartitionState, zk_version: int,
                 replicas: tuple[int, ...], now_ms: int, lag_time_max_ms: int) -> None:
        self.broker_id = broker_id
        self.log = log_
        self.topic, self.partition = log_.topic, log_.partition
        self.state = state  # the partition state znode as this leader last saw or wrote it
        self.leader_epoch = state.leader_epoch
        self.zk_version = zk_version
        self.lag_time_max_ms = lag_time_max_ms
        self.isr: frozenset[int] = frozenset(state.isr)
        self.proposed_isr: frozenset[int] | None = None
        self.replicas: tuple[int, ...] = ()
        self.followers: dict[int, FollowerState] = {}
        self.epoch_start_offset = log_.log_end_offset
        self.flush_after_append = False
        self.high_watermark_listeners: list = []  # called with no argument on each advance
        self.live_brokers: frozenset[int] = frozenset()  # registered now (low watermark)
        self._waiters: list[tuple[int, int, asyncio.Future]] = []
        self._deletion_waiters: list[tuple[int, int, asyncio.Future]] = []
        self._waiter_numbers = itertools.count()
        self.update_replicas(replicas, now_ms)

    # --- membership -----------------------------------------------------------------------

    @property
    def replicated(self) -> bool:
        return len(self.replicas) > 1

    @property
    def maximal_isr(self) -> frozenset[int]:
        if self.proposed_isr is None:
            return self.isr
        return self.isr | self.proposed_isr

    @property
    def sole_in_sync(self) -> bool:
        """A replicated partition whose maximal ISR is this leader alone (see the module
        docstring: its high watermark counts only fsynced records)."""
        return self.replicated and self.maximal_isr <= {self.broker_id}

    def update_replicas(self, replicas: tuple[int, ...], now_ms: int) -> None:
        """The assignment's replicas: followers added (caught up now when in the ISR, as
        Kafka's ``resetReplicaState``) or dropped."""
        self.replicas = tuple(replicas)
        followers = {}
        for replica in replicas:
            if replica == self.broker_id:
                continue
            followers[replica] = self.followers.get(replica) or FollowerState(
                last_caught_up_ms=now_ms if replica in self.isr else 0)
        self.followers = followers
        self._refresh_flush_rule()

    def update_state(self, state: PartitionState, zk_version: int) -> bool:
        """A state of this leader epoch from ZooKeeper; ignored when older than what this
        leader wrote or saw (``zk_version``). Whether the committed ISR changed."""
        if zk_version < self.zk_version or state.leader_epoch != self.leader_epoch:
            return False
        self.zk_version = zk_version
        self.state = state
        changed = frozenset(state.isr) != self.isr
        self.isr = frozenset(state.isr)
        self._refresh_flush_rule()
        return changed

    def isr_written(self, isr: frozenset[int], zk_version: int) -> None:
        """ZooKeeper accepted this leader's proposal (or the leader re-read the state)."""
        self.proposed_isr = None
        self.isr = isr
        self.state = replace(self.state, isr=tuple(sorted(isr)))
        self.zk_version = max(self.zk_version, zk_version)
        self._refresh_flush_rule()

    def proposal_dropped(self) -> None:
        self.proposed_isr = None
        self._refresh_flush_rule()

    def propose(self, isr: frozenset[int]) -> None:
        self.proposed_isr = isr
        self._refresh_flush_rule()

    def _refresh_flush_rule(self) -> None:
        self.flush_after_append = self.sole_in_sync

    # --- follower fetches -----------------------------------------------------------------

    def record_follower_fetch(self, replica_id: int, fetch_offset: int, log_start_offset: int,
                              current_leader_epoch: int, now_ms: int) -> FollowerState:
        if current_leader_epoch != NO_LEADER_EPOCH and current_leader_epoch != self.leader_epoch:
            error = (FencedLeaderEpoch if current_leader_epoch < self.leader_epoch
                     else UnknownLeaderEpoch)
            raise error(f"{self.topic}-{self.partition}: fetch in leader epoch "
                        f"{current_leader_epoch}, this leader's is {self.leader_epoch}")
        follower = self.followers.get(replica_id)
        if follower is None:
            error = (UnknownLeaderEpoch if current_leader_epoch != NO_LEADER_EPOCH
                     else NotLeaderOrFollower)
            raise error(f"replica {replica_id} is not a replica of {self.topic}-"
                        f"{self.partition} in leader epoch {self.leader_epoch} (replicas "
                        f"{list(self.replicas)})")
        follower.record_fetch(fetch_offset, log_start_offset, now_ms, self.log.log_end_offset)
        if self._deletion_waiters:
            self.complete_deletion_waiters()
        return follower

    def follower_to_add(self, replica_id: int) -> bool:
        """Whether ``replica_id`` may join the ISR now (no proposal in flight)."""
        follower = self.followers.get(replica_id)
        if follower is None or self.proposed_isr is not None or replica_id in self.isr:
            return False
        return (follower.log_end_offset >= self.log.high_watermark
                and follower.log_end_offset >= self.epoch_start_offset)

    def out_of_sync_followers(self, now_ms: int) -> frozenset[int]:
        if self.proposed_isr is not None:
            return frozenset()
        leader_end = self.log.log_end_offset
        return frozenset(
            replica for replica in self.isr - {self.broker_id}
            if replica not in self.followers
            or not self.followers[replica].is_caught_up(leader_end, now_ms, self.lag_time_max_ms))

    # --- high watermark -------------------------------------------------------------------

    def maybe_advance_high_watermark(self, now_ms: int) -> bool:
        """Recompute the high watermark (module docstring); complete the acks=all waits it
        satisfies and tell the listeners. Whether it moved."""
        if not self.replicated:
            self.complete_waiters()
            return False
        log_end = self.log.log_end_offset
        candidate = self.log.recovery_point if self.sole_in_sync else log_end
        maximal = self.maximal_isr
        for replica, follower in self.followers.items():
            if follower.log_end_offset < candidate and (
                    replica in maximal
                    or follower.is_caught_up(log_end, now_ms, self.lag_time_max_ms)):
                candidate = follower.log_end_offset
        moved = self.log.update_high_watermark(candidate)
        if moved:
            self.complete_waiters()
            for listener in self.high_watermark_listeners:
                listener()
        return moved

    # --- acks=all -------------------------------------------------------------------------

    def check_enough_replicas(self) -> None:
        """Before an acks=all append (any thread): NOT_ENOUGH_REPLICAS below
        min.insync.replicas."""
        min_isr = self.log.config.min_insync_replicas
        if len(self.isr) < min_isr:
            raise NotEnoughReplicas(
                f"The size of the current ISR {sorted(self.isr)} is insufficient to satisfy "
                f"the min.isr requirement of {min_isr} for partition {self.topic}-"
                f"{self.partition}")

    def wait_for(self, required_offset: int) -> asyncio.Future:
        """A future completed with an error code (0: every maximal ISR member has the
        records below ``required_offset``) once the high watermark reaches it."""
        future = asyncio.get_running_loop().create_future()
        number = next(self._waiter_numbers)
        if number % PURGE_INTERVAL_REQUESTS == PURGE_INTERVAL_REQUESTS - 1:
            self._waiters = [entry for entry in self._waiters if not entry[2].done()]
            heapq.heapify(self._waiters)
        heapq.heappush(self._waiters, (required_offset, number, future))
        self.complete_waiters()
        return future

    @property
    def waiter_count(self) -> int:
        """Entries in the purgatory, ended ones not yet purged (a read for tests, metrics)."""
        return len(self._waiters)

    def complete_waiters(self) -> None:
        high_watermark = self.log.high_watermark
        while self._waiters and self._waiters[0][0] <= high_watermark:
            _, _, future = heapq.heappop(self._waiters)
            if not future.done():
                future.set_result(self._after_append_code())

    def _after_append_code(self) -> int:
        if len(self.maximal_isr) < self.log.config.min_insync_replicas:
            return NotEnoughReplicasAfterAppend.code
        return 0

    def adopt_waiters(self, previous: PartitionLeader) -> None:
        """The acks=all waits of this broker's previous leader epoch of the partition."""
        for entry in previous._waiters:
            heapq.heappush(self._waiters, (entry[0], next(self._waiter_numbers), entry[2]))
        previous._waiters = []
        self.complete_waiters()

    def resign(self) -> None:
        """Leadership lost (or the log gone): every waiting acks=all and DeleteRecords
        answers NOT_LEADER_OR_FOLLOWER."""
        waiters, self._waiters = self._waiters + self._deletion_waiters, []
        self._deletion_waiters = []
        for _, _, future in waiters:
            if not future.done():
                future.set_result(NotLeaderOrFollower.code)

    # --- DeleteRecords --------------------------------------------------------------------

    @property
    def low_watermark(self) -> int:
        """Kafka's ``lowWatermarkIfLeader``: the least log start offset of the leader and its
        followers on live brokers."""
        low = self.log.log_start_offset
        for replica, follower in self.followers.items():
            if replica in self.live_brokers:
                low = min(low, follower.log_start_offset)
        return low

    def wait_for_low_watermark(self, offset: int) -> asyncio.Future:
        """A future completed with 0 once every live replica's log starts at ``offset`` or
        later (Kafka's ``DelayedDeleteRecords``)."""
        future = asyncio.get_running_loop().create_future()
        heapq.heappush(self._deletion_waiters, (offset, next(self._waiter_numbers), future))
        self.complete_deletion_waiters()
        return future

    def complete_deletion_waiters(self) -> None:
        low_watermark = self.low_watermark
        while self._deletion_waiters and self._deletion_waiters[0][0] <= low_watermark:
            _, _, future = heapq.heappop(self._deletion_waiters)
            if not future.done():
                future.set_result(0)
