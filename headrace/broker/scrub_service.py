"""The broker's background scrub: one thread (``hr-scrub``) CRC-verifying sealed segments.

Owns ``ScrubService``. With ``log.scrub.enable=true`` (the default) a thread starts a pass over
the sealed segments of every served partition every ``log.scrub.interval.ms`` (a pass longer
than that is followed at once by the next), reading at most
``log.scrub.io.max.bytes.per.second`` through its own ``Throttler`` (the cleaner's). Kafka has
no scrub (it checks CRCs only at recovery), so these configs are headrace's, named in Kafka's
style. Defaults: 4 MiB/s -- a few percent of one disk's sequential bandwidth and well under
one core's CRC-32C rate, so a scrub never competes with produce and fetch, yet it covers
about 340 GB a day; a pass starts once a day (``86400000`` ms).

A damaged segment (``headrace.storage.scrub``) takes its partition offline through
``LogManager.take_offline``: one ERROR naming the file and byte, then KAFKA_STORAGE_ERROR
(NOT_LEADER_OR_FOLLOWER for old request versions) until ``headrace repair`` and a restart.
Every complete pass is logged at INFO with the partitions and bytes verified, and
``status()`` gives the last pass time per partition.

Thread-safety: ``start``/``stop`` are called by the broker (``stop`` blocks until the thread
has finished its current chunk: run it off the event loop). The thread never runs on the
event loop or the append thread and never holds a log's lock while reading.
"""

from __future__ import annotations

import logging
import threading

from headrace.broker.cleaner_service import Throttler
from headrace.broker.config import BrokerConfig
from headrace.broker.os_threads import name_this_thread
from headrace.errors import KafkaStorageError, UnknownTopicOrPartition
from headrace.storage.clock import Clock
from headrace.storage.log import Log
from headrace.storage.manager import LogManager
from headrace.storage.scrub import PartitionScrub, Scrubber, SegmentDamage

log = logging.getLogger(__name__)

SCRUB_THREAD_NAME = "hr-scrub"


class ScrubService:
    """Runs ``Scrubber`` passes on the ``hr-scrub`` thread."""

    def __init__(self, config: BrokerConfig, log_manager: LogManager, clock: Clock) -> None:
        self.enabled = config.get_bool("log.scrub.enable")
        self.interval_ms = config.get_int("log.scrub.interval.ms")
        self.log_manager = log_manager
        self._clock = clock
        self._stopping = threading.Event()
        self.throttler = Throttler(float(config.get("log.scrub.io.max.bytes.per.second")),
                                   clock, self._stopping.wait)
        self.scrubber = Scrubber(log_manager.fs, clock, self._throttle, self._take_offline,
                                 self._stopping.is_set)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if not self.enabled:
            return
        self._thread = threading.Thread(target=self._run, name=SCRUB_THREAD_NAME, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        if self._thread is not None:
            self._thread.join()

    def status(self) -> dict[tuple[str, int], PartitionScrub]:
        return self.scrubber.status

    def _throttle(self, bytes_read: int) -> None:
        self.throttler.maybe_throttle(bytes_read, self._stopping.is_set)

    def _run(self) -> None:
        name_this_thread(SCRUB_THREAD_NAME)
        while not self._stopping.is_set():
            started_ms = self._clock.monotonic_ms()
            try:
                logs = self._served_logs()
                damaged = self.scrubber.scrub_pass(logs)
            except Exception:  # a scrub must never take the broker down
                log.exception("log scrub pass failed; retrying at the next interval")
            else:
                if not self._stopping.is_set():
                    log.info("log scrub pass completed: %d partitions verified, %d damaged",
                             len(logs), damaged)
            elapsed_ms = self._clock.monotonic_ms() - started_ms
            self._stopping.wait(max(0, self.interval_ms - elapsed_ms) / 1000)

    def _served_logs(self) -> list[Log]:
        logs = []
        for name, info in self.log_manager.topics().items():
            for partition in range(info.partitions):
                try:
                    logs.append(self.log_manager.get_log(name, partition))
                except (KafkaStorageError, UnknownTopicOrPartition):
                    continue  # offline, or deleted meanwhile
        return logs

    def _take_offline(self, damaged_log: Log, damage: SegmentDamage) -> None:
        self.log_manager.take_offline(
            damaged_log, f"the log scrub found an unreadable record batch in {damage.path} at "
            f"byte {damage.position} of {damage.size_bytes}")
