"""ParallelConsumer against a real broker: ordering guarantees, retries, dead letters,
liveness under long handlers, backpressure, async handlers, metrics."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections import Counter, defaultdict

from confluent_kafka import Consumer
from prometheus_client import CollectorRegistry, generate_latest

from headrace.client import BufferLimits, ParallelConsumer, ParallelConsumerOptions
from headrace.client.prometheus import ParallelConsumerCollector

from .conftest import committed_offsets, consumer_config, create_topic, produce_records

WAIT_TIMEOUT_S = 60.0


class Recorder:
    """Handler bookkeeping: concurrency per partition/key, start order, completion event."""

    def __init__(self, expected_records: int, handler_s: float = 0.002) -> None:
        self.lock = threading.Lock()
        self.handler_s = handler_s
        self.expected = expected_records
        self.all_done = threading.Event()
        self.in_flight_by_partition: Counter = Counter()
        self.in_flight_by_key: Counter = Counter()
        self.in_flight = 0
        self.max_in_flight = self.max_per_partition = self.max_per_key = 0
        self.starts_by_partition = defaultdict(list)
        self.starts_by_key = defaultdict(list)
        self.processed: Counter = Counter()
        self.gate: InFlightGate | None = None  # holds handlers until a concurrency is reached

    def begin(self, message) -> None:
        with self.lock:
            self.in_flight += 1
            self.in_flight_by_partition[message.partition()] += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            self.max_per_partition = max(self.max_per_partition,
                                         self.in_flight_by_partition[message.partition()])
            self.starts_by_partition[message.partition()].append(message.offset())
            if message.key() is not None:
                self.in_flight_by_key[message.key()] += 1
                self.max_per_key = max(self.max_per_key, self.in_flight_by_key[message.key()])
                self.starts_by_key[message.key()].append(message.offset())

    def end(self, message) -> None:
        with self.lock:
            self.in_flight -= 1
            self.in_flight_by_partition[message.partition()] -= 1
            if message.key() is not None:
                self.in_flight_by_key[message.key()] -= 1
            self.processed[(message.partition(), message.offset())] += 1
            if len(self.processed) >= self.expected:
                self.all_done.set()

    def __call__(self, message) -> None:
        self.begin(message)
        if self.gate is not None:
            self.gate.wait()
        time.sleep(self.handler_s)
        self.end(message)


class DeclaredCostClock:
    """A ``HandlerClock`` whose time passes only when a handler declares a cost (``spend``),
    per thread: the parallelism policy sees exactly the declared wall and CPU time, whatever
    the machine's load or speed."""

    def __init__(self) -> None:
        self._thread = threading.local()

    def _counters(self) -> list[int]:
        if not hasattr(self._thread, "counters"):
            self._thread.counters = [0, 0]
        return self._thread.counters

    def spend(self, wall_ns: int, cpu_ns: int) -> None:
        counters = self._counters()
        counters[0] += wall_ns
        counters[1] += cpu_ns

    def wall_ns(self) -> int:
        return self._counters()[0]

    def thread_cpu_ns(self) -> int:
        return self._counters()[1]


# A handler waiting 10 s per record on 10 ms of CPU: one record in any window shorter than 20 s
# keeps the workers saturated (busy at least half the window), so the policy sizes the pool to
# its duty (0.001: every worker) however slowly this machine runs the test.
WAITING_HANDLER_WALL_NS, WAITING_HANDLER_CPU_NS = 10_000_000_000, 10_000_000
# A no-op-like handler: 1 us per record, all of it CPU (it runs rather than waits).
CHEAP_HANDLER_NS = 1_000


class InFlightGate:
    """Holds each handler, once ``until(condition)`` or ``open_for(n)`` was called, until the
    recorder's in-flight state meets the condition (bounded by WAIT_TIMEOUT_S): when the
    consumer really runs that much at once, the handlers meet here and ``reached`` is set; when
    it cannot, the wait times out and ``reached`` stays False. Handlers held here block every
    active worker with records waiting, which the policy answers by doubling the workers."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder, self.condition, self.reached = recorder, None, threading.Event()
        self.gave_up = threading.Event()  # one wait timed out: later ones do not wait again

    def until(self, condition) -> InFlightGate:
        self.condition = condition
        return self

    def open_for(self, wanted: int) -> InFlightGate:
        return self.until(lambda recorder: recorder.in_flight >= wanted)

    def wait(self) -> None:
        if self.condition is None or self.gave_up.is_set():
            return
        with self.recorder.lock:
            if self.condition(self.recorder):
                self.reached.set()
        if not self.reached.wait(WAIT_TIMEOUT_S):
            self.gave_up.set()


def _wait_for_active_workers(consumer: ParallelConsumer, workers: int) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while consumer.metrics().active_workers != workers:
        assert time.monotonic() < deadline, consumer.metrics()
        time.sleep(0.01)


def _run(bootstrap, topic, handler, options, recorder, **config) -> ParallelConsumer:
    group = f"{topic}-{uuid.uuid4().hex[:6]}"
    consumer = ParallelConsumer(consumer_config(bootstrap, group, **config), [topic], handler,
                                options)
    with consumer:
        assert recorder.all_done.wait(WAIT_TIMEOUT_S), f"processed {len(recorder.processed)}"
    assert consumer.failure is None
    consumer.group = group
    return consumer


def _is_increasing(offsets: list[int]) -> bool:
    return all(a < b for a, b in zip(offsets, offsets[1:], strict=False))


def test_partition_ordering(bootstrap):
    topic = create_topic(bootstrap, 3)
    produce_records(bootstrap, topic, 240, 3)
    recorder = Recorder(240)
    recorder.gate = InFlightGate(recorder).open_for(2)
    consumer = _run(bootstrap, topic, recorder, ParallelConsumerOptions(
        workers=8, ordering="partition"), recorder)
    assert recorder.gate.reached.is_set() and recorder.max_in_flight > 1  # side by side
    assert recorder.max_per_partition == 1
    assert all(_is_increasing(starts) for starts in recorder.starts_by_partition.values())
    assert committed_offsets(bootstrap, consumer.group, topic, 3) == {0: 80, 1: 80, 2: 80}


def test_key_ordering(bootstrap):
    topic = create_topic(bootstrap, 2)
    produce_records(bootstrap, topic, 240, 2, keys=12)
    recorder = Recorder(240)
    recorder.gate = InFlightGate(recorder).until(
        lambda r: max(r.in_flight_by_partition.values()) >= 2)
    _run(bootstrap, topic, recorder, ParallelConsumerOptions(workers=8, ordering="key"), recorder)
    assert recorder.gate.reached.is_set()  # keys of one partition ran side by side
    assert recorder.max_per_key == 1
    assert all(_is_increasing(starts) for starts in recorder.starts_by_key.values())
    assert recorder.max_per_partition > 1


def test_unordered_runs_one_partition_concurrently(bootstrap):
    topic = create_topic(bootstrap, 1)
    produce_records(bootstrap, topic, 200, 1)
    recorder = Recorder(200, handler_s=0)
    recorder.gate = InFlightGate(recorder).open_for(2)
    consumer = _run(bootstrap, topic, recorder, ParallelConsumerOptions(
        workers=8, ordering="unordered"), recorder)
    assert recorder.gate.reached.is_set() and recorder.max_per_partition > 1
    assert committed_offsets(bootstrap, consumer.group, topic, 1) == {0: 200}


def test_async_handler(bootstrap):
    topic = create_topic(bootstrap, 2)
    produce_records(bootstrap, topic, 100, 2)
    recorder = Recorder(100)

    async def handler(message):
        recorder.begin(message)
        await asyncio.sleep(0.01)
        recorder.end(message)

    _run(bootstrap, topic, handler, ParallelConsumerOptions(workers=8, ordering="unordered"),
         recorder)
    assert recorder.max_in_flight > 1
    assert set(recorder.processed.values()) == {1}


def test_retries_then_dead_letter(bootstrap):
    topic, dead_letters = create_topic(bootstrap, 2), create_topic(bootstrap, 1, prefix="dlt")
    produce_records(bootstrap, topic, 60, 2)
    recorder = Recorder(60, handler_s=0)
    attempts: Counter = Counter()

    def handler(message):
        index = int(message.value())
        with recorder.lock:
            attempts[index] += 1
            tries = attempts[index]
        if index % 10 == 0 or (index % 3 == 0 and tries < 3):  # poison, or transiently failing
            raise RuntimeError(f"record {index} attempt {tries}")
        recorder(message)

    options = ParallelConsumerOptions(workers=4, ordering="partition", retry_backoff_ms=1,
                                      retry_backoff_max_ms=5, dead_letter_topic=dead_letters,
                                      dead_letter_after_attempts=4)
    recorder.expected = 54  # the six poison records end in the dead-letter topic instead
    consumer = _run(bootstrap, topic, handler, options, recorder)
    poison = {i for i in range(60) if i % 10 == 0}
    assert {attempts[i] for i in poison} == {4}
    assert {attempts[i] for i in range(60) if i % 3 == 0 and i not in poison} == {3}
    assert consumer.metrics().dead_lettered_records == 6
    assert committed_offsets(bootstrap, consumer.group, topic, 2) == {0: 30, 1: 30}
    reader = Consumer(consumer_config(bootstrap, f"{dead_letters}-reader"))
    reader.subscribe([dead_letters])
    seen = {}
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while len(seen) < 6 and time.monotonic() < deadline:
        for message in reader.consume(10, 0.5):
            if message.error() is None:
                seen[int(message.value())] = dict(message.headers())
    reader.close()
    assert set(seen) == poison
    assert all(headers["headrace.dlt.attempts"] == b"4" for headers in seen.values())


def test_long_handler_keeps_membership_and_buffers_stay_bounded(bootstrap):
    topic = create_topic(bootstrap, 2)
    produce_records(bootstrap, topic, 200, 2)
    recorder = Recorder(200, handler_s=0.001)
    max_poll_interval_ms, batch, per_partition = 2_000, 10, 5
    observed_buffered, observed_paused = [], []
    holder: list[ParallelConsumer] = []

    def handler(message):
        if message.offset() == 3:
            time.sleep(max_poll_interval_ms * 1.5 / 1000)  # longer than max.poll.interval.ms
        if holder:
            snapshot = holder[0].metrics()
            observed_buffered.extend(p.buffered_records for p in snapshot.partitions)
            observed_paused.extend(p.paused for p in snapshot.partitions)
        recorder(message)

    options = ParallelConsumerOptions(
        workers=2, ordering="partition", poll_batch_records=batch, revoke_timeout_ms=1_000,
        buffer_limits=BufferLimits(max_buffered_records_per_partition=per_partition))
    group = f"{topic}-live"
    consumer = ParallelConsumer(consumer_config(bootstrap, group,
                                                **{"max.poll.interval.ms": max_poll_interval_ms}),
                                [topic], handler, options)
    holder.append(consumer)
    with consumer:
        assert recorder.all_done.wait(WAIT_TIMEOUT_S)
    assert consumer.failure is None
    assert set(recorder.processed.values()) == {1}  # no rejoin, so nothing was redelivered
    assert max(observed_buffered) <= per_partition + batch
    assert any(observed_paused)


def test_metrics_and_prometheus(bootstrap):
    topic = create_topic(bootstrap, 2)
    produce_records(bootstrap, topic, 50, 2)
    recorder = Recorder(50, handler_s=0)
    consumer = ParallelConsumer(consumer_config(bootstrap, f"{topic}-m"), [topic], recorder,
                                ParallelConsumerOptions(workers=2, commit_interval_ms=50))
    registry = CollectorRegistry()
    registry.register(ParallelConsumerCollector(consumer))
    with consumer:
        assert recorder.all_done.wait(WAIT_TIMEOUT_S)
        deadline = time.monotonic() + WAIT_TIMEOUT_S
        while {p.committed_offset for p in consumer.metrics().partitions} != {25}:
            assert time.monotonic() < deadline, consumer.metrics()
            time.sleep(0.05)
        snapshot = consumer.metrics()
        exposition = generate_latest(registry).decode()
    assert snapshot.processed_records == 50 and snapshot.in_flight == 0
    assert {(p.partition, p.lag) for p in snapshot.partitions} == {(0, 0), (1, 0)}
    assert f'headrace_parallel_consumer_committed_offset{{partition="0",topic="{topic}"}} 25.0' \
        in exposition
    assert "headrace_parallel_consumer_processed_records_total 50.0" in exposition


# Options of the inline-mode tests, whose handlers declare CHEAP_HANDLER_NS per record through a
# DeclaredCostClock (so the policy's decision does not hang on machine noise): a bound per run
# far above a run of them, and a low duty floor.
INLINE_TEST_OPTIONS = dict(single_worker_max_run_us=20_000, inline_min_duty=0.1,
                           parallelism_window_ms=5)


class ThreadLog:
    """Which thread ran the handler on each (phase, partition, offset); phase set by the test."""

    def __init__(self) -> None:
        self.phase = 1
        self.threads: dict[tuple[int, int, int], set[str]] = defaultdict(set)

    def note(self, message) -> None:
        self.threads[(self.phase, message.partition(), message.offset())].add(
            threading.current_thread().name)

    def names(self, phase: int) -> set[str]:
        return set().union(*(names for (p, _, _), names in self.threads.items() if p == phase))


def _wait_for_inline_mode(consumer: ParallelConsumer) -> None:
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while consumer.metrics().active_workers != 0:
        assert time.monotonic() < deadline, consumer.metrics()
        time.sleep(0.01)


def _next_phase(recorder: Recorder, thread_log: ThreadLog, records: int) -> None:
    recorder.all_done.clear()
    recorder.expected += records
    thread_log.phase += 1


def test_cheap_handler_runs_on_the_poll_thread(bootstrap):
    """A no-op-like handler moves from one worker to the poll thread itself (inline mode):
    the records produced after the switch are all handled by "pc-poll", none by a worker, and
    their offsets are committed through the same tracker."""
    topic = create_topic(bootstrap, 3)
    produce_records(bootstrap, topic, 600, 3, keys=50)
    recorder, thread_log, clock = Recorder(600, handler_s=0), ThreadLog(), DeclaredCostClock()

    def handler(message):
        clock.spend(CHEAP_HANDLER_NS, CHEAP_HANDLER_NS)
        thread_log.note(message)
        recorder.end(message)

    group = f"{topic}-inline"
    consumer = ParallelConsumer(consumer_config(bootstrap, group), [topic], handler,
                                ParallelConsumerOptions(workers=16, ordering="key",
                                                        **INLINE_TEST_OPTIONS),
                                handler_clock=clock)
    with consumer:
        assert recorder.all_done.wait(WAIT_TIMEOUT_S)
        _wait_for_inline_mode(consumer)
        _next_phase(recorder, thread_log, 600)
        produce_records(bootstrap, topic, 600, 3, keys=50)
        assert recorder.all_done.wait(WAIT_TIMEOUT_S), f"processed {len(recorder.processed)}"
        assert consumer.metrics().active_workers == 0
    assert consumer.failure is None
    assert thread_log.names(1) <= {"pc-worker-0", "pc-poll"}  # never fanned out
    assert thread_log.names(2) == {"pc-poll"}
    assert set(recorder.processed.values()) == {1}
    assert committed_offsets(bootstrap, group, topic, 3) == {0: 400, 1: 400, 2: 400}


def test_handler_turning_slow_leaves_the_poll_thread_and_fans_out(bootstrap):
    """Inline mode (a handler declaring 1 us of CPU per record), then the handler declares
    10 s of waiting per record: the poll thread runs just the first slow record (its run passes
    max_run_ms and the rest goes back for a worker), then the policy fans the waiting handler
    out to every worker, and eight of them run it at once."""
    topic = create_topic(bootstrap, 2)
    produce_records(bootstrap, topic, 200, 2)
    recorder, thread_log, clock = Recorder(200, handler_s=0), ThreadLog(), DeclaredCostClock()
    gate = InFlightGate(recorder)
    slow = threading.Event()

    def handler(message):
        thread_log.note(message)
        recorder.begin(message)
        if slow.is_set():
            clock.spend(WAITING_HANDLER_WALL_NS, WAITING_HANDLER_CPU_NS)
            if threading.current_thread().name != "pc-poll":
                gate.wait()
        else:
            clock.spend(CHEAP_HANDLER_NS, CHEAP_HANDLER_NS)
        recorder.end(message)

    consumer = ParallelConsumer(consumer_config(bootstrap, f"{topic}-slow"), [topic], handler,
                                ParallelConsumerOptions(workers=8, ordering="unordered"),
                                handler_clock=clock)
    with consumer:
        assert recorder.all_done.wait(WAIT_TIMEOUT_S)
        _wait_for_inline_mode(consumer)
        _next_phase(recorder, thread_log, 200)
        slow.set()
        gate.open_for(8)
        produce_records(bootstrap, topic, 200, 2)
        assert recorder.all_done.wait(WAIT_TIMEOUT_S), f"processed {len(recorder.processed)}"
        active_workers = consumer.metrics().active_workers
    assert consumer.failure is None
    on_poll_thread = [key for key, names in thread_log.threads.items()
                      if key[0] == 2 and "pc-poll" in names]
    assert len(on_poll_thread) == 1
    assert gate.reached.is_set() and recorder.max_in_flight == 8 and active_workers == 8
    assert set(recorder.processed.values()) == {1}


def test_failing_record_inline_is_retried_on_a_worker(bootstrap):
    """A record raising on the poll thread is not retried there (no backoff sleep on the poll
    thread): its run goes to a worker that retries it; attempts are counted once each."""
    topic = create_topic(bootstrap, 2)
    produce_records(bootstrap, topic, 100, 2)
    recorder, thread_log = Recorder(100, handler_s=0), ThreadLog()
    attempt_threads: dict[tuple[int, int], list[str]] = defaultdict(list)
    failing, clock = threading.Event(), DeclaredCostClock()

    def handler(message):
        clock.spend(CHEAP_HANDLER_NS, CHEAP_HANDLER_NS)
        if failing.is_set() and message.offset() % 10 == 7:
            attempts = attempt_threads[(message.partition(), message.offset())]
            attempts.append(threading.current_thread().name)
            if len(attempts) % 3:  # twice per record, then succeeds
                raise RuntimeError("transient")
        thread_log.note(message)
        recorder.end(message)

    group = f"{topic}-retry"
    options = ParallelConsumerOptions(workers=4, ordering="partition", retry_backoff_ms=1,
                                      retry_backoff_max_ms=5, **INLINE_TEST_OPTIONS)
    consumer = ParallelConsumer(consumer_config(bootstrap, group), [topic], handler, options,
                                handler_clock=clock)
    with consumer:
        assert recorder.all_done.wait(WAIT_TIMEOUT_S)
        _wait_for_inline_mode(consumer)
        _next_phase(recorder, thread_log, 100)
        failing.set()
        produce_records(bootstrap, topic, 100, 2)
        assert recorder.all_done.wait(WAIT_TIMEOUT_S), f"processed {len(recorder.processed)}"
        failed_attempts = consumer.metrics().failed_attempts
    assert consumer.failure is None
    assert "pc-poll" in thread_log.names(2)  # inline mode ran some of them
    first_attempt_inline = [t for t in attempt_threads.values() if t[0] == "pc-poll"]
    assert first_attempt_inline
    assert all(len(threads) == 3 and "pc-poll" not in threads[1:]
               for threads in first_attempt_inline)
    assert failed_attempts == 2 * len(attempt_threads) == 20
    assert set(recorder.processed.values()) == {1}
    assert committed_offsets(bootstrap, group, topic, 2) == {0: 100, 1: 100}


def test_rebalance_while_inline_commits_what_the_poll_thread_did(bootstrap):
    """A second member joins while the first runs its records on the poll thread: the
    revocation (inside consume(), so after the inline runs) commits them, and the new owners
    neither skip nor repeat any record."""
    topic = create_topic(bootstrap, 4)
    produce_records(bootstrap, topic, 800, 4, keys=40)
    recorder = Recorder(800, handler_s=0)
    members_by_record: dict[tuple[int, int], set[str]] = defaultdict(set)
    clock = DeclaredCostClock()

    def handler_of(member: str):
        def handler(message):
            clock.spend(CHEAP_HANDLER_NS, CHEAP_HANDLER_NS)
            members_by_record[(message.partition(), message.offset())].add(
                f"{member}/{threading.current_thread().name}")
            recorder.end(message)
        return handler

    group = f"{topic}-rebalance"
    options = ParallelConsumerOptions(workers=4, ordering="key", **INLINE_TEST_OPTIONS)
    first = ParallelConsumer(consumer_config(bootstrap, group), [topic], handler_of("first"),
                             options, handler_clock=clock)
    second = ParallelConsumer(consumer_config(bootstrap, group), [topic], handler_of("second"),
                              options, handler_clock=clock)
    with first:
        assert recorder.all_done.wait(WAIT_TIMEOUT_S)
        _wait_for_inline_mode(first)
        recorder.all_done.clear()
        recorder.expected += 800
        with second:
            deadline = time.monotonic() + WAIT_TIMEOUT_S
            while len(first.metrics().partitions) != 2 or len(second.metrics().partitions) != 2:
                assert time.monotonic() < deadline, (first.metrics(), second.metrics())
                time.sleep(0.01)
            assert first.metrics().active_workers == 0  # the revocation happened inline
            produce_records(bootstrap, topic, 800, 4, keys=40)
            assert recorder.all_done.wait(WAIT_TIMEOUT_S), f"processed {len(recorder.processed)}"
    assert first.failure is None and second.failure is None
    members = set().union(*members_by_record.values())
    assert "first/pc-poll" in members and any(m.startswith("second/") for m in members)
    assert set(recorder.processed.values()) == {1}
    assert committed_offsets(bootstrap, group, topic, 4) == {p: 400 for p in range(4)}


def test_waiting_handler_fans_out_to_every_worker(bootstrap):
    """A handler measured at 10 s of wall time and 10 ms of CPU per record (declared through
    the injected handler clock, not timed) is sized to every worker; then all eight of them
    run a handler at once (eight handlers meet in the gate)."""
    topic = create_topic(bootstrap, 2)
    produce_records(bootstrap, topic, 400, 2)
    recorder, clock = Recorder(800, handler_s=0), DeclaredCostClock()
    gate = InFlightGate(recorder)

    def handler(message):
        recorder.begin(message)
        clock.spend(WAITING_HANDLER_WALL_NS, WAITING_HANDLER_CPU_NS)
        gate.wait()
        recorder.end(message)

    consumer = ParallelConsumer(consumer_config(bootstrap, f"{topic}-waiting"), [topic], handler,
                                ParallelConsumerOptions(workers=8, ordering="unordered"),
                                handler_clock=clock)
    with consumer:
        _wait_for_active_workers(consumer, 8)
        gate.open_for(8)
        produce_records(bootstrap, topic, 400, 2)
        assert recorder.all_done.wait(WAIT_TIMEOUT_S), f"processed {len(recorder.processed)}"
        assert consumer.metrics().active_workers == 8
    assert consumer.failure is None
    assert gate.reached.is_set() and recorder.max_in_flight == 8


def test_handler_blocking_every_active_worker_does_not_stall_the_rest(bootstrap):
    """The first record blocks until all others are done: the one active worker is stuck with
    nothing completing, so the consumer must activate more workers to process the rest."""
    topic = create_topic(bootstrap, 1)
    produce_records(bootstrap, topic, 50, 1)
    recorder = Recorder(50, handler_s=0)
    others_done = threading.Event()

    def handler(message):
        if message.offset() == 0:
            assert others_done.wait(WAIT_TIMEOUT_S)
        recorder(message)
        if len(recorder.processed) == 49:
            others_done.set()

    options = ParallelConsumerOptions(workers=4, ordering="unordered", max_run_records=1)
    consumer = _run(bootstrap, topic, handler, options, recorder)
    assert consumer.metrics().active_workers > 1
