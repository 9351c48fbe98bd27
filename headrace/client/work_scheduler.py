"""Per-partition record buffers handed out round-robin to a worker pool (seed 003).

Owns the state shared between the parallel consumer's poll thread and its workers:

* one FIFO buffer per assigned partition, filled by the poll thread in offset order;
* round-robin hand-out across partitions, so no partition starves;
* the ordering guarantee: ``partition`` (one record in flight per partition, in offset order),
  ``key`` (one record in flight per key, per-key offset order; records without a key are not
  ordered among themselves) or ``unordered``;
* buffer limits (records and bytes, per partition and in total) the poll thread turns into
  pause/resume decisions;
* each partition's ``PartitionOffsets`` (what may be committed) and metric figures.

A partition's state carries an assignment epoch: a record handed out before its partition was
revoked completes into nothing, so a later re-assignment never sees stale completions. In-flight
counts per partition and per key outlive revocation, so ordering holds across a quick
revoke/re-assign even when a revoked record is still running.

Thread-safety: every public method takes the one internal lock; ``take`` blocks on its condition.
"""

from __future__ import annotations

import itertools
import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from headrace.client.offset_tracker import PartitionOffsets

Ordering = Literal["partition", "key", "unordered"]
ORDERINGS: tuple[Ordering, ...] = ("partition", "key", "unordered")
TopicPartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class BufferLimits:
    """Bounds on records held in buffers (not yet handed to a worker)."""

    max_buffered_records_per_partition: int = 1_000
    max_buffered_bytes_per_partition: int = 4 * 1024 * 1024
    max_buffered_records: int = 10_000
    max_buffered_bytes: int = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class WorkItem:
    """One record handed to a worker; ``message`` is the client's record object."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    size_bytes: int
    epoch: int
    message: Any


@dataclass(frozen=True, slots=True)
class PartitionMetrics:
    topic: str
    partition: int
    buffered_records: int
    buffered_bytes: int
    in_flight: int
    committed_offset: int | None
    committable_offset: int | None
    high_watermark: int | None
    lag: int | None
    paused: bool


@dataclass(slots=True)
class _PartitionState:
    epoch: int
    offsets: PartitionOffsets
    buffer: deque[WorkItem] = field(default_factory=deque)
    buffered_bytes: int = 0
    committed_offset: int | None = None
    last_commit_requested: tuple[int, str] | None = None
    high_watermark: int | None = None
    paused: bool = False


class WorkScheduler:
    """Buffers, round-robin hand-out, ordering, limits and offsets; see the module docstring."""

    def __init__(self, ordering: Ordering, limits: BufferLimits) -> None:
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering must be one of {ORDERINGS}, not {ordering!r}")
        self._ordering = ordering
        self._limits = limits
        self._states: dict[TopicPartitionKey, _PartitionState] = {}
        self._round_robin: list[TopicPartitionKey] = []
        self._cursor = 0
        self._in_flight_by_partition: Counter[TopicPartitionKey] = Counter()
        self._in_flight_by_key: Counter[bytes] = Counter()
        self._buffered_records = 0
        self._buffered_bytes = 0
        self._epochs = itertools.count(1)
        self._dispatching = True
        self._condition = threading.Condition()

    # ---- assignment (poll thread) ----

    def assign(self, tp: TopicPartitionKey, skip_offsets: set[int] | None = None) -> None:
        with self._condition:
            self._states[tp] = _PartitionState(next(self._epochs), PartitionOffsets(skip_offsets))
            self._round_robin.append(tp)

    def drop_buffered(self, tps: list[TopicPartitionKey]) -> None:
        """Forget buffered records of ``tps`` (revocation); in-flight ones keep running."""
        with self._condition:
            for tp in tps:
                state = self._states.get(tp)
                if state is not None:
                    self._discard_buffer(state)

    def remove(self, tps: list[TopicPartitionKey]) -> None:
        with self._condition:
            for tp in tps:
                state = self._states.pop(tp, None)
                if state is not None:
                    self._discard_buffer(state)
                    self._round_robin.remove(tp)
            self._condition.notify_all()

    def assigned(self) -> list[TopicPartitionKey]:
        with self._condition:
            return list(self._round_robin)

    def _discard_buffer(self, state: _PartitionState) -> None:
        self._buffered_records -= len(state.buffer)
        self._buffered_bytes -= state.buffered_bytes
        state.buffer.clear()
        state.buffered_bytes = 0

    # ---- filling (poll thread) ----

    def add(self, topic: str, partition: int, offset: int, key: bytes | None,
            size_bytes: int, message: Any) -> bool:
        """Buffer one fetched record; False when skipped (done before) or not assigned."""
        with self._condition:
            state = self._states.get((topic, partition))
            if state is None or not self._dispatching:
                return False
            skip = state.offsets.should_skip(offset)
            state.offsets.register_fetched(offset)
            if skip:
                state.offsets.mark_done(offset)
                return False
            state.buffer.append(WorkItem(topic, partition, offset, key, size_bytes, state.epoch, message))
            state.buffered_bytes += size_bytes
            self._buffered_records += 1
            self._buffered_bytes += size_bytes
            self._condition.notify()
            return True

    def partitions_to_pause(self) -> set[TopicPartitionKey]:
        """Partitions whose buffer (or the total) is at its limit."""
        limits = self._limits
        with self._condition:
            if (self._buffered_records >= limits.max_buffered_records
                    or self._buffered_bytes >= limits.max_buffered_bytes):
                return set(self._states)
            return {
                tp for tp, state in self._states.items()
                if len(state.buffer) >= limits.max_buffered_records_per_partition
                or state.buffered_bytes >= limits.max_buffered_bytes_per_partition
            }

    def set_paused(self, tps: set[TopicPartitionKey], paused: bool) -> None:
        with self._condition:
            for tp in tps:
                if tp in self._states:
                    self._states[tp].paused = paused

    # ---- hand-out (workers) ----

    def take(self, timeout_s: float | None = None) -> WorkItem | None:
        """The next record for a worker, or None once dispatch stopped (or on timeout)."""
        with self._condition:
            while self._dispatching:
                item = self._next_eligible()
                if item is not None:
                    return item
                if not self._condition.wait(timeout_s):
                    return None
            return None

    def _next_eligible(self) -> WorkItem | None:
        count = len(self._round_robin)
        for step in range(count):
            index = (self._cursor + step) % count
            tp = self._round_robin[index]
            item = self._pop_eligible(tp, self._states[tp])
            if item is not None:
                self._cursor = (index + 1) % count
                self._start(item)
                return item
        return None

    def _pop_eligible(self, tp: TopicPartitionKey, state: _PartitionState) -> WorkItem | None:
        if not state.buffer:
            return None
        if self._ordering == "unordered":
            return state.buffer.popleft()
        if self._ordering == "partition":
            return state.buffer.popleft() if self._in_flight_by_partition[tp] == 0 else None
        for index, item in enumerate(state.buffer):
            if item.key is None or self._in_flight_by_key[item.key] == 0:
                del state.buffer[index]
                return item
        return None

    def _start(self, item: WorkItem) -> None:
        state = self._states[(item.topic, item.partition)]
        state.buffered_bytes -= item.size_bytes
        self._buffered_records -= 1
        self._buffered_bytes -= item.size_bytes
        self._in_flight_by_partition[(item.topic, item.partition)] += 1
        if item.key is not None:
            self._in_flight_by_key[item.key] += 1

    def complete(self, item: WorkItem, done: bool) -> None:
        """A worker finished with ``item``; ``done`` False means abandoned (not processed)."""
        tp = (item.topic, item.partition)
        with self._condition:
            self._in_flight_by_partition[tp] -= 1
            if self._in_flight_by_partition[tp] == 0:
                del self._in_flight_by_partition[tp]
            if item.key is not None:
                self._in_flight_by_key[item.key] -= 1
                if self._in_flight_by_key[item.key] == 0:
                    del self._in_flight_by_key[item.key]
            state = self._states.get(tp)
            if done and state is not None and state.epoch == item.epoch:
                state.offsets.mark_done(item.offset)
            self._condition.notify_all()

    def is_current(self, item: WorkItem) -> bool:
        """False once ``item``'s partition was revoked (its retries may stop)."""
        with self._condition:
            state = self._states.get((item.topic, item.partition))
            return state is not None and state.epoch == item.epoch and self._dispatching

    def wait_idle(self, tps: list[TopicPartitionKey], timeout_s: float) -> bool:
        """Wait until no record of ``tps`` is in flight; False on timeout."""
        with self._condition:
            return self._condition.wait_for(
                lambda: all(self._in_flight_by_partition[tp] == 0 for tp in tps), timeout_s)

    def stop_dispatch(self) -> None:
        """Drop every buffer and make ``take`` return None from now on (closing)."""
        with self._condition:
            self._dispatching = False
            for state in self._states.values():
                self._discard_buffer(state)
            self._condition.notify_all()

    # ---- offsets (poll thread) ----

    def commit_candidates(self, tps: list[TopicPartitionKey] | None,
                          offset_metadata_max_bytes: int | None) -> list[tuple[str, int, int, str]]:
        """(topic, partition, offset, metadata) that moved since their last commit request.

        ``offset_metadata_max_bytes`` None: commits carry no done-offset metadata.
        """
        candidates = []
        with self._condition:
            for tp in (self._round_robin if tps is None else tps):
                state = self._states.get(tp)
                if state is None:
                    continue
                offset = state.offsets.committable_offset()
                if offset is None:
                    continue
                metadata = ("" if offset_metadata_max_bytes is None
                            else state.offsets.commit_metadata(offset_metadata_max_bytes))
                if state.last_commit_requested != (offset, metadata):
                    state.last_commit_requested = (offset, metadata)
                    candidates.append((tp[0], tp[1], offset, metadata))
        return candidates

    def record_commit_result(self, tp: TopicPartitionKey, offset: int, succeeded: bool) -> None:
        with self._condition:
            state = self._states.get(tp)
            if state is None:
                return
            if succeeded:
                state.committed_offset = max(offset, state.committed_offset or 0)
            else:
                state.last_commit_requested = None

    def record_high_watermark(self, tp: TopicPartitionKey, high_watermark: int) -> None:
        with self._condition:
            state = self._states.get(tp)
            if state is not None:
                state.high_watermark = high_watermark

    # ---- metrics (any thread) ----

    def partition_metrics(self) -> list[PartitionMetrics]:
        with self._condition:
            return [self._metrics_of(tp, self._states[tp]) for tp in self._round_robin]

    def _metrics_of(self, tp: TopicPartitionKey, state: _PartitionState) -> PartitionMetrics:
        committed = state.committed_offset
        high = state.high_watermark
        lag = max(0, high - committed) if high is not None and committed is not None else None
        return PartitionMetrics(
            topic=tp[0], partition=tp[1], buffered_records=len(state.buffer),
            buffered_bytes=state.buffered_bytes, in_flight=self._in_flight_by_partition[tp],
            committed_offset=committed, committable_offset=state.offsets.committable_offset(),
            high_watermark=high, lag=lag, paused=state.paused)

    def totals(self) -> tuple[int, int, int]:
        """(buffered records, buffered bytes, records in flight)."""
        with self._condition:
            return (self._buffered_records, self._buffered_bytes,
                    sum(self._in_flight_by_partition.values()))
