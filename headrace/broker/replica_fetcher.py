"""Followers copying their leaders' logs: ``ReplicaFetcherManager`` and ``ReplicaFetcher``.

Owns the follower side of replication, as Kafka's ``ReplicaFetcherManager`` /
``AbstractFetcherThread`` / ``ReplicaFetcherThread`` (ZooKeeper mode, with
``num.replica.fetchers`` = 1): one fetcher -- one asyncio task, one ``ReplicaConnection`` --
per leader broker, fetching every partition this broker follows from that leader.

The replica manager hands the manager the partitions this broker follows, with their leader
and leader epoch, after every metadata change (``follow``): a partition whose leader or epoch
changed leaves its old fetcher and joins the new leader's in the *truncating* state; one no
longer followed (led here now, or led by nobody, or deleted) is removed, and ``follow``
returns only once no fetcher is working on it any more, so the become-leader path never
races a follower append. A partition's high watermark is managed from then on
(``Log.manage_high_watermark``, started from the one the log has).

Per partition, as Kafka's fetcher thread:

* **Truncating** (KIP-101 / KIP-279): OffsetForLeaderEpoch (v4, ``replica_id`` = this
  broker, ``current_leader_epoch`` = the epoch followed) for the log's latest epoch
  (``Log.leader_epoch_cache.latest_epoch()``); ``truncation_offset`` turns the answer into
  the offset to truncate to (the smaller of the two end offsets of that epoch; when the leader
  answers a smaller epoch the follower does not have, truncate to its own end of the epoch
  below and ask again; the high watermark only when the leader answers UNDEFINED, or when the
  log has no epoch at all), then ``Log.truncate_to`` and on to fetching from the log end.
* **Fetching**: Fetch v12 (``replica_id`` = this broker, ``current_leader_epoch``, from the
  log end offset, ``replica.fetch.max.bytes`` per partition, ``replica.fetch.response.max.bytes``
  per response, ``replica.fetch.min.bytes`` / ``replica.fetch.wait.max.ms`` long poll); the
  response is received into one buffer and parsed in place
  (``fetch_response.decode_fetch_response``), and the whole batches received -- views of
  that buffer, never copied in Python -- are appended with ``Log.append_as_follower`` on the
  append thread (``run_append``), then the high watermark becomes min(leader's, log end) and the log start
  offset follows the leader's (never past the high watermark).
* **OFFSET_OUT_OF_RANGE**: Kafka's ``fetchOffsetAndTruncate``: ListOffsets (replica_id set)
  for the leader's end offset; a log ahead of it is truncated to it; else the leader's start
  offset, and a log wholly below it is emptied and restarted there
  (``Log.truncate_fully_and_start_at``).
* **Errors** (FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER, a lost
  connection, ...): the partition (all of them, for a lost connection) waits
  ``replica.fetch.backoff.ms``; a new epoch arrives through the state watch and ``follow``.
* **Throttling**: a throttled replica (``follower.replication.throttled.replicas``) that is
  not in sync (Kafka's ``isReplicaInSync``: it had not caught up with the leader's high
  watermark at its last fetch) is left out of the fetch while the follower quota is
  exceeded; the bytes fetched for throttled replicas are recorded in it
  (``replication_quota``). A throttled partition catching up logs the quota's accounting.

Configs, Kafka's names and defaults: ``replica.fetch.max.bytes`` 1048576,
``replica.fetch.response.max.bytes`` 10485760, ``replica.fetch.wait.max.ms`` 500,
``replica.fetch.min.bytes`` 1, ``replica.fetch.backoff.ms`` 1000,
``replica.socket.timeout.ms`` 30000 (each request's round trip).

Thread-safety: event loop thread; log mutations run on the broker's append thread, at most
one per fetcher at a time, under the fetcher's lock that ``follow`` takes to remove a partition.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass

from headrace.broker.fetch_response import decode_fetch_response
from headrace.broker.rate_limited_log import RateLimitedLog
from headrace.broker.replica_connection import ReplicaConnection, ReplicaConnectionError
from headrace.broker.replication_quota import ReplicationQuota, is_throttled
from headrace.errors import KafkaError, OffsetOutOfRange
from headrace.protocol.wire import MalformedFrame

log = logging.getLogger(__name__)

FETCH, LIST_OFFSETS, OFFSET_FOR_LEADER_EPOCH = 1, 2, 23
FETCH_VERSION = 12  # replica_id in the body, topics by name
LIST_OFFSETS_VERSION = 7
OFFSET_FOR_LEADER_EPOCH_VERSION = 4
UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
LATEST_TIMESTAMP, EARLIEST_TIMESTAMP = -1, -2
FOLLOWER_THROTTLED_REPLICAS = "follower.replication.throttled.replicas"
FOLLOWER_THROTTLED_RATE = "follower.replication.throttled.rate"
ERROR_LOG_INTERVAL_MS = 5000
_errors = RateLimitedLog(log, ERROR_LOG_INTERVAL_MS)


@dataclass(frozen=True, slots=True)
class ReplicaFetcherConfig:
    """The replica.fetch.* configs (defaults in ``headrace.broker.config``)."""

    fetch_max_bytes: int
    response_max_bytes: int
    wait_max_ms: int
    min_bytes: int
    backoff_ms: int
    socket_timeout_ms: int
    # A response may pass response_max_bytes by one batch (KIP-74), which the leader's
    # socket.request.max.bytes bounds; this broker's stands in for it.
    max_batch_bytes: int

    @classmethod
    def from_broker_config(cls, config) -> ReplicaFetcherConfig:
        return cls(config.get_int("replica.fetch.max.bytes"),
                   config.get_int("replica.fetch.response.max.bytes"),
                   config.get_int("replica.fetch.wait.max.ms"),
                   config.get_int("replica.fetch.min.bytes"),
                   config.get_int("replica.fetch.backoff.ms"),
                   config.get_int("replica.socket.timeout.ms"),
                   config.get_int("socket.request.max.bytes"))


def truncation_offset(log_end_offset: int, high_watermark: int, leader_epoch: int,
                      leader_end_offset: int, own_end_for_epoch) -> tuple[int, int | None]:
    """Kafka's ``getOffsetTruncationState``: (offset to truncate to, the epoch to ask the
    leader about next -- None once truncation is complete) from the leader's answer
    (``leader_epoch``, ``leader_end_offset``) for the epoch this log asked about;
    ``own_end_for_epoch(epoch)`` is the log's ``end_offset_for``. The next epoch is the one
    this log has below the leader's answer (Kafka asks its latest epoch after truncating,
    the same one, unless the log ends with an epoch entry that holds no records)."""
    if leader_end_offset == UNDEFINED_EPOCH_OFFSET:  # the leader knows no such epoch range
        return min(high_watermark, log_end_offset), None
    if leader_epoch == UNDEFINED_EPOCH:
        return min(leader_end_offset, log_end_offset), None
    own_epoch, own_end_offset = own_end_for_epoch(leader_epoch)
    if own_end_offset == UNDEFINED_EPOCH_OFFSET:
        return min(leader_end_offset, log_end_offset), None
    if own_epoch != leader_epoch:  # KIP-279: step down to the epoch below and ask again
        return min(own_end_offset, log_end_offset), own_epoch
    return min(own_end_offset, leader_end_offset, log_end_offset), None


def epoch_to_ask(next_epoch: int | None, epoch_cache) -> int | None:
    """The epoch a truncating follower asks the leader about: the one the last step named,
    else its log's latest (None: the log has no epoch; it truncates to its high watermark)."""
    return epoch_cache.latest_epoch() if next_epoch is None else next_epoch


class _PartitionFetch:
    """One followed partition's fetch state (Kafka's ``PartitionFetchState``)."""

    __slots__ = ("topic", "partition", "log", "leader_epoch", "truncating", "fetch_offset",
                 "delayed_until_ms", "lag", "next_epoch")

    def __init__(self, topic: str, partition: int, log, leader_epoch: int) -> None:
        self.topic, self.partition, self.log = topic, partition, log
        self.leader_epoch = leader_epoch
        self.truncating = True
        self.fetch_offset = log.log_end_offset
        self.delayed_until_ms = 0
        self.lag: int | None = None  # the leader's HW - fetch offset, at the last fetch
        self.next_epoch: int | None = None  # while truncating in steps: the epoch to ask

    @property
    def in_sync(self) -> bool:
        """Kafka's ``PartitionFetchState.isReplicaInSync``: caught up at the last fetch."""
        return self.lag is not None and self.lag <= 0

    @property
    def key(self) -> tuple[str, int]:
        return self.topic, self.partition


class ReplicaFetcher:
    """Fetches every partition this broker follows from one leader broker."""

    def __init__(self, manager: ReplicaFetcherManager, leader_id: int) -> None:
        self._manager = manager
        self.leader_id = leader_id
        self._partitions: dict[tuple[str, int], _PartitionFetch] = {}
        self._wakeup = asyncio.Event()
        self._lock = asyncio.Lock()
        self._connection: ReplicaConnection | None = None
        self._task: asyncio.Task | None = None
        self._stopped = False

    @property
    def partitions(self) -> dict[tuple[str, int], _PartitionFetch]:
        return self._partitions

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        """Cancel the fetch loop and wait for it to end. The loop also ends by itself once
        stopped: ``follow`` (and with it the replica manager's apply loop) waits here, so a
        cancellation lost on the way (Python 3.11's ``asyncio.wait_for`` returns the result
        of an awaitable that completed as the cancellation arrived) must not leave it waiting
        for ever on a loop with nothing to fetch."""
        self._stopped = True
        self._wakeup.set()
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
        self._close()

    def add(self, state: _PartitionFetch) -> None:
        self._partitions[state.key] = state
        self._wakeup.set()

    async def remove(self, keys) -> None:
        """Drop ``keys``; returns once no log work on them is under way."""
        async with self._lock:
            for key in keys:
                self._partitions.pop(key, None)

    def _close(self) -> None:
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    # --- the fetch loop -------------------------------------------------------------------

    async def _run(self) -> None:
        while not self._stopped:
            now_ms = self._manager.now_ms()
            ready = [s for s in self._partitions.values() if s.delayed_until_ms <= now_ms]
            if not ready:
                await self._wait(self._next_ready_ms(now_ms))
                continue
            try:
                await self._connect()
                truncating = [s for s in ready if s.truncating]
                if truncating:
                    await self._truncate(truncating)
                    continue
                fetching = self._unthrottled(ready, now_ms)
                if not fetching:
                    await self._wait(self._manager.config.backoff_ms)
                    continue
                await self._fetch(fetching)
            except (OSError, EOFError, ReplicaConnectionError) as error:
                _errors.event(logging.WARNING, "broker %d: fetching from leader %d failed: "
                              "%r; backing off", self._manager.broker_id, self.leader_id, error)
                self._close()
                self._delay(list(self._partitions.values()))
            except Exception as error:  # a log that failed (closed, storage): never the loop
                _errors.event(logging.ERROR, "broker %d: replicating from leader %d failed: "
                              "%r; backing off", self._manager.broker_id, self.leader_id, error)
                self._delay(list(self._partitions.values()))

    def _next_ready_ms(self, now_ms: int) -> int | None:
        if not self._partitions:
            return None
        return max(0, min(s.delayed_until_ms for s in self._partitions.values()) - now_ms)

    async def _wait(self, timeout_ms: int | None) -> None:
        self._wakeup.clear()
        if self._stopped:
            return
        try:  # asyncio.timeout, not wait_for: see ``stop``
            async with asyncio.timeout(None if timeout_ms is None else timeout_ms / 1000):
                await self._wakeup.wait()
        except TimeoutError:
            pass

    def _delay(self, states) -> None:
        until_ms = self._manager.now_ms() + self._manager.config.backoff_ms
        for state in states:
            state.delayed_until_ms = until_ms

    async def _connect(self) -> None:
        if self._connection is not None and self._connection.is_open:
            return
        endpoint = self._manager.endpoint_of(self.leader_id)
        if endpoint is None:
            raise ConnectionError(f"leader {self.leader_id} is not registered")
        config = self._manager.config
        self._connection = ReplicaConnection(
            endpoint[0], endpoint[1], f"broker-{self._manager.broker_id}-fetcher-0",
            config.socket_timeout_ms, config.response_max_bytes + config.max_batch_bytes)
        await self._connection.open()

    def _current(self, state: _PartitionFetch) -> bool:
        return self._partitions.get(state.key) is state

    # --- truncation by leader epoch -------------------------------------------------------

    async def _truncate(self, states: list[_PartitionFetch]) -> None:
        asked: list[tuple[_PartitionFetch, int]] = []
        for state in states:
            epoch = epoch_to_ask(state.next_epoch, state.log.leader_epoch_cache)
            if epoch is None:  # no epoch to ask about: Kafka truncates to the HW
                async with self._lock:
                    if self._current(state):
                        await self._truncate_to(state, state.log.high_watermark, True)
            else:
                asked.append((state, epoch))
        if not asked:
            return
        by_topic: dict[str, list] = {}
        for state, epoch in asked:
            by_topic.setdefault(state.topic, []).append(
                {"partition": state.partition, "current_leader_epoch": state.leader_epoch,
                 "leader_epoch": epoch})
        response = await self._connection.request(
            OFFSET_FOR_LEADER_EPOCH, OFFSET_FOR_LEADER_EPOCH_VERSION,
            {"replica_id": self._manager.broker_id,
             "topics": [{"topic": t, "partitions": p} for t, p in by_topic.items()]})
        answers = {(topic.topic, p.partition): p for topic in response.topics
                   for p in topic.partitions}
        async with self._lock:
            for state, _ in asked:
                answer = answers.get(state.key)
                if not self._current(state) or not state.truncating:
                    continue
                if answer is None or answer.error_code != 0:
                    self._partition_error(state, "OffsetForLeaderEpoch",
                                          answer.error_code if answer else -1)
                    continue
                log_ = state.log
                offset, state.next_epoch = truncation_offset(
                    log_.log_end_offset, log_.high_watermark, answer.leader_epoch,
                    answer.end_offset, log_.leader_epoch_cache.end_offset_for)
                await self._truncate_to(state, offset, state.next_epoch is None)

    async def _truncate_to(self, state: _PartitionFetch, offset: int, complete: bool) -> None:
        log_ = state.log
        if offset < log_.log_end_offset:
            log.info("broker %d truncating %s-%d from %d to %d (leader %d, epoch %d)",
                     self._manager.broker_id, state.topic, state.partition,
                     log_.log_end_offset, offset, self.leader_id, state.leader_epoch)
            await self._manager.run_append(log_.truncate_to, offset,
                                           self._manager.wall_clock_ms())
        state.fetch_offset = log_.log_end_offset
        state.truncating = not complete

    def _partition_error(self, state: _PartitionFetch, what: str, error_code: int) -> None:
        _errors.event(logging.INFO, "broker %d: %s of %s-%d from leader %d (epoch %d) answered "
                      "error %d; backing off", self._manager.broker_id, what, state.topic,
                      state.partition, self.leader_id, state.leader_epoch, error_code)
        self._delay([state])

    # --- fetching -------------------------------------------------------------------------

    def _unthrottled(self, states: list[_PartitionFetch], now_ms: int) -> list[_PartitionFetch]:
        quota = self._manager.follower_quota
        quota.bound_bytes_per_second = self._manager.follower_rate()  # dynamic
        if not quota.is_exceeded(now_ms):
            return states
        return [s for s in states
                if s.in_sync or not self._manager.throttled(s.topic, s.partition)]

    async def _fetch(self, states: list[_PartitionFetch]) -> None:
        config = self._manager.config
        sent = {s.key: (s, s.fetch_offset) for s in states}
        by_topic: dict[str, list] = {}
        for state in states:
            by_topic.setdefault(state.topic, []).append(
                {"partition": state.partition, "current_leader_epoch": state.leader_epoch,
                 "fetch_offset": state.fetch_offset, "last_fetched_epoch": -1,
                 "log_start_offset": state.log.log_start_offset,
                 "partition_max_bytes": config.fetch_max_bytes})
        frame = await self._connection.request_frame(FETCH, FETCH_VERSION, {
            "replica_id": self._manager.broker_id, "max_wait": config.wait_max_ms,
            "min_bytes": config.min_bytes, "max_bytes": config.response_max_bytes,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": t, "partitions": p} for t, p in by_topic.items()],
            "forgotten_topics_data": [], "rack_id": ""})
        try:
            response = decode_fetch_response(frame)
        except MalformedFrame as error:
            self._close()
            raise ReplicaConnectionError(f"undecodable Fetch response: {error}") from None
        if response.error_code != 0:
            self._partition_error(states[0], "Fetch", response.error_code)
            self._delay(states)
            return
        async with self._lock:
            for data in response.partitions:
                state, offset = sent.get((data.topic, data.partition_index), (None, None))
                if state is None or not self._current(state) or state.truncating \
                        or state.fetch_offset != offset:
                    continue
                await self._process(state, data)

    async def _process(self, state: _PartitionFetch, data) -> None:
        if data.error_code == OffsetOutOfRange.code:
            await self._handle_out_of_range(state)
            return
        if data.error_code != 0:
            self._partition_error(state, "Fetch", data.error_code)
            return
        records = data.records  # a view of the response frame: appended without a copy
        size = len(records)
        manager = self._manager
        try:
            state.fetch_offset = await manager.run_append(
                append_fetched, state.log, records, data.high_watermark,
                data.log_start_offset, manager.wall_clock_ms())
        except KafkaError as error:
            _errors.event(logging.ERROR, "broker %d: appending %d bytes fetched from leader %d "
                          "to %s-%d failed: %s", manager.broker_id, size, self.leader_id,
                          state.topic, state.partition, error)
            self._delay([state])
            return
        if size and manager.throttled(state.topic, state.partition):
            manager.follower_quota.record(size, manager.now_ms())
        was_in_sync = state.in_sync
        state.lag = max(0, data.high_watermark - state.fetch_offset)
        if state.in_sync and not was_in_sync and manager.throttled(state.topic,
                                                                   state.partition):
            self._log_throttled_catch_up(state)

    def _log_throttled_catch_up(self, state: _PartitionFetch) -> None:
        quota, now_ms = self._manager.follower_quota, self._manager.now_ms()
        log.info("broker %d caught up with %s-%d under the follower replication quota: "
                 "window rate %d bytes/s (bound %d), %d bytes recorded, throttled %d ms",
                 self._manager.broker_id, state.topic, state.partition,
                 quota.rate_bytes_per_second(now_ms), quota.bound_bytes_per_second,
                 quota.recorded_bytes, quota.throttled_ms_at(now_ms))

    async def _handle_out_of_range(self, state: _PartitionFetch) -> None:
        """Kafka's ``fetchOffsetAndTruncate``."""
        log_ = state.log
        leader_end = await self._leader_offset(state, LATEST_TIMESTAMP)
        if leader_end is None:
            return
        if leader_end < log_.log_end_offset:
            log.warning("broker %d: %s-%d ends at %d, past leader %d's end %d: truncating",
                        self._manager.broker_id, state.topic, state.partition,
                        log_.log_end_offset, self.leader_id, leader_end)
            await self._manager.run_append(log_.truncate_to, leader_end,
                                           self._manager.wall_clock_ms())
        else:
            leader_start = await self._leader_offset(state, EARLIEST_TIMESTAMP)
            if leader_start is None:
                return
            if leader_start > log_.log_end_offset:
                log.warning("broker %d: %s-%d ends at %d, below leader %d's start %d: "
                            "restarting the log there", self._manager.broker_id, state.topic,
                            state.partition, log_.log_end_offset, self.leader_id, leader_start)
                await self._manager.run_append(log_.truncate_fully_and_start_at, leader_start,
                                               self._manager.wall_clock_ms())
        if log_.log_end_offset == state.fetch_offset:  # nothing moved: do not spin
            self._delay([state])
        state.fetch_offset = log_.log_end_offset

    async def _leader_offset(self, state: _PartitionFetch, timestamp: int) -> int | None:
        response = await self._connection.request(LIST_OFFSETS, LIST_OFFSETS_VERSION, {
            "replica_id": self._manager.broker_id, "isolation_level": 0,
            "topics": [{"name": state.topic, "partitions": [
                {"partition_index": state.partition,
                 "current_leader_epoch": state.leader_epoch, "timestamp": timestamp}]}]})
        [answer] = [p for t in response.topics for p in t.partitions]
        if answer.error_code != 0:
            self._partition_error(state, "ListOffsets", answer.error_code)
            return None
        return answer.offset


def append_fetched(log, records: bytes | memoryview, leader_high_watermark: int,
                   leader_log_start_offset: int, now_ms: int) -> int:
    """On the append thread: append fetched batches as a follower (a trailing partial batch
    is left for the next fetch), then move the high watermark to min(leader's, log end) and
    the log start offset up to the leader's (never past the high watermark). Returns the new
    log end offset."""
    if len(records):
        log.append_as_follower(records, now_ms)
    log.update_high_watermark(min(leader_high_watermark, log.log_end_offset))
    new_start = min(leader_log_start_offset, log.high_watermark)
    if new_start > log.log_start_offset:
        log.delete_records_before(new_start)
    return log.log_end_offset


class ReplicaFetcherManager:
    """The fetchers of one broker, one per leader it follows partitions of."""

    def __init__(self, state, cache, local_logs) -> None:
        self._state = state
        self._cache = cache
        self._logs = local_logs
        self.broker_id: int = state.node_id
        self.config = ReplicaFetcherConfig.from_broker_config(state.config)
        self.follower_quota = ReplicationQuota(
            state.config.get_int(FOLLOWER_THROTTLED_RATE),
            state.config.get_int("replication.quota.window.num"),
            state.config.get_int("replication.quota.window.size.seconds") * 1000)
        self._fetchers: dict[int, ReplicaFetcher] = {}
        # partition -> (leader, leader epoch, log) of every partition handed to a fetcher
        self._followed: dict[tuple[str, int], tuple[int, int, object]] = {}

    def now_ms(self) -> int:
        """Monotonic: backoffs and the quota's windows."""
        return self._state.clock.monotonic_ms()

    def wall_clock_ms(self) -> int:
        """Wall time, for the log (segment roll and retention times)."""
        return self._state.clock.now_ms()

    async def run_append(self, function, *args):
        return await self._state.run_append(function, *args)

    def follower_rate(self) -> int:
        return self._state.config.get_int(FOLLOWER_THROTTLED_RATE)

    def endpoint_of(self, broker_id: int) -> tuple[str, int] | None:
        broker = self._cache.current.brokers.get(broker_id)
        return None if broker is None else (broker.host, broker.port)

    def throttled(self, topic: str, partition: int) -> bool:
        """Whether ``follower.replication.throttled.replicas`` names this replica."""
        cluster_topic = self._cache.current.topics.get(topic)
        return cluster_topic is not None and is_throttled(
            cluster_topic.configs.get(FOLLOWER_THROTTLED_REPLICAS), self.broker_id, partition)

    @property
    def fetchers(self) -> dict[int, ReplicaFetcher]:
        return self._fetchers

    async def follow(self, followed: Mapping[tuple[str, int], tuple[int, int]]) -> None:
        """Make the fetchers fetch exactly ``followed``: partition -> (leader, leader epoch).
        A partition whose leader, epoch or log (a topic re-created) changed starts over."""
        wanted = {}
        for key, (leader_id, leader_epoch) in followed.items():
            try:
                wanted[key] = (leader_id, leader_epoch, self._logs.get_log(*key))
            except KafkaError as error:  # offline, or not created: the next change retries
                log.error("broker %d cannot follow %s-%d: %s", self.broker_id, *key, error)
        await self._remove([key for key, value in self._followed.items()
                            if wanted.get(key) != value])
        for key, value in wanted.items():
            if key in self._followed:
                continue
            leader_id, leader_epoch, log_ = value
            try:
                await self.run_append(self._manage_high_watermark, key, log_)
            except Exception:  # this partition only; the next metadata change retries it
                log.exception("broker %d cannot follow %s-%d", self.broker_id, *key)
                continue
            self._fetcher_for(leader_id).add(_PartitionFetch(key[0], key[1], log_, leader_epoch))
            self._followed[key] = value
        for leader_id in [i for i, f in self._fetchers.items() if not f.partitions]:
            await self._fetchers.pop(leader_id).stop()

    async def unfollow_topic(self, name: str) -> None:
        """Stop fetching every partition of topic ``name`` (its logs are about to go)."""
        await self._remove([key for key in self._followed if key[0] == name])

    async def _remove(self, keys: list[tuple[str, int]]) -> None:
        """Drop ``keys`` from their fetchers; returns once no log work on them is under way."""
        for leader_id, fetcher in self._fetchers.items():
            await fetcher.remove([key for key in keys if self._followed[key][0] == leader_id])
        for key in keys:
            del self._followed[key]

    def _manage_high_watermark(self, key: tuple[str, int], log_) -> None:
        """A follower's high watermark is the leader's: from the checkpoint at start-up
        (Kafka's ``initialHighWatermark``) unless already managed (it led until now)."""
        if not log_.high_watermark_managed:
            log_.manage_high_watermark(self._logs.initial_high_watermark(*key))

    def _fetcher_for(self, leader_id: int) -> ReplicaFetcher:
        fetcher = self._fetchers.get(leader_id)
        if fetcher is None:
            fetcher = self._fetchers[leader_id] = ReplicaFetcher(self, leader_id)
            fetcher.start()
        return fetcher

    async def stop(self) -> None:
        for fetcher in self._fetchers.values():
            await fetcher.stop()
        self._fetchers.clear()
        self._followed.clear()
