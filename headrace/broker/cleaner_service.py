"""The log cleaner running inside the broker: cleaner threads, I/O throttling, status files.

Owns ``CleanerService`` (Kafka's ``LogCleaner``), ``CleanerSettings`` and ``Throttler``. With
``log.cleaner.enable=true`` (Kafka's default) it starts ``log.cleaner.threads`` threads; each
owns a ``Cleaner`` with an offset map of ``log.cleaner.dedupe.buffer.size / threads`` bytes
(at most 2**31 - 1, as Kafka caps it) filled to ``log.cleaner.io.buffer.load.factor``, reading
``log.cleaner.io.buffer.size / threads / 2`` bytes (at least 64 KiB) per chunk and a span
of chunks per kernel call (``span_bytes_for`` the I/O limit: 32 MiB unthrottled, what the
limit allows in 100 ms otherwise; a live limit change applies from the next span). A thread
allocates its map itself, repeatedly asks the shared ``CleanerManager`` to clean the filthiest
compacted partition of every log of the ``LogManager`` (``__consumer_offsets`` included) and
waits ``log.cleaner.backoff.ms`` when none is eligible. All threads share one ``Throttler``
holding the bytes read by the cleaner to ``log.cleaner.io.max.bytes.per.second``. The
cleaning's CPU work -- its spans, which run without the GIL -- runs ``CLEANER_SPAN_NICENESS``
nicer than the broker (on a helper thread per span: Linux nice values are per thread), so a
full-speed cleaning yields the CPU to the event loop and the append thread; the cleaner
thread itself keeps the broker's priority, because it takes the GIL between spans, and a
low-priority thread preempted while holding the GIL would stall every other thread. Such a
span is also cooperative: while the broker receives requests (the connections note each
with ``scheduling.note_broker_request``) it pauses 50 us after every 250 us of CPU, so a thread
woken on its CPU runs at once instead of after a scheduler tick (a broker busy all along
cleans about a third slower but never stops; an idle broker's cleaning never pauses).

Live reconfiguration (Kafka's ``LogCleaner.reconfigure``; the broker config validates first,
see ``headrace.broker.config``): ``log.cleaner.backoff.ms`` and
``log.cleaner.io.max.bytes.per.second`` changed through AlterConfigs apply at once. A change of
the threads, dedupe buffer, I/O buffer or load factor restarts the cleaner threads: the
current ones stop at their next span (a cleaning in progress is aborted exactly as at
shutdown and retried by the new threads from the same checkpoint), are joined -- their maps
freed -- and the new number of threads starts with the new buffers. The restart runs on its
own short-lived thread, so the config change never waits for a span;
several changes in a row coalesce into the latest settings. A thread that died (its map could
not be allocated, or an error escaped its loop) counts in ``DeadThreadCount`` until the next
restart replaces it.

Concurrency with the rest of the broker: the cleaner only rewrites closed segments; appends,
rolls (also those forced by ``max.compaction.lag.ms``, which happen on the append thread, see
``Log``), retention, DeleteRecords and fetches go on while it runs (see ``Log`` for the
cleaning guard and the swap under the log's lock). Deleting a topic or closing a log waits for
a cleaning of it to stop. ``stop`` makes every cleaning abort before its next span (the
crash-safe state: no ``.cleaned`` file survives, swapped groups are complete) and joins the
threads; the broker calls it before ``LogManager.shutdown``.

Status file, ``<log.dir>/cleaner-status.json`` (one per data directory, written atomically:
temp file, fsync, rename, directory fsync) at start, when a cleaning starts, after every
cleaning, after a restart of the threads and whenever the partitions' cleaning state changed
(checked every backoff)::

    {"version": 1, "written_ms": int, "log_dir": str, "cleaner_enabled": bool, "threads": int,
     "threads_alive": int, "offset_map_bytes": int, "io_chunk_bytes": int,
     "load_factor": float,
     "metrics": {"max-buffer-utilization-percent": float, "cleaner-recopy-percent": float,
                 "max-clean-time-secs": float, "max-compaction-delay-secs": float,
                 "DeadThreadCount": int, "max-dirty-percent": float,
                 "time-since-last-run-ms": int,
                 "uncleanable-partitions-count": int, "uncleanable-bytes": int},
     "partitions": [{"topic": str, "partition": int, "dirty_ratio": float,
                     "first_dirty_offset": int, "cleanable_bytes": int,
                     "log_start_offset": int, "log_end_offset": int, "size_bytes": int,
                     "in_progress": bool, "uncleanable": bool,
                     "uncleanable_reason": str | null,
                     "last_cleaning": null | {"time_ms", "first_dirty_offset", "end_offset",
                         "elapsed_secs", "passes", "bytes_read", "bytes_written",
                         "messages_read", "messages_written", "start_size_bytes",
                         "end_size_bytes", "buffer_utilization_percent"}}]}

``threads``, ``offset_map_bytes`` (per thread), ``io_chunk_bytes`` and ``load_factor`` are
the settings the running threads use; ``uncleanable-partitions-count`` and
``uncleanable-bytes`` are that log dir's (Kafka tags them with ``logDirectory``), the other
metrics the broker's. The last cleaning of each partition is read back from the file at
start, so it survives restarts.

Thread-safety: ``start``/``stop`` are called by the broker (``stop`` blocks: run it off the
event loop); restarts and ``stop`` are serialised by a lock; the cleaner threads share the
manager (thread-safe), the throttler (locked) and the status writer (locked). ``metrics()``
may be called from any thread.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headrace.broker.config import BrokerConfig
from headrace.broker.os_threads import name_this_thread
from headrace.errors import KafkaStorageError, UnknownTopicOrPartition
from headrace.storage.cleaner import Cleaner, span_bytes_for
from headrace.storage.cleaner_manager import CleanerManager, CleaningRecord, Logs
from headrace.storage.clock import Clock
from headrace.storage.fs import FileSystem, RealFileSystem, write_file_atomically
from headrace.storage.log import CleaningAborted, Log
from headrace.storage.manager import LogManager
from headrace.storage.offset_map import OffsetMap

log = logging.getLogger(__name__)

STATUS_FILE = "cleaner-status.json"
STATUS_VERSION = 1
# The cleaner's spans run this much nicer than the broker's other threads: cleaning is
# background work, and "cleaning must not stall the broker" (produce p99 during a cleaning
# within 2x idle) on a machine with few cores. Kafka has no such setting (the JVM cannot
# set per-thread priorities); log.cleaner.io.max.bytes.per.second still caps the rate.
CLEANER_SPAN_NICENESS = 10
THROTTLE_CHECK_INTERVAL_MS = 300  # Kafka's LogCleaner throttler checkIntervalMs
THROTTLE_SLEEP_SLICE_MS = 100  # how often a throttling sleep rechecks the rate and aborts
MIN_IO_CHUNK_BYTES = 64 * 1024
MAX_OFFSET_MAP_BYTES = 2**31 - 1  # Kafka's per-thread cap (Int.MaxValue)


class Throttler:
    """Kafka's ``Throttler``: keeps the observed byte rate at or below the desired rate by
    sleeping, measured over ``THROTTLE_CHECK_INTERVAL_MS`` periods. ``sleep(seconds)`` returns
    early when the service stops. Unlike Kafka's, a period also ends as soon as it has seen
    the bytes the rate allows in a whole period, so no burst exceeds one period's worth
    (Kafka's throttler lets any amount through until ``checkIntervalMs`` has passed, so a
    small cleaning is never throttled at all). A throttling sleep is taken in slices of
    ``THROTTLE_SLEEP_SLICE_MS`` and ends early when the desired rate changes or the caller's
    ``interrupted()`` turns true (the cleaned log was deleted or closed), so neither a rate
    change nor a topic deletion waits for a long sleep at a low rate."""

    def __init__(self, desired_bytes_per_second: float, clock: Clock, sleep) -> None:
        self.desired_bytes_per_second = desired_bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start_ms = clock.monotonic_ms()
        self._observed_bytes = 0

    def maybe_throttle(self, observed_bytes: int,
                       interrupted: Callable[[], bool] = lambda: False) -> None:
        with self._lock:
            self._observed_bytes += observed_bytes
            now_ms = self._clock.monotonic_ms()
            elapsed_ms = now_ms - self._period_start_ms
            rate = self.desired_bytes_per_second
            period_bytes = rate * THROTTLE_CHECK_INTERVAL_MS / 1000
            if self._observed_bytes <= 0 or (elapsed_ms < THROTTLE_CHECK_INTERVAL_MS
                                             and self._observed_bytes < period_bytes):
                return
            wanted_ms = 1000.0 * self._observed_bytes / rate
            if wanted_ms > elapsed_ms:
                self._sleep_until(now_ms + wanted_ms - elapsed_ms, rate, interrupted)
            self._period_start_ms = self._clock.monotonic_ms()
            self._observed_bytes = 0

    def _sleep_until(self, deadline_ms: float, rate: float,
                     interrupted: Callable[[], bool]) -> None:
        while self.desired_bytes_per_second == rate and not interrupted():
            remaining_ms = deadline_ms - self._clock.monotonic_ms()
            if remaining_ms <= 0:
                return
            self._sleep(min(remaining_ms, THROTTLE_SLEEP_SLICE_MS) / 1000)


@dataclass(frozen=True, slots=True)
class CleanerSettings:
    """The settings a set of cleaner threads is started with (a change restarts them)."""

    threads: int
    dedupe_buffer_bytes: int  # log.cleaner.dedupe.buffer.size, all threads together
    io_buffer_bytes: int  # log.cleaner.io.buffer.size, all threads together
    load_factor: float

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> CleanerSettings:
        """From the broker's effective properties (validated by ``BrokerConfig``)."""
        return cls(max(1, int(properties["log.cleaner.threads"])),
                   int(properties["log.cleaner.dedupe.buffer.size"]),
                   int(properties["log.cleaner.io.buffer.size"]),
                   float(properties["log.cleaner.io.buffer.load.factor"]))

    @property
    def offset_map_bytes(self) -> int:
        """Each thread's dedupe buffer (Kafka caps it at Int.MaxValue)."""
        return min(self.dedupe_buffer_bytes // self.threads, MAX_OFFSET_MAP_BYTES)

    @property
    def io_chunk_bytes(self) -> int:
        """Each thread's read size: its half of its share of the I/O buffers."""
        return max(MIN_IO_CHUNK_BYTES, self.io_buffer_bytes // self.threads // 2)


class CleanerService:
    """Kafka's ``LogCleaner``: background cleaner threads over every log of the broker."""

    def __init__(self, config: BrokerConfig, log_manager: LogManager, clock: Clock,
                 fs: FileSystem | None = None) -> None:
        self.config = config
        self.log_manager = log_manager
        self.clock = clock
        self.fs = fs or RealFileSystem()
        self.enabled = config.get_bool("log.cleaner.enable")
        self.settings = CleanerSettings.from_properties(config.properties())
        self.backoff_ms = config.get_int("log.cleaner.backoff.ms")
        self.manager = CleanerManager(self.fs, clock)
        self._stopping = threading.Event()
        self._generation_stop = threading.Event()  # set to stop the current threads
        self.throttler = Throttler(float(config.get("log.cleaner.io.max.bytes.per.second")),
                                   clock, self._sleep_unless_stopped)
        self._threads: list[threading.Thread] = []
        self._lifecycle_lock = threading.Lock()  # start, restart, stop
        self._restarts: list[threading.Thread] = []
        self._restarts_lock = threading.Lock()  # never held while waiting for a thread
        self._status_lock = threading.Lock()
        self._last_status: dict[Path, Any] = {}

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Read back the last cleanings, start the threads, write the status files."""
        self._restore_last_cleanings()
        if self.enabled:
            self.config.add_change_listener(self._on_config_change)
            with self._lifecycle_lock:
                self._start_threads()
        else:
            log.info("log cleaner disabled (log.cleaner.enable=false)")
        self.write_status(force=True)

    def stop(self) -> None:
        """Abort cleanings in progress (at their next span) and join the threads. Blocks."""
        self._stopping.set()
        with self._lifecycle_lock:
            self._stop_threads()
        with self._restarts_lock:
            restarts, self._restarts = self._restarts, []
        for restart in restarts:
            restart.join()

    def _start_threads(self) -> None:
        """Start ``settings.threads`` threads with a fresh stop event (lifecycle lock held)."""
        self._generation_stop = stop = threading.Event()
        self._threads = []
        for number in range(self.settings.threads):
            thread = threading.Thread(target=self._run, args=(self.settings, stop),
                                      name=f"kafka-log-cleaner-thread-{number}", daemon=True)
            self._threads.append(thread)
            thread.start()
        log.info("log cleaner started: %d thread(s), %d-byte offset map each, %d-byte reads",
                 self.settings.threads, self.settings.offset_map_bytes,
                 self.settings.io_chunk_bytes)

    def _stop_threads(self) -> None:
        """Stop the current threads at their next span and join them (lifecycle lock held)."""
        self._generation_stop.set()
        for thread in self._threads:
            thread.join()
        self._threads = []

    def _on_config_change(self, properties: dict[str, str]) -> None:
        """Kafka's ``reconfigure``: backoff and I/O rate at once; new thread or buffer
        settings restart the threads (on a restart thread: this runs on the thread applying the
        config change, which must not wait for a span)."""
        self.backoff_ms = int(properties["log.cleaner.backoff.ms"])
        self.throttler.desired_bytes_per_second = float(
            properties["log.cleaner.io.max.bytes.per.second"])
        if CleanerSettings.from_properties(properties) == self.settings:
            return
        restart = threading.Thread(target=self._restart, name="kafka-log-cleaner-reconfigure",
                                   daemon=True)
        with self._restarts_lock:
            if self._stopping.is_set():
                return
            self._restarts = [t for t in self._restarts if t.is_alive()] + [restart]
            restart.start()

    def _restart(self) -> None:
        """Stop the threads, then start them with the latest settings, unless shutting down
        or nothing changed any more (an earlier restart already applied them)."""
        with self._lifecycle_lock:
            settings = CleanerSettings.from_properties(self.config.properties())
            if self._stopping.is_set() or settings == self.settings:
                return
            log.info("log cleaner reconfiguring: %s -> %s", self.settings, settings)
            self._stop_threads()
            self.manager.retain_cleaners([])
            self.settings = settings
            self._start_threads()
        self.write_status(force=True)

    # ---- the cleaner threads -------------------------------------------------------------

    def _sleep_unless_stopped(self, seconds: float) -> None:
        """The throttler's sleep: cut short when the current threads are told to stop."""
        self._generation_stop.wait(seconds)

    def _between_spans(self, stop: threading.Event, cleaner: Cleaner, cleaned_log: Log,
                       bytes_read: int) -> None:
        """After each span a cleaner reads: abort if its threads are stopping or the log
        went away, throttle, and size the next span for the current I/O limit."""
        self._check_not_stopped(stop, cleaned_log)
        self.throttler.maybe_throttle(
            bytes_read, lambda: stop.is_set() or _cleaning_stopped(cleaned_log))
        self._check_not_stopped(stop, cleaned_log)
        cleaner.span_bytes = span_bytes_for(self.throttler.desired_bytes_per_second,
                                            cleaner.io_chunk_bytes)

    def _check_not_stopped(self, stop: threading.Event, cleaned_log: Log) -> None:
        if stop.is_set():
            reason = "shutting down" if self._stopping.is_set() else \
                "restarting with new settings"
            raise CleaningAborted(f"the log cleaner is {reason}")
        cleaned_log.check_cleaning_aborted()

    def _new_cleaner(self, settings: CleanerSettings, stop: threading.Event) -> Cleaner:
        offset_map = OffsetMap(settings.offset_map_bytes, settings.load_factor)
        cleaner = Cleaner(offset_map, settings.io_chunk_bytes, span_bytes=span_bytes_for(
            self.throttler.desired_bytes_per_second, settings.io_chunk_bytes),
            span_niceness=CLEANER_SPAN_NICENESS)
        cleaner.on_chunk = functools.partial(self._between_spans, stop, cleaner)
        return cleaner

    def _run(self, settings: CleanerSettings, stop: threading.Event) -> None:
        name_this_thread("hr-cleaner")
        try:
            cleaner = self._new_cleaner(settings, stop)
        except (MemoryError, ValueError):
            log.exception("log cleaner thread could not allocate its buffers; it stops")
            return
        self._clean_until(stop, cleaner)

    def _clean_until(self, stop: threading.Event, cleaner: Cleaner) -> None:
        def started(_key) -> None:
            self.write_status()

        while not stop.is_set():
            try:
                stats = self.manager.clean_filthiest(self.logs(), cleaner, on_start=started)
                self.write_status(force=stats is not None)
            except Exception:  # keep cleaning the other partitions, as Kafka's thread does
                log.exception("log cleaner thread iteration failed")
                stats = None
            if stats is None:
                stop.wait(self.backoff_ms / 1000)

    @property
    def dead_thread_count(self) -> int:
        """Kafka's DeadThreadCount: current threads that ended without being told to stop."""
        if self._generation_stop.is_set():
            return 0
        return sum(1 for thread in self._threads if not thread.is_alive())

    def logs(self) -> Logs:
        """Every live log of the broker: ``{(topic, partition): (log_dir, Log)}``."""
        logs = {}
        for name, info in self.log_manager.topics().items():
            for partition in range(info.partitions):
                try:
                    partition_log = self.log_manager.get_log(name, partition)
                except (UnknownTopicOrPartition, KafkaStorageError):  # deleted meanwhile, or offline
                    continue
                logs[(name, partition)] = (partition_log.dir.parent, partition_log)
        return logs

    # ---- status --------------------------------------------------------------------------

    def metrics(self) -> dict[str, object]:
        """Kafka's cleaner metric names and values (dirty ratios per partition included)."""
        return {**self.manager.metrics(), "DeadThreadCount": self.dead_thread_count}

    def write_status(self, force: bool = False) -> None:
        """Write each log dir's status file if its partitions' state changed (or ``force``)."""
        with self._status_lock:
            now_ms = self.clock.now_ms()
            logs = self.logs()
            by_dir = self.manager.status(logs, now_ms)
            dir_metrics = self.manager.log_dir_metrics(logs, now_ms)
            metrics = {k: v for k, v in self.metrics().items() if k != "dirty-ratio"}
            settings = self.settings
            for log_dir in self.log_manager.log_dirs:
                partitions = by_dir.get(log_dir, [])
                if not force and self._last_status.get(log_dir) == partitions:
                    continue
                document = {
                    "version": STATUS_VERSION, "written_ms": now_ms, "log_dir": str(log_dir),
                    "cleaner_enabled": self.enabled, "threads": settings.threads,
                    "threads_alive": sum(1 for t in self._threads if t.is_alive()),
                    "offset_map_bytes": settings.offset_map_bytes,
                    "io_chunk_bytes": settings.io_chunk_bytes,
                    "load_factor": settings.load_factor,
                    "metrics": {**metrics, **dir_metrics.get(log_dir, {
                        "uncleanable-partitions-count": 0, "uncleanable-bytes": 0})},
                    "partitions": partitions,
                }
                write_file_atomically(self.fs, log_dir / STATUS_FILE,
                                      (json.dumps(document, indent=1) + "\n").encode())
                self._last_status[log_dir] = partitions

    def _restore_last_cleanings(self) -> None:
        records = {}
        for log_dir in self.log_manager.log_dirs:
            path = log_dir / STATUS_FILE
            try:
                document = json.loads(path.read_text())
                for entry in document["partitions"]:
                    if entry.get("last_cleaning"):
                        key = (entry["topic"], int(entry["partition"]))
                        records[key] = CleaningRecord(**entry["last_cleaning"])
            except FileNotFoundError:
                continue
            except (OSError, ValueError, KeyError, TypeError) as error:
                log.warning("ignoring unreadable %s: %s", path, error)
        self.manager.restore_last_cleanings(records)


def _cleaning_stopped(cleaned_log: Log) -> bool:
    """Whether ``stop_cleaning`` was called on the log (deleted or closed)."""
    try:
        cleaned_log.check_cleaning_aborted()
    except CleaningAborted:
        return True
    return False
