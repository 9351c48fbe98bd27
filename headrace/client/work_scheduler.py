"""Per-partition record buffers handed out round-robin, in runs, to a worker pool (seed 003).

Owns the state shared between the parallel consumer's poll thread and its workers:

* one FIFO buffer per assigned partition, filled by the poll thread in offset order, one lock
  acquisition per ``consume()`` batch. The buffer holds *chunks*: lists of records fetched one
  after another, each with the slot start of its first record (see ``offset_tracker``);
* round-robin hand-out across partitions, so no partition starves. A worker takes a *run*: up
  to ``run_records`` records of one partition that it processes one at a time, in offset order,
  and reports at once -- one lock round trip and O(1) offset bookkeeping per run instead of per
  record. ``run_records`` adapts to the handler: it doubles (up to ``max_run_records``) while
  runs finish within half of ``max_run_ms`` and halves when a run takes longer than that, so a
  no-op handler gets long runs and a slow one gets runs of one record and full parallelism;
* the ordering guarantee: ``partition`` (one run in flight per partition; its records run one at
  a time in offset order), ``key`` (a key is in at most one run in flight; a run's records run
  in order, so per-key offset order holds; records without a key are not ordered among
  themselves) or ``unordered``;
* buffer limits (records and bytes -- key plus value -- per partition and in total). The poll
  thread asks ``consume_capacity`` how many records it may take from the client without the
  total going over its record limit or an unpaused partition more than one poll batch over its
  own (the same overshoot pausing after the fact allows); partitions full
  for long (``full_partitions``) are paused by the poll thread. Pausing is the last resort:
  librdkafka purges a paused partition's prefetched records and fetches them again on resume;
* each partition's ``PartitionOffsets`` (what may be committed) and metric figures;
* how many workers take runs (``active_workers``, set by the consumer's parallelism policy, see
  ``parallelism``): worker ``i`` takes runs only while ``i < active_workers`` and otherwise
  sleeps on its own condition, so a no-op handler's records go to one worker without waking the
  others. At 0 (inline mode) no worker takes runs: the poll thread takes them with
  ``take_inline`` (never blocks) and runs them itself; while nothing is in flight,
  ``add_batch_inline`` turns a fetched batch straight into runs (one per partition, never
  buffered nor sized in bytes) and ``put_back`` returns those the poll thread did not start. ``complete`` sums the handler wall and
  CPU time of finished runs for the policy (``take_handler_window``), whoever ran them;
* hand-over: a run the poll thread started inline whose handler raised goes, still in flight
  (so its ordering claims hold), to the workers with ``hand_over``; the next active worker takes
  it before any new run and resumes it at ``Run.resume_index``, retrying the failed record
  first. An inline run that took too long is cut instead: ``give_back`` returns its records
  not yet started to the front of the partition's buffer.

A partition's state object is replaced on re-assignment and flagged ``revoked`` when its
buffered records are dropped: a worker stops a run of a revoked partition before its next record,
and a run completing into a replaced state marks nothing done. In-flight counts per partition
and in-flight keys outlive revocation, so ordering holds across a quick revoke/re-assign even
when a revoked run is still running.

Thread-safety: every public method takes the one internal lock; ``take`` blocks on its
condition. ``Run.is_current`` is a lock-free read of two flags (attribute reads are atomic).
"""

from __future__ import annotations

import threading
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, Literal

from confluent_kafka import Message

from headrace.client.offset_tracker import OffsetRange, PartitionOffsets
from headrace.client.parallelism import HandlerWindow

Ordering = Literal["partition", "key", "unordered"]
ORDERINGS: tuple[Ordering, ...] = ("partition", "key", "unordered")
TopicPartitionKey = tuple[str, int]

MAX_RUN_RECORDS_DEFAULT = 500
MAX_RUN_MS_DEFAULT = 10
NS_PER_MS = 1_000_000


@dataclass(frozen=True, slots=True)
class BufferLimits:
    """Bounds on records held in buffers (not yet handed to a worker)."""

    max_buffered_records_per_partition: int = 1_000
    max_buffered_bytes_per_partition: int = 4 * 1024 * 1024
    max_buffered_records: int = 10_000
    max_buffered_bytes: int = 64 * 1024 * 1024


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


def size_bytes(messages: list[Any]) -> int:
    """Key plus value bytes of confluent-kafka messages (``len(message)`` is the value's)."""
    return sum(map(len, messages)) + sum(map(len, filter(None, map(Message.key, messages))))


@dataclass(slots=True)
class _Chunk:
    """Records fetched one after another: ``messages[0]``'s slot starts at ``slot_start``."""

    messages: list[Any]
    slot_start: int
    size_bytes: int


@dataclass(slots=True)
class _PartitionState:
    topic: str
    partition: int
    offsets: PartitionOffsets
    chunks: deque[_Chunk] = field(default_factory=deque)
    buffered_records: int = 0
    buffered_bytes: int = 0
    committed_offset: int | None = None
    last_commit_requested: tuple[int, str] | None = None
    high_watermark: int | None = None
    paused: bool = False
    revoked: bool = False


@dataclass(slots=True)
class Run:
    """Records of one partition for one worker, in offset order.

    ``segments``: (index in ``messages`` where a stretch of consecutively fetched records begins,
    slot start of that record); ``keys``: the keys this run holds in flight (key ordering), left
    None by a run cut while no other was in flight until another cut needs them (``key_set``):
    a single worker then never builds a key set.
    """

    topic: str
    partition: int
    messages: list[Any]
    segments: list[tuple[int, int]]
    keys: frozenset[bytes] | None  # None: not computed yet (see key_set)
    state: _PartitionState
    scheduler: WorkScheduler
    size_bytes: int
    resume_index: int = 0  # records before it were done inline before a hand-over
    resume_error: Exception | None = None  # what messages[resume_index] raised inline

    def is_current(self) -> bool:
        """False once the partition was revoked or dispatch stopped (stop before next record)."""
        return not self.state.revoked and self.scheduler.dispatching

    def key_set(self) -> frozenset[bytes]:
        """The record keys of this run (None keys excluded), computed once."""
        if self.keys is None:
            keys = set(map(Message.key, self.messages))
            keys.discard(None)
            self.keys = frozenset(keys)
        return self.keys

    def rest_chunks(self, done_records: int) -> list[_Chunk]:
        """The records after the first ``done_records``, as chunks of consecutively fetched
        records with their slot starts."""
        chunks = []
        bounds = [index for index, _ in self.segments[1:]] + [len(self.messages)]
        for (first, slot_start), end_index in zip(self.segments, bounds, strict=True):
            if end_index <= done_records:
                continue
            begin = max(first, done_records)
            if begin > first:
                slot_start = self.messages[begin - 1].offset() + 1
            messages = self.messages[begin:end_index]
            chunks.append(_Chunk(messages, slot_start, size_bytes(messages)))
        return chunks

    def done_ranges(self, done_records: int) -> list[OffsetRange]:
        """Slot ranges of the first ``done_records`` records."""
        ranges = []
        bounds = [index for index, _ in self.segments[1:]] + [len(self.messages)]
        for (first, slot_start), end_index in zip(self.segments, bounds, strict=True):
            if first >= done_records:
                break
            last = min(end_index, done_records) - 1
            ranges.append((slot_start, self.messages[last].offset() + 1))
        return ranges


class WorkScheduler:
    """Buffers, round-robin hand-out in runs, ordering, limits and offsets; see module doc."""

    def __init__(self, ordering: Ordering, limits: BufferLimits,
                 max_run_records: int = MAX_RUN_RECORDS_DEFAULT,
                 max_run_ms: int = MAX_RUN_MS_DEFAULT) -> None:
        if ordering not in ORDERINGS:
            raise ValueError(f"ordering must be one of {ORDERINGS}, not {ordering!r}")
        if max_run_records < 1:
            raise ValueError("max_run_records must be at least 1")
        self._ordering = ordering
        self._limits = limits
        self._max_run_records = max_run_records
        self._max_run_ns = max_run_ms * NS_PER_MS
        self.run_records = 1
        self.active_workers = 1
        self._runs_in_flight = 0
        self._window_runs = self._window_records = 0
        self._window_wall_ns = self._window_cpu_ns = 0
        self._states: dict[TopicPartitionKey, _PartitionState] = {}
        self._round_robin: list[TopicPartitionKey] = []
        self._cursor = 0
        self._in_flight_by_partition: Counter[TopicPartitionKey] = Counter()
        self._key_runs_in_flight: dict[int, Run] = {}  # id(run) -> run, key ordering only
        self._handed_over: deque[Run] = deque()  # started inline, to be resumed by a worker
        self._buffered_records = 0
        self._buffered_bytes = 0
        self.dispatching = True
        self._lock = threading.Lock()
        self._work_available = threading.Condition(self._lock)
        self._partition_idle = threading.Condition(self._lock)
        self._space_available = threading.Condition(self._lock)
        self._worker_activated = threading.Condition(self._lock)

    # ---- assignment (poll thread) ----

    def assign(self, tp: TopicPartitionKey, skip_ranges: list[OffsetRange] | None = None) -> None:
        with self._lock:
            old = self._states.get(tp)
            if old is not None:
                old.revoked = True
                self._discard_buffer(old)
            else:
                self._round_robin.append(tp)
            self._states[tp] = _PartitionState(tp[0], tp[1], PartitionOffsets(skip_ranges or ()))

    def drop_buffered(self, tps: list[TopicPartitionKey]) -> None:
        """Forget buffered records of ``tps`` (revocation); running runs stop before their next
        record."""
        with self._lock:
            for tp in tps:
                state = self._states.get(tp)
                if state is not None:
                    state.revoked = True
                    self._discard_buffer(state)

    def remove(self, tps: list[TopicPartitionKey]) -> None:
        with self._lock:
            for tp in tps:
                state = self._states.pop(tp, None)
                if state is not None:
                    state.revoked = True
                    self._discard_buffer(state)
                    self._round_robin.remove(tp)

    def assigned(self) -> list[TopicPartitionKey]:
        with self._lock:
            return list(self._round_robin)

    def _discard_buffer(self, state: _PartitionState) -> None:
        self._buffered_records -= state.buffered_records
        self._buffered_bytes -= state.buffered_bytes
        state.chunks.clear()
        state.buffered_records = state.buffered_bytes = 0

    # ---- filling (poll thread) ----

    def add_batch(self, by_partition: dict[TopicPartitionKey, list[Any]]) -> int:
        """Buffer fetched messages (per partition, in offset order); returns how many were
        buffered (records of unassigned partitions, or done before, are not)."""
        added = 0
        with self._lock:
            if not self.dispatching:
                return 0
            for tp, messages in by_partition.items():
                state = self._states.get(tp)
                if state is not None and not state.revoked:
                    added += self._add_messages(state, messages)
            if added:
                self._work_available.notify(-(-added // self.run_records))
        return added

    def add_batch_inline(self, by_partition: dict[TopicPartitionKey, list[Any]]
                         ) -> tuple[int, list[Run]]:
        """Inline mode's ``add_batch``: (records accepted, runs started for the poll thread).
        While no run is in flight and no worker is active, a partition's records with nothing
        buffered before them (and none done by a previous owner) become one run started at once:
        never buffered, never sized in bytes. The others are buffered as by ``add_batch``.
        The poll thread runs these runs one after another, so they cannot break an ordering
        among themselves; it returns any it does not run with ``put_back``."""
        runs: list[Run] = []
        added = 0
        with self._lock:
            if not self.dispatching:
                return 0, runs
            direct = self._runs_in_flight == 0 and self.active_workers == 0
            for tp, messages in by_partition.items():
                state = self._states.get(tp)
                if state is None or state.revoked:
                    continue
                first_offset = messages[0].offset()
                if direct and not state.chunks and not state.offsets.skip.active_below(first_offset):
                    slot_start = state.offsets.register_fetched(first_offset, messages[-1].offset())
                    runs.append(self._start_direct(tp, state, messages, slot_start))
                    added += len(messages)
                else:
                    added += self._add_messages(state, messages)
        return added, runs

    def _start_direct(self, tp: TopicPartitionKey, state: _PartitionState, messages: list[Any],
                      slot_start: int) -> Run:
        run = Run(state.topic, state.partition, messages, [(0, slot_start)], None, state, self, 0)
        self._in_flight_by_partition[tp] += len(messages)
        if self._ordering == "key":
            self._key_runs_in_flight[id(run)] = run
        self._runs_in_flight += 1
        return run

    def put_back(self, runs: list[Run]) -> None:
        """Runs the poll thread took but did not start: their records go back to the front of
        their partitions' buffers, in order (not counted as completed runs)."""
        with self._lock:
            for run in runs:
                self._release(run)
                self._rebuffer_rest(run, 0)

    def _add_messages(self, state: _PartitionState, messages: list[Any]) -> int:
        offsets = state.offsets
        first_offset, last_offset = messages[0].offset(), messages[-1].offset()
        slot_start = offsets.register_fetched(first_offset, last_offset)
        if not offsets.skip.active_below(first_offset):
            self._append_chunk(state, _Chunk(messages, slot_start, size_bytes(messages)))
            return len(messages)
        added = 0
        kept: list[Any] = []
        kept_slot_start = slot_start
        for message in messages:  # slow path: a previous owner finished some of these
            offset = message.offset()
            if offsets.skip.contains(offset):
                if kept:
                    self._append_chunk(state, _Chunk(kept, kept_slot_start, size_bytes(kept)))
                    added += len(kept)
                    kept = []
                offsets.mark_done(slot_start, offset + 1)
                kept_slot_start = offset + 1
            else:
                kept.append(message)
            slot_start = offset + 1
        if kept:
            self._append_chunk(state, _Chunk(kept, kept_slot_start, size_bytes(kept)))
            added += len(kept)
        return added

    def _append_chunk(self, state: _PartitionState, chunk: _Chunk, at_front: bool = False) -> None:
        count, chunk_bytes = len(chunk.messages), chunk.size_bytes
        if at_front:
            state.chunks.appendleft(chunk)
        else:
            state.chunks.append(chunk)
        state.buffered_records += count
        state.buffered_bytes += chunk_bytes
        self._buffered_records += count
        self._buffered_bytes += chunk_bytes

    def consume_capacity(self, paused: set[TopicPartitionKey], overshoot_records: int) -> int:
        """How many records may be fetched now without the total going over its record limit
        or a partition not in ``paused`` (one batch could be all theirs) going more than
        ``overshoot_records`` over its own."""
        limits = self._limits
        with self._lock:
            capacity = limits.max_buffered_records - self._buffered_records
            partition_limit = limits.max_buffered_records_per_partition + overshoot_records
            for tp, state in self._states.items():
                if tp not in paused:
                    capacity = min(capacity, partition_limit - state.buffered_records)
            return capacity

    def wait_for_space(self, timeout_s: float) -> None:
        """Block until a worker takes records out of the buffers, or ``timeout_s``."""
        with self._lock:
            self._space_available.wait(timeout_s)

    def full_partitions(self) -> set[TopicPartitionKey]:
        """Partitions whose buffer (or the total) is at its limit."""
        limits = self._limits
        with self._lock:
            if (self._buffered_records >= limits.max_buffered_records
                    or self._buffered_bytes >= limits.max_buffered_bytes):
                return set(self._states)
            return {
                tp for tp, state in self._states.items()
                if state.buffered_records >= limits.max_buffered_records_per_partition
                or state.buffered_bytes >= limits.max_buffered_bytes_per_partition
            }

    def set_paused(self, tps: set[TopicPartitionKey], paused: bool) -> None:
        with self._lock:
            for tp in tps:
                if tp in self._states:
                    self._states[tp].paused = paused

    # ---- hand-out (workers) ----

    def take(self, timeout_s: float | None = None, worker_index: int = 0) -> Run | None:
        """The next run for worker ``worker_index``, or None once dispatch stopped (or on
        timeout). A worker not among the ``active_workers`` first waits to be activated."""
        with self._lock:
            while self.dispatching:
                if worker_index >= self.active_workers:
                    if self._buffered_records:  # pass on a wake-up meant for an active worker
                        self._work_available.notify()
                    if not self._worker_activated.wait(timeout_s):
                        return None
                    continue
                if self._handed_over:
                    return self._handed_over.popleft()
                run = self._next_run()
                if run is not None:
                    return run
                if not self._work_available.wait(timeout_s):
                    return None
            return None

    def take_inline(self) -> Run | None:
        """The next run for the poll thread to run itself (inline mode); None if none can be cut
        now or dispatch stopped. Never blocks on a condition."""
        with self._lock:
            return self._next_run() if self.dispatching else None

    def hand_over(self, run: Run, done_records: int, error: Exception) -> None:
        """The poll thread's handler raised ``error`` on ``run.messages[done_records]``: let a
        worker resume the run there, retrying that record first. The run stays in flight; at
        least one worker becomes active."""
        with self._lock:
            run.resume_index, run.resume_error = done_records, error
            self._handed_over.append(run)
            if self.active_workers == 0:
                self.active_workers = 1
            self._worker_activated.notify_all()
            self._work_available.notify()

    def give_back(self, run: Run, done_records: int, wall_ns: int, cpu_ns: int) -> None:
        """The poll thread stopped ``run`` after ``done_records`` records because it took too
        long: complete those and put the rest back at the front of the partition's buffer, in
        offset order, to be cut into new runs -- of one record: the run length starts over.
        Nothing of the partition is in flight in between, so every ordering still holds."""
        with self._lock:
            self._complete(run, done_records, wall_ns, cpu_ns)
            self._rebuffer_rest(run, done_records)
            self.run_records = 1

    def _rebuffer_rest(self, run: Run, done_records: int) -> None:
        state = run.state
        if self.dispatching and not state.revoked and self._states.get(
                (run.topic, run.partition)) is state:
            for chunk in reversed(run.rest_chunks(done_records)):
                self._append_chunk(state, chunk, at_front=True)
            self._work_available.notify()

    def set_active_workers(self, count: int) -> None:
        """Let workers ``0 .. count-1`` take runs (the others sleep once their run is done);
        0: none, the poll thread runs them (``take_inline``)."""
        with self._lock:
            grown = count > self.active_workers
            self.active_workers = count
            if grown:
                self._worker_activated.notify_all()

    def record_handler_cpu(self, cpu_ns: int) -> None:
        """Handler CPU time measured apart from its runs' completion (inline mode)."""
        with self._lock:
            self._window_cpu_ns += cpu_ns

    def take_handler_window(self, window_ns: int) -> HandlerWindow:
        """Handler figures of runs completed since the last call (which are then reset)."""
        with self._lock:
            window = HandlerWindow(
                runs=self._window_runs, records=self._window_records,
                handler_wall_ns=self._window_wall_ns, handler_cpu_ns=self._window_cpu_ns,
                window_ns=window_ns, active_workers=self.active_workers,
                blocked=(self._window_runs == 0 and self._buffered_records > 0
                         and 0 < self.active_workers <= self._runs_in_flight))
            self._window_runs = self._window_records = 0
            self._window_wall_ns = self._window_cpu_ns = 0
            return window

    def _next_run(self) -> Run | None:
        count = len(self._round_robin)
        for step in range(count):
            index = (self._cursor + step) % count
            tp = self._round_robin[index]
            state = self._states[tp]
            if not state.chunks:
                continue
            run = self._cut_run(tp, state)
            if run is not None:
                self._cursor = (index + 1) % count
                self._start(tp, state, run)
                if self._buffered_records:  # pass the wake-up on: more work may be waiting
                    self._work_available.notify()
                return run
        return None

    def _cut_run(self, tp: TopicPartitionKey, state: _PartitionState) -> Run | None:
        if self._ordering == "partition" and self._in_flight_by_partition[tp]:
            return None
        if self._ordering == "key":
            return self._cut_key_run(state)
        chunk = state.chunks[0]
        messages = chunk.messages[:self.run_records]
        return self._take_prefix(state, chunk, messages, frozenset())

    def _take_prefix(self, state: _PartitionState, chunk: _Chunk, messages: list[Any],
                     keys: frozenset[bytes] | None) -> Run:
        slot_start = chunk.slot_start
        if len(messages) == len(chunk.messages):
            run_bytes = chunk.size_bytes
            state.chunks.popleft()
        else:
            run_bytes = size_bytes(messages)
            chunk.messages = chunk.messages[len(messages):]
            chunk.slot_start = messages[-1].offset() + 1
            chunk.size_bytes -= run_bytes
        return Run(state.topic, state.partition, messages, [(0, slot_start)], keys, state,
                   self, run_bytes)

    def _cut_key_run(self, state: _PartitionState) -> Run | None:
        chunk = state.chunks[0]
        messages = chunk.messages[:self.run_records]
        if not self._key_runs_in_flight:  # nothing to conflict with: keys computed when needed
            return self._take_prefix(state, chunk, messages, None)
        keys = set(map(Message.key, messages))
        keys.discard(None)
        in_flight = [run.key_set() for run in self._key_runs_in_flight.values()]
        if all(map(keys.isdisjoint, in_flight)):  # fast path: the whole prefix may run
            return self._take_prefix(state, chunk, messages, frozenset(keys))
        in_flight_keys = set().union(*in_flight)
        for chunk_index, chunk in enumerate(state.chunks):
            run = self._cut_key_run_from(state, chunk_index, chunk, in_flight_keys)
            if run is not None:
                return run
        return None

    def _cut_key_run_from(self, state: _PartitionState, chunk_index: int, chunk: _Chunk,
                          in_flight_keys: set[bytes]) -> Run | None:
        """Eligible records of one chunk (keys not in ``in_flight_keys``, up to
        ``run_records``); the rest stay, split into chunks of consecutively fetched records."""
        taken, left = [], []  # (index in chunk, message)
        run_keys: set[bytes] = set()
        for index, message in enumerate(chunk.messages):
            key = message.key()
            if len(taken) < self.run_records and (
                    key is None or key in run_keys or key not in in_flight_keys):
                taken.append((index, message))
                if key is not None:
                    run_keys.add(key)
            else:
                left.append((index, message))
        if not taken:
            return None
        run_messages = [m for _, m in taken]
        run = Run(state.topic, state.partition, run_messages, self._segments(chunk, taken),
                  frozenset(run_keys), state, self, size_bytes(run_messages))
        del state.chunks[chunk_index]
        for piece in reversed(self._pieces(chunk, left)):
            state.chunks.insert(chunk_index, piece)
        return run

    @staticmethod
    def _slot_start_of(chunk: _Chunk, index: int) -> int:
        return chunk.slot_start if index == 0 else chunk.messages[index - 1].offset() + 1

    def _segments(self, chunk: _Chunk, taken: list[tuple[int, Any]]) -> list[tuple[int, int]]:
        segments = []
        for position, (index, _) in enumerate(taken):
            if position == 0 or taken[position - 1][0] != index - 1:
                segments.append((position, self._slot_start_of(chunk, index)))
        return segments

    def _pieces(self, chunk: _Chunk, left: list[tuple[int, Any]]) -> list[_Chunk]:
        pieces: list[_Chunk] = []
        for position, (index, message) in enumerate(left):
            if position == 0 or left[position - 1][0] != index - 1:
                pieces.append(_Chunk([], self._slot_start_of(chunk, index), 0))
            pieces[-1].messages.append(message)
        for piece in pieces:
            piece.size_bytes = size_bytes(piece.messages)
        return pieces

    def _start(self, tp: TopicPartitionKey, state: _PartitionState, run: Run) -> None:
        count, run_bytes = len(run.messages), run.size_bytes
        state.buffered_records -= count
        state.buffered_bytes -= run_bytes
        self._buffered_records -= count
        self._buffered_bytes -= run_bytes
        self._in_flight_by_partition[tp] += count
        if self._ordering == "key":
            self._key_runs_in_flight[id(run)] = run
        self._runs_in_flight += 1
        self._space_available.notify()

    def complete(self, run: Run, done_records: int, wall_ns: int, cpu_ns: int = 0) -> None:
        """A worker (or the poll thread, inline) finished ``run``: its first ``done_records``
        records were processed, the rest abandoned (not processed). Its handler took ``wall_ns``
        (tunes the run length) and ``cpu_ns`` of the thread's CPU (both feed the parallelism
        policy)."""
        with self._lock:
            self._complete(run, done_records, wall_ns, cpu_ns)
            self._space_available.notify()  # the poll thread may wait for runs to be cut

    def _complete(self, run: Run, done_records: int, wall_ns: int, cpu_ns: int) -> None:
        tp = (run.topic, run.partition)
        self._window_runs += 1
        self._window_records += done_records
        self._window_wall_ns += wall_ns
        self._window_cpu_ns += cpu_ns
        self._release(run)
        if done_records and self._states.get(tp) is run.state:
            for start, end in run.done_ranges(done_records):
                run.state.offsets.mark_done(start, end)
        self._tune_run_length(len(run.messages), done_records, wall_ns)
        if self._ordering != "unordered" and run.state.chunks:
            self._work_available.notify()

    def _release(self, run: Run) -> None:
        """``run`` is no longer in flight."""
        tp = (run.topic, run.partition)
        self._runs_in_flight -= 1
        self._in_flight_by_partition[tp] -= len(run.messages)
        if not self._in_flight_by_partition[tp]:
            del self._in_flight_by_partition[tp]
            self._partition_idle.notify_all()
        self._key_runs_in_flight.pop(id(run), None)

    def _tune_run_length(self, run_records: int, done_records: int, wall_ns: int) -> None:
        if wall_ns > self._max_run_ns:
            self.run_records = max(1, self.run_records // 2)
        elif done_records == run_records and wall_ns * 2 <= self._max_run_ns:
            self.run_records = min(self._max_run_records, self.run_records * 2)

    def wait_idle(self, tps: list[TopicPartitionKey], timeout_s: float) -> bool:
        """Wait until no record of ``tps`` is in flight; False on timeout."""
        with self._lock:
            return self._partition_idle.wait_for(
                lambda: all(self._in_flight_by_partition[tp] == 0 for tp in tps), timeout_s)

    def stop_dispatch(self) -> None:
        """Drop every buffer and make ``take`` return None from now on (closing)."""
        with self._lock:
            self.dispatching = False
            for state in self._states.values():
                self._discard_buffer(state)
            while self._handed_over:  # abandoned: only what ran inline before the failure is done
                run = self._handed_over.popleft()
                self._complete(run, run.resume_index, 0, 0)
            self._work_available.notify_all()
            self._worker_activated.notify_all()

    # ---- offsets (poll thread) ----

    def commit_candidates(self, tps: list[TopicPartitionKey] | None,
                          offset_metadata_max_bytes: int | None) -> list[tuple[str, int, int, str]]:
        """(topic, partition, offset, metadata) that moved since their last commit request.

        ``offset_metadata_max_bytes`` None: commits carry no done-offset metadata.
        """
        candidates = []
        with self._lock:
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
        with self._lock:
            state = self._states.get(tp)
            if state is None:
                return
            if succeeded:
                state.committed_offset = max(offset, state.committed_offset or 0)
            else:
                state.last_commit_requested = None

    def record_high_watermark(self, tp: TopicPartitionKey, high_watermark: int) -> None:
        with self._lock:
            state = self._states.get(tp)
            if state is not None:
                state.high_watermark = high_watermark

    # ---- metrics (any thread) ----

    def partition_metrics(self) -> list[PartitionMetrics]:
        with self._lock:
            return [self._metrics_of(tp, self._states[tp]) for tp in self._round_robin]

    def _metrics_of(self, tp: TopicPartitionKey, state: _PartitionState) -> PartitionMetrics:
        committed = state.committed_offset
        high = state.high_watermark
        lag = max(0, high - committed) if high is not None and committed is not None else None
        return PartitionMetrics(
            topic=tp[0], partition=tp[1], buffered_records=state.buffered_records,
            buffered_bytes=state.buffered_bytes, in_flight=self._in_flight_by_partition[tp],
            committed_offset=committed, committable_offset=state.offsets.committable_offset(),
            high_watermark=high, lag=lag, paused=state.paused)

    def totals(self) -> tuple[int, int, int]:
        """(buffered records, buffered bytes, records in flight)."""
        with self._lock:
            return (self._buffered_records, self._buffered_bytes,
                    sum(self._in_flight_by_partition.values()))
