"""The partitions this broker leads, kept in step with ZooKeeper: the become-leader path.

Owns ``LeaderReplicas``: one ``partition_leader.PartitionLeader`` per partition this broker
leads and holds a log for (``leaders``, replaced, never mutated), and the work around them:

* becoming leader (a state naming this broker leader in a new leader epoch): every append is
  stamped with the epoch (``Log.set_leader_epoch``: produce, the coordinators' records and
  transaction markers alike; the log's epoch cache records where it starts at its first
  append), a replicated log's high watermark is managed (``Log.manage_high_watermark`` from its current
  value: the replication-offset-checkpoint's at load, the follower's when it followed), a
  single-replica log's follows its log end offset; acks=all waits of the previous epoch carry
  over to the new one when this broker stays leader;
* the same epoch's later states (the leader's own ISR writes coming back, assignment changes)
  update the ISR and the followers; a partition no longer led here resigns (its waits answer
  NOT_LEADER_OR_FOLLOWER);
* ISR changes, Kafka's pre-2.7 ZooKeeper mode (``Partition.shrinkIsr/expandIsr`` ->
  ``updateLeaderAndIsr``): the leader writes the partition state znode itself with a
  ``set_data`` conditional on the zkVersion it last saw, leader, leader epoch and controller
  epoch unchanged. BadVersion: it re-reads; while the state still names it leader in the same
  epoch it recomputes the change from the ISR read and retries (``ISR_WRITE_MAX_ATTEMPTS``),
  else the proposal is dropped (the state watch tells the replica manager the rest). Until
  ZooKeeper answers, the maximal ISR (old and proposed) bounds the high watermark. Expansion is
  proposed after the follower fetch that makes a follower eligible; shrinks are checked every
  ``replica.lag.time.max.ms`` / 2;
* the flushes of the last-replica-standing rule (``partition_leader``'s docstring): before a
  shrink to this leader alone, and when it becomes the only ISR member.

Thread-safety: event loop thread; ZooKeeper calls run in the default executor, flushes on the
broker's append thread (``run_append``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import replace
from types import MappingProxyType

from kazoo.exceptions import BadVersionError, KazooException

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.cluster.metadata_cache import ClusterMetadata
from headrace.cluster.partition_leader import PartitionLeader
from headrace.cluster.zookeeper_records import PartitionState
from headrace.errors import NotLeaderOrFollower, RequestTimedOut

log = logging.getLogger(__name__)

ISR_WRITE_MAX_ATTEMPTS = 5
UNKNOWN_ZK_VERSION = -1
Key = tuple[str, int]
IsrChange = Callable[[frozenset[int]], frozenset[int]]


def write_isr_change(zk, topic: str, partition: int, broker_id: int, state: PartitionState,
                     zk_version: int, change: IsrChange) -> tuple[frozenset[int], int] | None:
    """Blocking: apply ``change`` to the ISR of the partition's state znode, conditional on
    ``zk_version`` (the state this leader last saw: ``state``); on BadVersion re-read and
    retry while the znode still names ``broker_id`` leader in ``state.leader_epoch``. The ISR
    now in ZooKeeper and its zkVersion, or None when this broker no longer leads that epoch."""
    path = paths.partition_state_path(topic, partition)
    current, version = state, zk_version
    for _ in range(ISR_WRITE_MAX_ATTEMPTS):
        if version == UNKNOWN_ZK_VERSION:
            data, stat = zk.retry(zk.get, path)
            current, version = records.decode_partition_state(data), stat.version
            if current.leader != broker_id or current.leader_epoch != state.leader_epoch:
                return None
        isr = frozenset(current.isr)
        wanted = change(isr)
        if wanted == isr:
            return isr, version
        proposed = replace(current, isr=tuple(sorted(wanted)))
        try:
            stat = zk.retry(zk.set, path, records.encode_partition_state(proposed),
                            version=version)
        except BadVersionError:
            version = UNKNOWN_ZK_VERSION
            continue
        return wanted, stat.version
    log.warning("giving up the ISR change of %s-%d after %d conflicting writes", topic,
                partition, ISR_WRITE_MAX_ATTEMPTS)
    return None


def _apply_high_watermark_rule(leader: PartitionLeader,
                               initial_high_watermark: Callable[[str, int], int]) -> None:
    """A replicated partition's high watermark is managed (kept when it was already: the
    follower's; else from the replication-offset-checkpoint, ``initial_high_watermark``), a
    single replica's follows the log end offset."""
    log_ = leader.log
    if leader.replicated and not log_.high_watermark_managed:
        log_.manage_high_watermark(initial_high_watermark(leader.topic, leader.partition))
    elif not leader.replicated and log_.high_watermark_managed:
        log_.follow_log_end_offset()


class LeaderReplicas:
    def __init__(self, broker_id: int, zk, clock, lag_time_max_ms: int,
                 run_append: Callable[..., Awaitable],
                 notify_fetches: Callable[[Key], None],
                 initial_high_watermark: Callable[[str, int], int]) -> None:
        self.broker_id = broker_id
        self._zk = zk
        self._clock = clock
        self.lag_time_max_ms = lag_time_max_ms
        self._run_append = run_append
        self._notify_fetches = notify_fetches
        self._initial_high_watermark = initial_high_watermark
        self.leaders: MappingProxyType[Key, PartitionLeader] = MappingProxyType({})
        self._isr_tasks: set[asyncio.Task] = set()
        self._shrink_task: asyncio.Task | None = None

    def start(self) -> None:
        self._shrink_task = asyncio.get_running_loop().create_task(self._shrink_loop())

    async def stop(self) -> None:
        for task in (self._shrink_task, *self._isr_tasks):
            if task is not None:
                task.cancel()
        for leader in self.leaders.values():
            leader.resign()

    # --- state changes ----------------------------------------------------------------------

    def apply(self, snapshot: ClusterMetadata, led: dict[Key, object]) -> None:
        """``led``: the partitions this broker leads in ``snapshot`` and holds, with their
        logs. Called before the replica manager serves them."""
        now_ms = self._clock.now_ms()
        leaders = dict(self.leaders)
        for key in set(leaders) - set(led):
            leaders.pop(key).resign()
        live_brokers = frozenset(snapshot.brokers)
        for key, log_ in led.items():
            state = snapshot.states[key]
            version = snapshot.state_versions.get(key, UNKNOWN_ZK_VERSION)
            replicas = snapshot.topics[key[0]].replicas[key[1]]
            current = leaders.get(key)
            if current is None or current.leader_epoch != state.leader_epoch \
                    or current.log is not log_:
                leaders[key] = self._become_leader(log_, state, version, replicas, current,
                                                   now_ms)
                leaders[key].live_brokers = live_brokers
                continue
            current.live_brokers = live_brokers
            if tuple(replicas) != current.replicas:
                current.update_replicas(tuple(replicas), now_ms)
                _apply_high_watermark_rule(current, self._initial_high_watermark)
            if current.update_state(state, version):
                self._after_isr_change(current)
        self.leaders = MappingProxyType(leaders)

    def _become_leader(self, log_, state: PartitionState, version: int, replicas,
                       previous: PartitionLeader | None, now_ms: int) -> PartitionLeader:
        leader = PartitionLeader(self.broker_id, log_, state, version, tuple(replicas),
                                 now_ms, self.lag_time_max_ms)
        _apply_high_watermark_rule(leader, self._initial_high_watermark)
        try:
            log_.set_leader_epoch(state.leader_epoch)
        except ValueError as error:  # the log has a later epoch than this state: stale state
            log.error("not stamping leader epoch %d into %s-%d: %s", state.leader_epoch,
                      leader.topic, leader.partition, error)
        key = (leader.topic, leader.partition)
        leader.high_watermark_listeners.append(lambda: self._notify_fetches(key))
        if previous is not None:
            leader.adopt_waiters(previous)
        log.info("broker %d leads %s-%d in epoch %d from offset %d (isr %s, replicas %s)",
                 self.broker_id, leader.topic, leader.partition, leader.leader_epoch,
                 leader.epoch_start_offset, sorted(leader.isr), list(leader.replicas))
        self._after_isr_change(leader)
        return leader

    def _after_isr_change(self, leader: PartitionLeader) -> None:
        """A new committed ISR: a sole member flushes first (module docstring), then the
        high watermark is recomputed (a shrink may let it advance)."""
        if leader.sole_in_sync:
            self._spawn(self._flush_then_advance(leader))
        else:
            leader.maybe_advance_high_watermark(self._clock.now_ms())

    async def _flush_then_advance(self, leader: PartitionLeader) -> None:
        await self._run_append(leader.log.flush)
        if self.leaders.get((leader.topic, leader.partition)) is leader:
            leader.maybe_advance_high_watermark(self._clock.now_ms())

    # --- follower fetches and appends --------------------------------------------------------

    def leader_of(self, topic: str, partition: int) -> PartitionLeader:
        leader = self.leaders.get((topic, partition))
        if leader is None:
            raise NotLeaderOrFollower(f"broker {self.broker_id} does not lead "
                                      f"{topic}-{partition}")
        return leader

    def record_follower_fetch(self, topic: str, partition: int, replica_id: int,
                              fetch_offset: int, log_start_offset: int,
                              current_leader_epoch: int) -> None:
        """A follower's fetch at ``fetch_offset`` (within the log): its state, the high
        watermark, and an ISR expansion when it became eligible."""
        leader = self.leader_of(topic, partition)
        now_ms = self._clock.now_ms()
        leader.record_follower_fetch(replica_id, fetch_offset, log_start_offset,
                                     current_leader_epoch, now_ms)
        leader.maybe_advance_high_watermark(now_ms)
        if leader.follower_to_add(replica_id):
            log.info("adding broker %d to the ISR of %s-%d (its log end offset %d)", replica_id,
                     topic, partition, fetch_offset)
            self._propose(leader, leader.isr | {replica_id}, lambda isr: isr | {replica_id})

    def appended(self, topic: str, partition: int) -> None:
        """After a local append: the high watermark may move (an ISR of the leader alone)."""
        leader = self.leaders.get((topic, partition))
        if leader is not None:
            leader.maybe_advance_high_watermark(self._clock.now_ms())

    async def wait_replicated(self, topic: str, partition: int, required_offset: int,
                              timeout_ms: int) -> int:
        """After an acks=-1 append of this broker's own (the group coordinator's): the error
        code once the high watermark passed ``required_offset`` (``PartitionLeader.wait_for``),
        REQUEST_TIMED_OUT past ``timeout_ms``, NOT_LEADER_OR_FOLLOWER when not leading."""
        leader = self.leaders.get((topic, partition))
        if leader is None:
            return NotLeaderOrFollower.code
        leader.maybe_advance_high_watermark(self._clock.now_ms())
        try:
            return await asyncio.wait_for(leader.wait_for(required_offset), timeout_ms / 1000)
        except TimeoutError:
            return RequestTimedOut.code

    async def wait_for_low_watermark(self, topic: str, partition: int, offset: int,
                                     timeout_ms: int) -> int:
        """After DeleteRecords moved this leader's log start to ``offset``: the error code once
        every live replica's did (0), REQUEST_TIMED_OUT past ``timeout_ms``,
        NOT_LEADER_OR_FOLLOWER when not leading."""
        leader = self.leaders.get((topic, partition))
        if leader is None:
            return NotLeaderOrFollower.code
        try:
            return await asyncio.wait_for(leader.wait_for_low_watermark(offset),
                                          timeout_ms / 1000)
        except TimeoutError:
            return RequestTimedOut.code

    # --- ISR changes ---------------------------------------------------------------------------

    async def _shrink_loop(self) -> None:
        interval_s = max(self.lag_time_max_ms // 2, 1) / 1000
        while True:
            await asyncio.sleep(interval_s)
            self.shrink_out_of_sync()

    def shrink_out_of_sync(self) -> None:
        now_ms = self._clock.now_ms()
        for leader in self.leaders.values():
            out_of_sync = leader.out_of_sync_followers(now_ms)
            if out_of_sync:
                log.info("shrinking the ISR of %s-%d from %s: %s not caught up within "
                         "replica.lag.time.max.ms=%d", leader.topic, leader.partition,
                         sorted(leader.isr), sorted(out_of_sync), self.lag_time_max_ms)
                self._propose(leader, leader.isr - out_of_sync,
                              lambda isr, gone=out_of_sync: isr - gone)

    def _propose(self, leader: PartitionLeader, isr: frozenset[int], change: IsrChange) -> None:
        leader.propose(isr)
        self._spawn(self._write_isr(leader, isr, change))

    async def _write_isr(self, leader: PartitionLeader, isr: frozenset[int],
                         change: IsrChange) -> None:
        key = (leader.topic, leader.partition)
        try:
            if leader.replicated and isr <= {self.broker_id}:
                await self._run_append(leader.log.flush)
            written = await asyncio.get_running_loop().run_in_executor(
                None, write_isr_change, self._zk, leader.topic, leader.partition,
                self.broker_id, leader.state, leader.zk_version, change)
        except (KazooException, OSError, ValueError) as error:
            log.warning("the ISR change of %s-%d failed: %r", *key, error)
            written = None
        except Exception:  # the proposal must not stay in flight
            log.exception("the ISR change of %s-%d failed", *key)
            written = None
        if written is None:
            leader.proposal_dropped()
        else:
            leader.isr_written(*written)
        if self.leaders.get(key) is leader:
            self._after_isr_change(leader)

    def _spawn(self, work: Awaitable) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self._isr_tasks.add(task)
        task.add_done_callback(self._isr_tasks.discard)
