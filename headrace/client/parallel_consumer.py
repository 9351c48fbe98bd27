"""ParallelConsumer: at-least-once concurrent record processing on confluent-kafka (librdkafka).

Owns the poll thread, the worker pool and the commit policy around a ``WorkScheduler``:

* The poll thread is the only thread that touches the ``confluent_kafka.Consumer``. It polls in
  batches no larger than the buffers can take (``WorkScheduler.consume_capacity``), waiting for
  workers to make room when they are full. A partition (or the total) still full after
  ``pause_after_full_ms`` is paused and resumed once drained, so the poll thread keeps calling
  ``consume()`` well within ``max.poll.interval.ms`` however long handlers run (seed 003's
  pause/poll/resume heartbeat). Pausing is deferred because librdkafka drops a paused
  partition's prefetched records and fetches them again on resume.
* ``workers`` threads take runs of records round-robin across partitions under the chosen
  ordering (see ``work_scheduler``: a run is processed one record at a time, in offset order, and
  reported at once) and run the handler on each record (a plain function, or a coroutine
  function run on one private event loop). Runs last at most about ``max_run_ms`` of handler
  time and ``max_run_records`` records, so a no-op handler pays one hand-out per many records
  while a slow one is spread over every worker.
* Adaptive parallelism (see ``parallelism``): not every worker takes runs. Each worker measures
  its runs' handler wall time and its own CPU time; every ``parallelism_window_ms`` the poll
  thread sizes the active workers to them. A run shorter than ``single_worker_max_run_us`` (a
  no-op or cheap handler) goes to one worker and the others sleep untouched; if the handler
  also runs rather than waits (CPU time at least ``inline_min_duty`` of its wall time, default
  one half) and is a plain function, no worker takes runs at all (*inline mode*,
  ``active_workers`` 0, below). A handler that waits (wall >> CPU: I/O, sleeps) gets about
  ``cpu_share_max / (CPU/wall)`` workers, at most ``workers``, growing only while the active
  ones are saturated; a CPU-bound Python handler gets one (the GIL admits no more). A handler
  blocking every active worker while records wait doubles them each window. The active count
  starts at 1 and is the ``active_workers`` metric. Handler time is read from a
  ``HandlerClock`` (the performance counter and the thread's CPU clock; tests inject one).
* Inline mode: the poll thread runs the records itself between ``consume()`` calls -- a batch
  straight from ``consume()`` when nothing is in flight (``WorkScheduler.add_batch_inline``),
  else buffered runs (``take_inline``) -- with the same ordering, offset tracking
  (``complete``) and measurements as a worker: no thread hand-off and no wait for the
  interpreter lock held by a worker, so a no-op handler costs about what a plain consume loop
  costs. The delay to the next ``consume()`` is bounded: the poll thread starts no new run
  after ``max_run_ms`` of inline runs (those not started go back to the buffer), and a run is
  cut once its handler time passes ``max_run_ms`` -- checked after its first record, then
  every ``INLINE_CHECK_MAX_RECORDS`` (32) records -- which ends inline mode at once (the run's
  records not yet started go back to the buffer, for a worker; the policy sizes the pool from
  the next window on). So polling waits at most 2 x ``max_run_ms`` plus 32 calls of a handler
  that turned slow; ``max.poll.interval.ms`` is respected as long as those stay below it
  (librdkafka heartbeats from its own thread). The cut is ``max_run_ms``, not the
  much smaller ``single_worker_max_run_us`` that admits a handler to inline mode (measured as
  a window's mean): one run's wall time also counts the thread being preempted or waiting for
  the interpreter lock, which on a busy machine often exceeds 100 us. A record whose handler raises
  inline is never retried on the poll thread: its run, still in flight, is handed to a worker
  (``WorkScheduler.hand_over``), which retries it with backoff, and inline mode ends.
  Rebalance callbacks run inside ``consume()``, so no inline run is in progress during a
  revocation's commit.
* A handler that raises is retried with exponential backoff (``retry_backoff_ms`` doubling up to
  ``retry_backoff_max_ms``, +/-20 % jitter, Kafka's client defaults). With ``dead_letter_topic``
  set, a record failing ``dead_letter_after_attempts`` times is produced there (same key, value
  and headers plus ``headrace.dlt.*`` headers) and counts as done; without it a record is retried
  until it succeeds, its partition is revoked, or the consumer closes -- never dropped. The
  rest of its run waits behind it (order within a run is offset order).
* Offsets are committed per partition only up to the first record not yet done, every
  ``commit_interval_ms`` (asynchronously), and synchronously on revocation and on close. Done
  offsets above that point travel in the commit metadata (see ``offset_tracker``) unless
  ``encode_done_offsets_in_metadata`` is False, and a new owner skips them.
* Revocation (eager or cooperative-sticky incremental): buffered records of revoked partitions
  are dropped, as are the not yet started records of their running runs; records in flight are
  awaited up to ``revoke_timeout_ms`` (which must be below
  ``max.poll.interval.ms``), their offsets committed, then the partitions released. Lost
  partitions (session expired) are dropped without a commit.

Exactly-once mode (``transactional_id`` set; KIP-98 and KIP-447 consume-transform-produce):

* The handler returns the records its input becomes (an iterable of ``OutputRecord``, or
  None); the consumer produces them with one transactional producer (``transactional.id`` =
  ``transactional_id``, which must be unique per running consumer) and commits the input
  offsets in the same transaction (``send_offsets_to_transaction`` with the group's metadata,
  so a member fenced by a rebalance cannot commit), one transaction per commit interval and
  at each revocation and close. The input is read read_committed unless the config says
  otherwise. Read read_committed, the output then holds each input record's results once
  across crashes: a killed consumer's open transaction is aborted when its successor (the
  same ``transactional_id``) initialises, or after ``transaction_timeout_ms``.
* A run's outputs are held until the run ends and are then produced together with its
  completion, inside a section commits wait for (``_CommitGate``): a transaction never holds
  the output of a record whose offset it does not commit, nor the reverse. Every commit
  therefore commits all assigned partitions' positions.
* A failed commit or produce, and lost partitions (their records' outputs may sit in the
  open transaction), stop the consumer: ``close()`` re-raises, and a new consumer resumes from
  the last committed transaction. Dead-lettered records go through the separate dead-letter
  producer, at least once.

The consumer config is librdkafka's (``bootstrap.servers``, ``group.id``, ...); this class forces
``enable.auto.commit=false`` and defaults ``LIBRDKAFKA_CONFIG_DEFAULTS`` (a user's value wins):
librdkafka stops fetching a partition for ``fetch.queue.backoff.ms`` (its default: 1,000 ms)
whenever its local queue is over ``queued.min.messages`` (100,000, counted over the consumer's
whole queue) or ``queued.max.messages.kbytes``. A consumer that drains the queue in less than
that (100,000 small records take ~0.1 s) then finds it empty and waits out the rest of the
second in ``consume()`` (confluentinc/librdkafka#2879); a 10 ms backoff keeps the queue fed. The
benchmark's plain loop runs with the same settings. A partition is resumed after an assignment
only if this consumer had paused it when it was released (in case librdkafka kept the pause):
resuming one that is not paused is wasted work.

Thread-safety: ``start``, ``close`` and ``metrics`` may be called from any thread; the handler
runs concurrently on up to ``workers`` threads, or on the poll thread alone in inline mode.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import groupby
from operator import itemgetter
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, Producer, TopicPartition

from headrace.client.offset_tracker import (
    OFFSET_METADATA_MAX_BYTES_DEFAULT,
    OffsetRange,
    decode_done_ranges,
)
from headrace.client.parallelism import (
    CPU_SHARE_MAX_DEFAULT,
    INLINE_MIN_DUTY_DEFAULT,
    NS_PER_US,
    PARALLELISM_WINDOW_MS_DEFAULT,
    SINGLE_WORKER_MAX_RUN_US_DEFAULT,
    ParallelismLimits,
    target_workers,
)
from headrace.client.work_scheduler import (
    MAX_RUN_MS_DEFAULT,
    MAX_RUN_RECORDS_DEFAULT,
    NS_PER_MS,
    BufferLimits,
    Ordering,
    PartitionMetrics,
    Run,
    TopicPartitionKey,
    WorkScheduler,
)
from headrace.storage.clock import Clock, SystemClock

log = logging.getLogger(__name__)

MAX_POLL_INTERVAL_MS_DEFAULT = 300_000  # librdkafka / Kafka max.poll.interval.ms default
RETRY_JITTER_FRACTION = 0.2  # Kafka's CommonClientConfigs exponential backoff jitter
# A full buffer that workers drain within this long is not worth a pause (and refetch).
PAUSE_AFTER_FULL_MS_DEFAULT = 500
# Inline mode reads the clock at least every this many records of a run (see _process_run_inline).
INLINE_CHECK_MAX_RECORDS = 32
SUCCEEDED, DEAD_LETTERED = "succeeded", "dead-lettered"  # outcomes of a retried record
# librdkafka settings this class defaults (see module doc); a consumer_config value wins.
LIBRDKAFKA_CONFIG_DEFAULTS: dict[str, Any] = {"fetch.queue.backoff.ms": 10}
TRANSACTION_TIMEOUT_MS_DEFAULT = 60_000  # the Java producer's transaction.timeout.ms
PRODUCE_QUEUE_FULL_WAIT_S = 0.05


@dataclass(frozen=True, slots=True)
class ParallelConsumerOptions:
    workers: int = 16
    ordering: Ordering = "key"
    buffer_limits: BufferLimits = BufferLimits()
    poll_timeout_ms: int = 100
    poll_batch_records: int = 500
    commit_interval_ms: int = 1_000
    revoke_timeout_ms: int = 10_000
    close_timeout_ms: int = 30_000
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1_000
    dead_letter_topic: str | None = None
    dead_letter_after_attempts: int = 5
    encode_done_offsets_in_metadata: bool = True
    offset_metadata_max_bytes: int = OFFSET_METADATA_MAX_BYTES_DEFAULT
    max_run_records: int = MAX_RUN_RECORDS_DEFAULT
    max_run_ms: int = MAX_RUN_MS_DEFAULT
    pause_after_full_ms: int = PAUSE_AFTER_FULL_MS_DEFAULT
    single_worker_max_run_us: int = SINGLE_WORKER_MAX_RUN_US_DEFAULT
    cpu_share_max: float = CPU_SHARE_MAX_DEFAULT
    parallelism_window_ms: int = PARALLELISM_WINDOW_MS_DEFAULT
    inline_min_duty: float = INLINE_MIN_DUTY_DEFAULT
    transactional_id: str | None = None  # set: exactly-once mode (see module doc)
    transaction_timeout_ms: int = TRANSACTION_TIMEOUT_MS_DEFAULT


@dataclass(frozen=True, slots=True)
class OutputRecord:
    """A record an exactly-once handler returns, produced in the consumer's transaction.
    ``partition`` None: the producer's partitioner chooses."""

    topic: str
    value: bytes | None
    key: bytes | None = None
    partition: int | None = None
    headers: list[tuple[str, bytes]] | None = None


class _CommitGate:
    """Sections that produce a run's outputs and complete it (any number at once) against
    transaction commits (one at a time, waiting for the sections under way, holding new
    ones back)."""

    def __init__(self) -> None:
        self._condition = threading.Condition()
        self._sections = 0
        self._committing = False

    @contextmanager
    def section(self) -> Iterator[None]:
        with self._condition:
            self._condition.wait_for(lambda: not self._committing)
            self._sections += 1
        try:
            yield
        finally:
            with self._condition:
                self._sections -= 1
                self._condition.notify_all()

    @contextmanager
    def commit(self) -> Iterator[None]:
        with self._condition:
            self._committing = True
            self._condition.wait_for(lambda: self._sections == 0)
        try:
            yield
        finally:
            with self._condition:
                self._committing = False
                self._condition.notify_all()


class HandlerClock(Protocol):
    """Where handler time is measured: the process's performance counter and the calling
    thread's CPU clock, in nanoseconds. Tests pass one that counts costs their handlers
    declare, so the parallelism policy sees the same figures on any machine."""

    def wall_ns(self) -> int: ...

    def thread_cpu_ns(self) -> int: ...


class SystemHandlerClock:
    """``time.perf_counter_ns`` and ``time.thread_time_ns``."""

    wall_ns = staticmethod(time.perf_counter_ns)
    thread_cpu_ns = staticmethod(time.thread_time_ns)


@dataclass(frozen=True, slots=True)
class ConsumerMetrics:
    """A point-in-time snapshot; per-partition figures in ``partitions``. ``active_workers`` 0:
    inline mode (the poll thread runs the handler)."""

    buffered_records: int
    buffered_bytes: int
    in_flight: int
    processed_records: int
    failed_attempts: int
    dead_lettered_records: int
    commits: int
    active_workers: int
    partitions: list[PartitionMetrics]


class ParallelConsumer:
    """Process records of ``topics`` concurrently with at-least-once commits; see module doc."""

    def __init__(self, consumer_config: dict[str, Any], topics: list[str],
                 handler: Callable[[Message], Any],
                 options: ParallelConsumerOptions = ParallelConsumerOptions(),
                 clock: Clock | None = None,
                 handler_clock: HandlerClock | None = None) -> None:
        self._validate(consumer_config, options)
        self._options = options
        self._topics = list(topics)
        self._user_handler = handler
        self._handler = handler
        self._handler_is_async = inspect.iscoroutinefunction(handler)
        self._transactional = options.transactional_id is not None
        self._pending = threading.local()  # exactly once: each thread's run's outputs
        self._commit_gate = _CommitGate()
        self._outputs_since_commit = 0
        self._transaction_producer = self._make_transaction_producer(consumer_config, options)
        if self._transactional and not self._handler_is_async:
            self._handler = self._collecting_handler
        self._clock = clock or SystemClock()
        self._handler_clock = handler_clock or SystemHandlerClock()
        self._scheduler = WorkScheduler(options.ordering, options.buffer_limits,
                                        options.max_run_records, options.max_run_ms)
        self._parallelism_limits = ParallelismLimits(
            max_workers=options.workers, single_worker_max_run_us=options.single_worker_max_run_us,
            cpu_share_max=options.cpu_share_max, inline_min_duty=options.inline_min_duty,
            inline_allowed=not self._handler_is_async)
        self._inline_max_run_ns = options.max_run_ms * NS_PER_MS
        self._inline_budget_ns = options.max_run_ms * NS_PER_MS
        self._window_started_ms = 0
        self._single_topic = (self._topics[0] if len(self._topics) == 1
                              and not self._topics[0].startswith("^") else None)
        isolation = {"isolation.level": "read_committed"} if self._transactional else {}
        self._consumer_config = {**LIBRDKAFKA_CONFIG_DEFAULTS, **isolation, **consumer_config,
                                 "enable.auto.commit": False,
                                 "on_commit": self._on_commit}
        self._consumer: Consumer | None = None
        self._dead_letter_producer = self._make_dead_letter_producer(consumer_config, options)
        self._stopping = threading.Event()
        self._counter_lock = threading.Lock()
        self._processed_records = 0
        self._failed_attempts = 0
        self._dead_lettered_records = 0
        self._commits = 0
        self._paused: set[TopicPartitionKey] = set()
        self._resume_after_assign: set[TopicPartitionKey] = set()
        self._released_while_paused: set[TopicPartitionKey] = set()
        self._full_since_ms: dict[TopicPartitionKey, int] = {}
        self._poll_failure: BaseException | None = None
        self._poll_thread = threading.Thread(target=self._poll_loop, name="pc-poll", daemon=True)
        self._workers = [threading.Thread(target=self._work_loop, args=(index,),
                                          name=f"pc-worker-{index}", daemon=True)
                         for index in range(options.workers)]
        self._event_loop: asyncio.AbstractEventLoop | None = None
        self._event_loop_thread: threading.Thread | None = None

    @staticmethod
    def _validate(consumer_config: dict[str, Any], options: ParallelConsumerOptions) -> None:
        if options.workers < 1:
            raise ValueError("workers must be at least 1")
        if "group.id" not in consumer_config:
            raise ValueError("consumer_config needs group.id: offsets are committed to a group")
        max_poll_interval_ms = int(consumer_config.get("max.poll.interval.ms",
                                                       MAX_POLL_INTERVAL_MS_DEFAULT))
        if options.revoke_timeout_ms >= max_poll_interval_ms:
            raise ValueError(f"revoke_timeout_ms {options.revoke_timeout_ms} must be below "
                             f"max.poll.interval.ms {max_poll_interval_ms}")
        if options.pause_after_full_ms >= max_poll_interval_ms:
            raise ValueError(f"pause_after_full_ms {options.pause_after_full_ms} must be below "
                             f"max.poll.interval.ms {max_poll_interval_ms}")
        if options.dead_letter_after_attempts < 1:
            raise ValueError("dead_letter_after_attempts must be at least 1")
        if not 0 < options.cpu_share_max <= 1:
            raise ValueError("cpu_share_max must be in (0, 1]: a share of one interpreter")
        if options.parallelism_window_ms < 1:
            raise ValueError("parallelism_window_ms must be at least 1")

    @staticmethod
    def _make_dead_letter_producer(consumer_config: dict[str, Any],
                                   options: ParallelConsumerOptions) -> Producer | None:
        if options.dead_letter_topic is None:
            return None
        return Producer({"bootstrap.servers": consumer_config["bootstrap.servers"],
                         "enable.idempotence": True})

    @staticmethod
    def _make_transaction_producer(consumer_config: dict[str, Any],
                                   options: ParallelConsumerOptions) -> Producer | None:
        if options.transactional_id is None:
            return None
        return Producer({"bootstrap.servers": consumer_config["bootstrap.servers"],
                         "transactional.id": options.transactional_id,
                         "transaction.timeout.ms": options.transaction_timeout_ms})

    # ---- exactly once ----

    def _collecting_handler(self, message: Message) -> None:
        self._collect(self._user_handler(message))

    def _collect(self, outputs: Iterable[OutputRecord] | None) -> None:
        if outputs is None:
            return
        pending = getattr(self._pending, "outputs", None)
        if pending is None:
            pending = self._pending.outputs = []
        pending.extend(outputs)

    def _take_outputs(self) -> list[OutputRecord]:
        pending = getattr(self._pending, "outputs", None) or []
        self._pending.outputs = []
        return pending

    def _produce_outputs(self) -> None:
        """Produce this thread's held outputs into the open transaction (inside a section of
        the commit gate, or on the poll thread, which alone commits)."""
        outputs = self._take_outputs()
        if not outputs:
            return
        producer = self._transaction_producer
        assert producer is not None
        for output in outputs:
            arguments: dict[str, Any] = {"key": output.key, "headers": output.headers}
            if output.partition is not None:
                arguments["partition"] = output.partition
            while True:
                try:
                    producer.produce(output.topic, output.value, **arguments)
                    break
                except BufferError:
                    producer.poll(PRODUCE_QUEUE_FULL_WAIT_S)
        producer.poll(0)
        with self._counter_lock:
            self._outputs_since_commit += len(outputs)

    def _complete_with_outputs(self, run: Run, done_records: int, wall_ns: int,
                               cpu_ns: int) -> None:
        with self._commit_gate.section():
            self._produce_outputs()
            self._scheduler.complete(run, done_records, wall_ns, cpu_ns)

    def _commit_transaction(self) -> None:
        """Commit every assigned partition's position with the outputs produced so far, in
        the open transaction, and open the next; raises (stopping the consumer) on failure."""
        assert self._consumer is not None and self._transaction_producer is not None
        metadata_max_bytes = (self._options.offset_metadata_max_bytes
                              if self._options.encode_done_offsets_in_metadata else None)
        timeout_s = self._options.close_timeout_ms / 1000
        with self._commit_gate.commit():
            candidates = self._scheduler.commit_candidates(None, metadata_max_bytes)
            if not candidates and not self._outputs_since_commit:
                return
            offsets = [TopicPartition(t, p, offset, metadata) if metadata
                       else TopicPartition(t, p, offset) for t, p, offset, metadata in candidates]
            producer = self._transaction_producer
            if offsets:
                producer.send_offsets_to_transaction(
                    offsets, self._consumer.consumer_group_metadata(), timeout_s)
            producer.commit_transaction(timeout_s)
            producer.begin_transaction()
            self._outputs_since_commit = 0
            with self._counter_lock:
                self._commits += 1
        for t, p, offset, _ in candidates:
            self._scheduler.record_commit_result((t, p), offset, succeeded=True)

    # ---- lifecycle ----

    def start(self) -> ParallelConsumer:
        if self._handler_is_async:
            self._event_loop = asyncio.new_event_loop()
            self._event_loop_thread = threading.Thread(
                target=self._event_loop.run_forever, name="pc-asyncio", daemon=True)
            self._event_loop_thread.start()
        for worker in self._workers:
            worker.start()
        self._poll_thread.start()
        return self

    def close(self) -> None:
        """Stop taking records, wait (bounded) for in-flight ones, commit, leave the group.

        Re-raises an error that stopped the poll thread.
        """
        self._stopping.set()
        if self._poll_thread.is_alive():
            self._poll_thread.join()
        self._scheduler.stop_dispatch()
        for worker in self._workers:
            if worker.is_alive():
                worker.join(self._options.close_timeout_ms / 1000)
        if self._event_loop is not None and self._event_loop_thread is not None:
            self._event_loop.call_soon_threadsafe(self._event_loop.stop)
            self._event_loop_thread.join()
            self._event_loop.close()
        if self._dead_letter_producer is not None:
            self._dead_letter_producer.flush(self._options.close_timeout_ms / 1000)
        if self._poll_failure is not None:
            raise self._poll_failure

    def __enter__(self) -> ParallelConsumer:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def failure(self) -> BaseException | None:
        """The error that stopped the poll thread, if any."""
        return self._poll_failure

    # ---- poll thread ----

    def _poll_loop(self) -> None:
        try:
            self._consumer = Consumer(self._consumer_config)
            if self._transaction_producer is not None:
                self._transaction_producer.init_transactions(
                    self._options.close_timeout_ms / 1000)
                self._transaction_producer.begin_transaction()
            self._consumer.subscribe(self._topics, on_assign=self._on_assign,
                                     on_revoke=self._on_revoke, on_lost=self._on_lost)
            next_commit_ms = self._clock.monotonic_ms() + self._options.commit_interval_ms
            self._window_started_ms = self._clock.monotonic_ms()
            while not self._stopping.is_set():
                self._apply_backpressure()
                inline_runs = self._poll_once()
                ran = (self._run_inline(inline_runs or [])
                       if self._scheduler.active_workers == 0 else 0)
                if inline_runs is None and not ran:
                    self._scheduler.wait_for_space(self._options.poll_timeout_ms / 1000)
                now_ms = self._clock.monotonic_ms()
                if now_ms - self._window_started_ms >= self._options.parallelism_window_ms:
                    self._adjust_parallelism(now_ms - self._window_started_ms)
                    self._window_started_ms = now_ms
                if self._clock.monotonic_ms() >= next_commit_ms:
                    self._refresh_high_watermarks()
                    self._commit(None, asynchronous=True)
                    next_commit_ms = self._clock.monotonic_ms() + self._options.commit_interval_ms
            self._shut_down_consumer()
        except BaseException as error:  # surfaced by close(); the thread must not die silently
            log.exception("parallel consumer poll loop failed")
            self._poll_failure = error
            self._scheduler.stop_dispatch()

    def _poll_once(self) -> list[Run] | None:
        """consume() as many records as the buffers can take; None (not polled) when they are
        full, unless every partition is paused (then poll anyway, for callbacks and liveness).
        Returns the runs started for the poll thread (inline mode, see ``_buffer``)."""
        assert self._consumer is not None
        capacity = self._scheduler.consume_capacity(self._paused,
                                                    self._options.poll_batch_records)
        if capacity <= 0 and not set(self._scheduler.assigned()) <= self._paused:
            return None
        return self._buffer(self._consumer.consume(
            max(1, min(self._options.poll_batch_records, capacity)),
            self._options.poll_timeout_ms / 1000))

    def _run_inline(self, started_runs: list[Run]) -> int:
        """Inline mode: run ``started_runs``, then buffered runs, on the poll thread, starting
        none after ``max_run_ms``; leave inline mode after a run slower than ``max_run_ms``
        (its records not yet started go back to the buffer) or
        whose handler raised (the run goes to a worker, which retries). Runs not started go
        back to the buffer. Returns the runs taken. Wall time is measured per run as in
        ``_work_loop``; CPU time once for the whole call (reading this thread's CPU clock is a
        system call, dearer than a run of a no-op handler), which counts the scheduler's
        bookkeeping in between as handler CPU: the policy only uses sums."""
        scheduler = self._scheduler
        handler_clock = self._handler_clock
        perf_counter_ns, thread_time_ns = handler_clock.wall_ns, handler_clock.thread_cpu_ns
        started_cpu_ns = thread_time_ns()
        deadline_ns = perf_counter_ns() + self._inline_budget_ns
        pending = started_runs[::-1]
        runs = 0
        try:
            while not self._stopping.is_set():
                run = pending.pop() if pending else scheduler.take_inline()
                if run is None:
                    break
                runs += 1
                started_ns = perf_counter_ns()
                done_records, error = self._process_run_inline(
                    run, started_ns + self._inline_max_run_ns)
                finished_ns = perf_counter_ns()
                wall_ns = finished_ns - started_ns
                if self._transactional:
                    self._produce_outputs()  # the poll thread alone commits
                if error is not None:
                    scheduler.put_back(pending)
                    pending = []
                    scheduler.hand_over(run, done_records, error)
                    self._leave_inline_mode(f"the handler raised {error!r}")
                    break
                if done_records < len(run.messages):
                    scheduler.give_back(run, done_records, wall_ns, 0)
                    self._leave_inline_mode(f"a run passed {wall_ns // NS_PER_US} us")
                    break
                scheduler.complete(run, done_records, wall_ns)
                if wall_ns > self._inline_max_run_ns:
                    self._leave_inline_mode(f"a run took {wall_ns // NS_PER_US} us")
                    break
                if finished_ns >= deadline_ns:
                    break
        finally:
            if pending:
                scheduler.put_back(pending)
            if runs:
                scheduler.record_handler_cpu(thread_time_ns() - started_cpu_ns)
        return runs

    def _process_run_inline(self, run: Run, check_deadline_ns: int) -> tuple[int, Exception | None]:
        """Run the handler on the run's records in order on the poll thread: (records done, the
        error the next one raised, if any). Stops early, without error, once the handler has
        run past ``check_deadline_ns``; the clock is read after the first record, then after
        every ``INLINE_CHECK_MAX_RECORDS`` records, not after each one (a clock read costs a
        no-op handler's time several times over). No revocation check per record: partitions are
        revoked and dispatch stopped only on this thread."""
        handler, messages = self._handler, run.messages
        perf_counter_ns = self._handler_clock.wall_ns
        count, done_records, stretch, error = len(messages), 0, 1, None
        while done_records < count:
            records = messages[done_records:done_records + stretch]
            try:
                for message in records:
                    handler(message)
            except Exception as raised:
                done_records += records.index(message)  # identity: the one that raised
                error = raised
                break
            done_records += len(records)
            if done_records < count and perf_counter_ns() > check_deadline_ns:
                break
            stretch = INLINE_CHECK_MAX_RECORDS
        with self._counter_lock:
            self._processed_records += done_records
        return done_records, error

    def _leave_inline_mode(self, reason: str) -> None:
        """One worker takes the next runs; the policy's next window starts now, so it sizes the
        pool from runs measured after the switch."""
        log.debug("leaving inline mode: %s", reason)
        if self._scheduler.active_workers == 0:
            self._scheduler.set_active_workers(1)
        self._scheduler.take_handler_window(0)
        self._window_started_ms = self._clock.monotonic_ms()

    def _adjust_parallelism(self, window_ms: int) -> None:
        window = self._scheduler.take_handler_window(window_ms * NS_PER_MS)
        target = target_workers(window, self._parallelism_limits)
        if target != window.active_workers:
            log.debug("active workers %d -> %d after %s", window.active_workers, target, window)
            self._scheduler.set_active_workers(target)

    def _shut_down_consumer(self) -> None:
        assert self._consumer is not None
        self._scheduler.stop_dispatch()
        self._scheduler.wait_idle(self._scheduler.assigned(), self._options.close_timeout_ms / 1000)
        self._commit(None, asynchronous=False)
        self._consumer.close()

    def _buffer(self, messages: list[Message]) -> list[Run]:
        """Group a consume() batch by partition and hand it to the scheduler; in inline mode,
        the runs it started for the poll thread (``WorkScheduler.add_batch_inline``). The
        per-record steps are C calls (map over method descriptors, groupby on itemgetter): no
        Python frame per record."""
        if not messages:
            return []
        if any(map(Message.error, messages)):
            messages = self._without_errors(messages)
        by_partition: dict[TopicPartitionKey, list[Message]] = {}
        if self._single_topic is not None:
            topic = self._single_topic
            for partition, group in groupby(messages, key=Message.partition):
                by_partition.setdefault((topic, partition), []).extend(group)
        else:
            keyed = zip(zip(map(Message.topic, messages), map(Message.partition, messages),
                            strict=True), messages, strict=True)
            for tp, group in groupby(keyed, key=itemgetter(0)):  # runs per partition
                by_partition.setdefault(tp, []).extend(map(itemgetter(1), group))
        if not by_partition:
            return []
        if self._scheduler.active_workers == 0:
            return self._scheduler.add_batch_inline(by_partition)[1]
        self._scheduler.add_batch(by_partition)
        return []

    def _without_errors(self, messages: list[Message]) -> list[Message]:
        records = []
        for message in messages:
            error = message.error()
            if error is None:
                records.append(message)
            else:
                self._handle_consume_error(error)
        return records

    @staticmethod
    def _handle_consume_error(error: KafkaError) -> None:
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.fatal():
            raise KafkaException(error)
        log.warning("consume error: %s", error)

    def _apply_backpressure(self) -> None:
        """Pause partitions full for ``pause_after_full_ms`` (and keep them paused while full);
        resume the others."""
        assert self._consumer is not None
        now_ms = self._clock.monotonic_ms()
        full = self._scheduler.full_partitions()
        self._full_since_ms = {tp: self._full_since_ms.get(tp, now_ms) for tp in full}
        wanted = {tp for tp, since_ms in self._full_since_ms.items()
                  if now_ms - since_ms >= self._options.pause_after_full_ms} | (self._paused & full)
        to_resume = (self._paused - wanted) | (self._resume_after_assign - wanted)
        to_pause = wanted - self._paused
        self._resume_after_assign.clear()
        if to_pause:
            self._consumer.pause([TopicPartition(t, p) for t, p in to_pause])
            self._scheduler.set_paused(to_pause, True)
        if to_resume:
            self._consumer.resume([TopicPartition(t, p) for t, p in to_resume])
            self._scheduler.set_paused(to_resume, False)
        self._paused = (self._paused | to_pause) - to_resume

    def _refresh_high_watermarks(self) -> None:
        assert self._consumer is not None
        for topic, partition in self._scheduler.assigned():
            _, high = self._consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                           cached=True)
            if high is not None and high >= 0:
                self._scheduler.record_high_watermark((topic, partition), high)

    def _commit(self, tps: list[TopicPartitionKey] | None, asynchronous: bool) -> None:
        assert self._consumer is not None
        if self._transactional:
            self._commit_transaction()
            return
        metadata_max_bytes = (self._options.offset_metadata_max_bytes
                              if self._options.encode_done_offsets_in_metadata else None)
        candidates = self._scheduler.commit_candidates(tps, metadata_max_bytes)
        if not candidates:
            return
        offsets = [TopicPartition(t, p, offset, metadata) if metadata else TopicPartition(t, p, offset)
                   for t, p, offset, metadata in candidates]
        with self._counter_lock:
            self._commits += 1
        try:
            result = self._consumer.commit(offsets=offsets, asynchronous=asynchronous)
        except KafkaException as error:
            log.warning("commit failed: %s", error)
            for t, p, offset, _ in candidates:
                self._scheduler.record_commit_result((t, p), offset, succeeded=False)
            return
        if not asynchronous and result:
            self._record_commit_results(None, result)

    def _on_commit(self, error: KafkaError | None, partitions: list[TopicPartition]) -> None:
        if error is not None:
            log.warning("commit failed: %s", error)
        self._record_commit_results(error, partitions)

    def _record_commit_results(self, error: KafkaError | None,
                               partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            succeeded = error is None and tp.error is None
            if tp.offset >= 0:
                self._scheduler.record_commit_result((tp.topic, tp.partition), tp.offset, succeeded)

    # ---- rebalance callbacks (run inside consume() on the poll thread) ----

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        skip_by_partition = self._done_offsets_from_metadata(consumer, partitions)
        for tp in partitions:
            key = (tp.topic, tp.partition)
            self._scheduler.assign(key, skip_by_partition.get(key))
            if key in self._released_while_paused:
                self._released_while_paused.discard(key)
                self._resume_after_assign.add(key)
        log.info("assigned %s", [(tp.topic, tp.partition) for tp in partitions])

    def _done_offsets_from_metadata(self, consumer: Consumer, partitions: list[TopicPartition]
                                    ) -> dict[TopicPartitionKey, list[OffsetRange]]:
        if not self._options.encode_done_offsets_in_metadata or not partitions:
            return {}
        committed = consumer.committed([TopicPartition(tp.topic, tp.partition) for tp in partitions],
                                       timeout=self._options.revoke_timeout_ms / 1000)
        return {(tp.topic, tp.partition): decode_done_ranges(tp.offset, tp.metadata)
                for tp in committed if tp.offset >= 0 and tp.metadata}

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        keys = [(tp.topic, tp.partition) for tp in partitions]
        self._scheduler.drop_buffered(keys)
        if not self._scheduler.wait_idle(keys, self._options.revoke_timeout_ms / 1000):
            log.warning("revoke: records of %s still in flight after %d ms; releasing anyway",
                        keys, self._options.revoke_timeout_ms)
        self._commit(keys, asynchronous=False)
        self._release(keys)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        self._release([(tp.topic, tp.partition) for tp in partitions])
        if self._transactional:
            raise KafkaException(KafkaError(
                KafkaError._STATE, f"lost partitions {[(tp.topic, tp.partition) for tp in partitions]}"
                " with outputs in the open transaction: the consumer stops, a new one resumes "
                "from the last committed transaction"))

    def _release(self, keys: list[TopicPartitionKey]) -> None:
        self._scheduler.remove(keys)
        self._released_while_paused.update(self._paused.intersection(keys))
        self._paused.difference_update(keys)
        self._resume_after_assign.difference_update(keys)
        log.info("released %s", keys)

    # ---- workers ----

    def _work_loop(self, worker_index: int) -> None:
        """Take runs while this worker is active. The handler's wall and CPU time are measured
        with the process's performance counter and this thread's CPU clock: figures about the
        handler, not time the consumer's logic depends on."""
        take = self._scheduler.take
        complete = (self._complete_with_outputs if self._transactional
                    else self._scheduler.complete)
        handler_clock = self._handler_clock
        perf_counter_ns, thread_time_ns = handler_clock.wall_ns, handler_clock.thread_cpu_ns
        while True:
            run = take(None, worker_index)
            if run is None:
                return
            started_ns, started_cpu_ns = perf_counter_ns(), thread_time_ns()
            done_records = 0
            try:
                done_records = self._process_run(run)
            except BaseException:
                self._take_outputs()  # no record of the run counts as done
                raise
            finally:
                complete(run, done_records, perf_counter_ns() - started_ns,
                         thread_time_ns() - started_cpu_ns)

    def _process_run(self, run: Run) -> int:
        """Process the run's records in order (from ``run.resume_index``, retrying the record
        that raised inline first); how many were done before one was abandoned."""
        done_records, dead_lettered = run.resume_index, 0
        handler = self._handler if self._event_loop is None else self._run_async_handler
        state, scheduler = run.state, self._scheduler  # run.is_current(), inlined: per record
        messages = run.messages
        try:
            if run.resume_error is not None:
                if not run.is_current():
                    return done_records
                outcome = self._retry(run, messages[done_records], run.resume_error)
                if outcome is None:
                    return done_records
                dead_lettered += outcome == DEAD_LETTERED
                done_records += 1
            if done_records:
                messages = messages[done_records:]
            for message in messages:
                if state.revoked or not scheduler.dispatching:
                    break
                try:
                    handler(message)
                except Exception as error:
                    outcome = self._retry(run, message, error)
                    if outcome is None:
                        break
                    dead_lettered += outcome == DEAD_LETTERED
                done_records += 1
        finally:
            with self._counter_lock:
                self._processed_records += done_records - run.resume_index - dead_lettered
        return done_records

    def _retry(self, run: Run, message: Message, error: Exception) -> str | None:
        """Retry a failed record until it succeeds or is dead-lettered (which is returned);
        None if abandoned."""
        attempts = 1
        while True:
            with self._counter_lock:
                self._failed_attempts += 1
            log.debug("handler failed on %s-%d@%d (attempt %d): %r", run.topic, run.partition,
                      message.offset(), attempts, error)
            if self._dead_letter_producer is not None and \
                    attempts >= self._options.dead_letter_after_attempts:
                if self._dead_letter(message, error, attempts):
                    return DEAD_LETTERED
            if self._stopping.wait(self._backoff_s(attempts)) or not run.is_current():
                return None
            try:
                self._run_handler(message)
                return SUCCEEDED
            except Exception as next_error:
                error = next_error
                attempts += 1

    def _run_handler(self, message: Message) -> None:
        if self._event_loop is None:
            self._handler(message)
            return
        self._run_async_handler(message)

    def _run_async_handler(self, message: Message) -> None:
        assert self._event_loop is not None
        outputs = asyncio.run_coroutine_threadsafe(self._user_handler(message),
                                                   self._event_loop).result()
        if self._transactional:
            self._collect(outputs)

    def _backoff_s(self, attempts: int) -> float:
        backoff_ms = min(self._options.retry_backoff_ms * 2 ** (attempts - 1),
                         self._options.retry_backoff_max_ms)
        jitter = random.uniform(1 - RETRY_JITTER_FRACTION, 1 + RETRY_JITTER_FRACTION)
        return backoff_ms * jitter / 1000

    def _dead_letter(self, message: Message, error: Exception, attempts: int) -> bool:
        """Produce ``message`` to the dead-letter topic and wait for the ack; True once acked."""
        assert self._dead_letter_producer is not None and self._options.dead_letter_topic
        outcome: list[KafkaError | None] = []
        headers = list(message.headers() or []) + [
            ("headrace.dlt.topic", message.topic().encode()),
            ("headrace.dlt.partition", str(message.partition()).encode()),
            ("headrace.dlt.offset", str(message.offset()).encode()),
            ("headrace.dlt.attempts", str(attempts).encode()),
            ("headrace.dlt.error", repr(error).encode()[:1024]),
        ]
        self._dead_letter_producer.produce(
            self._options.dead_letter_topic, key=message.key(), value=message.value(),
            headers=headers, on_delivery=lambda err, _msg: outcome.append(err))
        while not outcome and not self._stopping.is_set():
            self._dead_letter_producer.poll(0.1)
        if outcome and outcome[0] is None:
            with self._counter_lock:
                self._dead_lettered_records += 1
            return True
        log.warning("dead-letter produce of %s-%d@%d failed: %s", message.topic(),
                    message.partition(), message.offset(), outcome[0] if outcome else "closing")
        return False

    # ---- metrics ----

    def metrics(self) -> ConsumerMetrics:
        buffered_records, buffered_bytes, in_flight = self._scheduler.totals()
        with self._counter_lock:
            return ConsumerMetrics(
                buffered_records=buffered_records, buffered_bytes=buffered_bytes,
                in_flight=in_flight, processed_records=self._processed_records,
                failed_attempts=self._failed_attempts,
                dead_lettered_records=self._dead_lettered_records, commits=self._commits,
                active_workers=self._scheduler.active_workers,
                partitions=self._scheduler.partition_metrics())
