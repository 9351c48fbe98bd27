"""The log cleaner running inside the broker: cleaner threads, I/O throttling, status files.

Owns ``CleanerService`` (Kafka's ``LogCleaner``) and ``Throttler``. With
``log.cleaner.enable=true`` (Kafka's default) it starts ``log.cleaner.threads`` threads; each
owns a ``Cleaner`` with an offset map of ``log.cleaner.dedupe.buffer.size / threads`` bytes
filled to ``log.cleaner.io.buffer.load.factor``, reading ``log.cleaner.io.buffer.size /
threads / 2`` bytes per chunk. A thread repeatedly asks the shared ``CleanerManager`` to clean
the filthiest compacted partition of every log of the ``LogManager`` (``__consumer_offsets``
included) and waits ``log.cleaner.backoff.ms`` when none is eligible. All threads share one
``Throttler`` holding the bytes read by the cleaner to ``log.cleaner.io.max.bytes.per.second``.
``log.cleaner.backoff.ms`` and ``log.cleaner.io.max.bytes.per.second`` changed through
AlterConfigs apply at once; the other ``log.cleaner.*`` settings at the next start.

Concurrency with the rest of the broker: the cleaner only rewrites closed segments; appends,
rolls (also those forced by ``max.compaction.lag.ms``, which happen on the append thread, see
``Log``), retention, DeleteRecords and fetches go on while it runs (see ``Log`` for the
cleaning guard and the swap under the log's lock). Deleting a topic or closing a log waits for
a cleaning of it to stop. ``stop`` makes every cleaning abort before its next chunk (the
crash-safe state: no ``.cleaned`` file survives, swapped groups are complete) and joins the
threads; the broker calls it before ``LogManager.shutdown``.

Status file, ``<log.dir>/cleaner-status.json`` (one per data directory, written atomically:
temp file, fsync, rename, directory fsync) at start, after every cleaning and whenever the
partitions' cleaning state changed (checked every backoff)::

    {"version": 1, "written_ms": int, "log_dir": str, "cleaner_enabled": bool, "threads": int,
     "metrics": {"max-buffer-utilization-percent": float, "max-clean-time-secs": float,
                 "max-dirty-percent": float, "time-since-last-run-ms": int,
                 "uncleanable-partitions-count": int},
     "partitions": [{"topic": str, "partition": int, "dirty_ratio": float,
                     "first_dirty_offset": int, "cleanable_bytes": int,
                     "log_start_offset": int, "log_end_offset": int, "size_bytes": int,
                     "in_progress": bool, "uncleanable": bool,
                     "uncleanable_reason": str | null,
                     "last_cleaning": null | {"time_ms", "first_dirty_offset", "end_offset",
                         "elapsed_secs", "passes", "bytes_read", "bytes_written",
                         "messages_read", "messages_written", "start_size_bytes",
                         "end_size_bytes", "buffer_utilization_percent"}}]}

The last cleaning of each partition is read back from the file at start, so it survives
restarts.

Thread-safety: ``start``/``stop`` are called by the broker (``stop`` blocks: run it off the
event loop); the cleaner threads share the manager (thread-safe), the throttler (locked) and
the status writer (locked). ``metrics()`` may be called from any thread.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

from headrace.broker.config import BrokerConfig
from headrace.errors import UnknownTopicOrPartition
from headrace.storage.cleaner import Cleaner
from headrace.storage.cleaner_manager import CleanerManager, CleaningRecord, Logs
from headrace.storage.clock import Clock
from headrace.storage.fs import FileSystem, RealFileSystem, write_file_atomically
from headrace.storage.log import CleaningAborted, Log
from headrace.storage.manager import LogManager
from headrace.storage.offset_map import OffsetMap

log = logging.getLogger(__name__)

STATUS_FILE = "cleaner-status.json"
STATUS_VERSION = 1
THROTTLE_CHECK_INTERVAL_MS = 300  # Kafka's LogCleaner throttler checkIntervalMs
MIN_IO_CHUNK_BYTES = 64 * 1024


class Throttler:
    """Kafka's ``Throttler``: keeps the observed byte rate at or below the desired rate by
    sleeping, measured over ``THROTTLE_CHECK_INTERVAL_MS`` periods. ``sleep(seconds)`` returns
    early when the service stops."""

    def __init__(self, desired_bytes_per_second: float, clock: Clock, sleep) -> None:
        self.desired_bytes_per_second = desired_bytes_per_second
        self._clock = clock
        self._sleep = sleep
        self._lock = threading.Lock()
        self._period_start_ms = clock.monotonic_ms()
        self._observed_bytes = 0

    def maybe_throttle(self, observed_bytes: int) -> None:
        with self._lock:
            self._observed_bytes += observed_bytes
            now_ms = self._clock.monotonic_ms()
            elapsed_ms = now_ms - self._period_start_ms
            if elapsed_ms < THROTTLE_CHECK_INTERVAL_MS or self._observed_bytes <= 0:
                return
            wanted_ms = 1000.0 * self._observed_bytes / self.desired_bytes_per_second
            if wanted_ms > elapsed_ms:
                self._sleep((wanted_ms - elapsed_ms) / 1000)
            self._period_start_ms = self._clock.monotonic_ms()
            self._observed_bytes = 0


class CleanerService:
    """Kafka's ``LogCleaner``: background cleaner threads over every log of the broker."""

    def __init__(self, config: BrokerConfig, log_manager: LogManager, clock: Clock,
                 fs: FileSystem | None = None) -> None:
        self.config = config
        self.log_manager = log_manager
        self.clock = clock
        self.fs = fs or RealFileSystem()
        self.enabled = config.get_bool("log.cleaner.enable")
        self.threads_count = max(1, config.get_int("log.cleaner.threads"))
        self.backoff_ms = config.get_int("log.cleaner.backoff.ms")
        self.manager = CleanerManager(self.fs, clock)
        self._stopping = threading.Event()
        self.throttler = Throttler(float(config.get("log.cleaner.io.max.bytes.per.second")),
                                   clock, self._stopping.wait)
        self._threads: list[threading.Thread] = []
        self._status_lock = threading.Lock()
        self._last_status: dict[Path, Any] = {}

    # ---- lifecycle -----------------------------------------------------------------------

    def start(self) -> None:
        """Read back the last cleanings, write the status files, start the threads."""
        self._restore_last_cleanings()
        self.write_status(force=True)
        if not self.enabled:
            log.info("log cleaner disabled (log.cleaner.enable=false)")
            return
        self.config.add_change_listener(self._on_config_change)
        for number in range(self.threads_count):
            thread = threading.Thread(target=self._run, args=(self._new_cleaner(),),
                                      name=f"kafka-log-cleaner-thread-{number}", daemon=True)
            self._threads.append(thread)
            thread.start()
        log.info("log cleaner started: %d thread(s), %d-byte offset map each",
                 self.threads_count, self._dedupe_buffer_bytes)

    def stop(self) -> None:
        """Abort cleanings in progress (at their next chunk) and join the threads. Blocks."""
        self._stopping.set()
        for thread in self._threads:
            thread.join()
        self._threads = []

    @property
    def _dedupe_buffer_bytes(self) -> int:
        return self.config.get_int("log.cleaner.dedupe.buffer.size") // self.threads_count

    def _new_cleaner(self) -> Cleaner:
        load_factor = float(self.config.get("log.cleaner.io.buffer.load.factor"))
        io_chunk_bytes = max(MIN_IO_CHUNK_BYTES, self.config.get_int(
            "log.cleaner.io.buffer.size") // self.threads_count // 2)
        return Cleaner(OffsetMap(self._dedupe_buffer_bytes, load_factor), io_chunk_bytes,
                       on_chunk=self._between_chunks)

    def _on_config_change(self, properties: dict[str, str]) -> None:
        self.backoff_ms = int(properties["log.cleaner.backoff.ms"])
        self.throttler.desired_bytes_per_second = float(
            properties["log.cleaner.io.max.bytes.per.second"])

    # ---- the cleaner threads -------------------------------------------------------------

    def _between_chunks(self, cleaned_log: Log, bytes_read: int) -> None:
        """Before each chunk a cleaner reads: abort if stopping or the log went away,
        then throttle."""
        if self._stopping.is_set():
            raise CleaningAborted("the log cleaner is shutting down")
        cleaned_log.check_cleaning_aborted()
        self.throttler.maybe_throttle(bytes_read)

    def _run(self, cleaner: Cleaner) -> None:
        while not self._stopping.is_set():
            try:
                stats = self.manager.clean_filthiest(self.logs(), cleaner)
                self.write_status(force=stats is not None)
            except Exception:  # keep cleaning the other partitions, as Kafka's thread does
                log.exception("log cleaner thread iteration failed")
                stats = None
            if stats is None:
                self._stopping.wait(self.backoff_ms / 1000)

    def logs(self) -> Logs:
        """Every live log of the broker: ``{(topic, partition): (log_dir, Log)}``."""
        logs = {}
        for name, info in self.log_manager.topics().items():
            for partition in range(info.partitions):
                try:
                    partition_log = self.log_manager.get_log(name, partition)
                except UnknownTopicOrPartition:  # deleted meanwhile
                    continue
                logs[(name, partition)] = (partition_log.dir.parent, partition_log)
        return logs

    # ---- status --------------------------------------------------------------------------

    def metrics(self) -> dict[str, object]:
        """Kafka's cleaner metric names and values (dirty ratios per partition included)."""
        return self.manager.metrics()

    def write_status(self, force: bool = False) -> None:
        """Write each log dir's status file if its partitions' state changed (or ``force``)."""
        with self._status_lock:
            now_ms = self.clock.now_ms()
            by_dir = self.manager.status(self.logs(), now_ms)
            metrics = {k: v for k, v in self.manager.metrics().items() if k != "dirty-ratio"}
            for log_dir in self.log_manager.log_dirs:
                partitions = by_dir.get(log_dir, [])
                if not force and self._last_status.get(log_dir) == partitions:
                    continue
                document = {
                    "version": STATUS_VERSION, "written_ms": now_ms, "log_dir": str(log_dir),
                    "cleaner_enabled": self.enabled, "threads": self.threads_count,
                    "metrics": metrics, "partitions": partitions,
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
