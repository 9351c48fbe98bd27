"""Cleaning policy: which compacted partition to clean next, per-partition state, checkpoints.

Owns Kafka's ``LogCleanerManager`` rules for the logs it is given:

- the first dirty offset of each partition, kept in ``<log.dir>/cleaner-offset-checkpoint``
  (Kafka's text format, see ``checkpoint``: version 0, entry count, "topic partition offset");
  a checkpoint below the log start (or missing) means "from the log start";
- dirty ratio = bytes of closed segments from the first dirty offset to the cleanable end /
  bytes of all closed segments up to the cleanable end; a log is cleanable when the ratio is
  >= ``min.cleanable.dirty.ratio`` or its earliest dirty record is older than
  ``max.compaction.lag.ms``; the filthiest cleanable log is cleaned first;
- a partition whose cleaning raises is marked uncleanable (``uncleanable_partitions``) and
  skipped until its config changes; the others keep being cleaned;
- Kafka's summary log line per cleaning and the cleaner metrics (``metrics()``).

Thread-safety: one cleaner thread calls ``clean_filthiest``; ``metrics`` and the properties
may be read from another thread (they read dictionaries replaced, not mutated, per update).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from headrace.storage.checkpoint import read_checkpoint, write_checkpoint
from headrace.storage.cleaner import Cleaner, CleanerStats, cleanable_end_offset
from headrace.storage.clock import Clock
from headrace.storage.config import LogConfig
from headrace.storage.fs import FileSystem
from headrace.storage.log import Log

logger = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
MEGABYTE = 1024 * 1024

PartitionKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class LogToClean:
    """One compacted log's cleanable state."""

    key: PartitionKey
    log_dir: Path
    log: Log
    first_dirty_offset: int
    clean_bytes: int
    dirty_bytes: int
    must_clean: bool  # max.compaction.lag.ms exceeded

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


class CleanerManager:
    """Chooses and cleans the filthiest compacted log, one at a time."""

    def __init__(self, fs: FileSystem, clock: Clock, cleaner: Cleaner) -> None:
        self.fs = fs
        self.clock = clock
        self.cleaner = cleaner
        self.uncleanable_partitions: dict[PartitionKey, LogConfig] = {}
        self._dirty_ratios: dict[PartitionKey, float] = {}
        self._max_buffer_utilization_percent = 0.0
        self._max_clean_time_secs = 0.0
        self._max_dirty_percent = 0.0
        self._last_run_ms: int | None = None

    # ---- checkpoints ---------------------------------------------------------------------

    def checkpoints(self, log_dir: Path) -> dict[PartitionKey, int]:
        return read_checkpoint(self.fs, log_dir / CLEANER_OFFSET_CHECKPOINT)

    def _update_checkpoint(self, log_dir: Path, key: PartitionKey, offset: int) -> None:
        offsets = self.checkpoints(log_dir)
        offsets[key] = offset
        write_checkpoint(self.fs, log_dir / CLEANER_OFFSET_CHECKPOINT, offsets)

    # ---- choosing ------------------------------------------------------------------------

    def log_to_clean(self, key: PartitionKey, log_dir: Path, log: Log, now_ms: int
                     ) -> LogToClean:
        first_dirty = max(self.checkpoints(log_dir).get(key, 0), log.log_start_offset)
        end_offset = cleanable_end_offset(log, now_ms, first_dirty)
        clean_bytes = dirty_bytes = 0
        earliest_dirty_ms = None
        for segment in log.segments[:-1]:
            if segment.base_offset >= end_offset:
                break
            if segment.base_offset < first_dirty and \
                    _next_base(log, segment) <= first_dirty:
                clean_bytes += segment.size_bytes
            else:
                dirty_bytes += segment.size_bytes
                if earliest_dirty_ms is None and segment.size_bytes:
                    earliest_dirty_ms = next(segment.iter_batches(0, 1))[1].max_timestamp
        lag_ms = log.config.max_compaction_lag_ms
        must_clean = earliest_dirty_ms is not None and earliest_dirty_ms >= 0 and \
            now_ms - earliest_dirty_ms > lag_ms
        return LogToClean(key, log_dir, log, first_dirty, clean_bytes, dirty_bytes, must_clean)

    def grab_filthiest(self, logs: Mapping[PartitionKey, tuple[Path, Log]], now_ms: int
                       ) -> LogToClean | None:
        """The cleanable log with the highest dirty ratio (one past max.compaction.lag.ms
        first), or None."""
        candidates = []
        ratios = {}
        for key, (log_dir, log) in logs.items():
            if not log.config.compact_enabled or log.closed:
                continue
            if self._still_uncleanable(key, log):
                continue
            state = self.log_to_clean(key, log_dir, log, now_ms)
            ratios[key] = state.dirty_ratio
            if state.dirty_bytes and (state.must_clean or
                                      state.dirty_ratio >= log.config.min_cleanable_dirty_ratio):
                candidates.append(state)
        self._dirty_ratios = ratios
        if not candidates:
            return None
        chosen = max(candidates, key=lambda s: (s.must_clean, s.dirty_ratio))
        self._max_dirty_percent = 100.0 * chosen.dirty_ratio
        return chosen

    def _still_uncleanable(self, key: PartitionKey, log: Log) -> bool:
        failed_config = self.uncleanable_partitions.get(key)
        if failed_config is None:
            return False
        if failed_config == log.config:
            return True
        remaining = dict(self.uncleanable_partitions)
        del remaining[key]
        self.uncleanable_partitions = remaining
        return False

    # ---- cleaning ------------------------------------------------------------------------

    def clean_filthiest(self, logs: Mapping[PartitionKey, tuple[Path, Log]]
                        ) -> CleanerStats | None:
        """Clean the filthiest log once; None when nothing needed cleaning or it failed."""
        now_ms = self.clock.now_ms()
        self._last_run_ms = now_ms
        state = self.grab_filthiest(logs, now_ms)
        if state is None:
            return None
        started_ms = self.clock.monotonic_ms()
        try:
            stats = self.cleaner.clean(state.log, state.first_dirty_offset, now_ms)
        except Exception as error:  # any failure: isolate this partition, keep the others
            logger.error("%s-%d: cleaning failed, marking the partition uncleanable: %s",
                         *state.key, error)
            self.uncleanable_partitions = {**self.uncleanable_partitions,
                                           state.key: state.log.config}
            return None
        stats.elapsed_secs = (self.clock.monotonic_ms() - started_ms) / 1000
        self._update_checkpoint(state.log_dir, state.key, stats.end_offset)
        self._record(state, stats)
        return stats

    def _record(self, state: LogToClean, stats: CleanerStats) -> None:
        self._max_buffer_utilization_percent = 100.0 * stats.max_buffer_utilization
        self._max_clean_time_secs = stats.elapsed_secs
        logger.info(summary_line(state, stats))

    def metrics(self) -> dict[str, object]:
        """Kafka's cleaner metrics (values of the last run) and each log's dirty ratio."""
        now_ms = self.clock.now_ms()
        since_ms = now_ms - self._last_run_ms if self._last_run_ms is not None else -1
        return {
            "max-buffer-utilization-percent": self._max_buffer_utilization_percent,
            "max-clean-time-secs": self._max_clean_time_secs,
            "max-dirty-percent": self._max_dirty_percent,
            "time-since-last-run-ms": since_ms,
            "uncleanable-partitions-count": len(self.uncleanable_partitions),
            "dirty-ratio": dict(self._dirty_ratios),
        }


def _next_base(log: Log, segment) -> int:
    segments = log.segments
    index = segments.index(segment)
    return segments[index + 1].base_offset


def summary_line(state: LogToClean, stats: CleanerStats) -> str:
    """Kafka's per-cleaning summary (seed 004)."""
    topic, partition = state.key
    secs = max(stats.elapsed_secs, 1e-9)
    read_mb = stats.bytes_read / MEGABYTE
    reduction = 100.0 * (1 - stats.end_size_bytes / stats.start_size_bytes) \
        if stats.start_size_bytes else 0.0
    fewer = 100.0 * (1 - stats.messages_written / stats.messages_read) \
        if stats.messages_read else 0.0
    return (
        f"Log cleaner cleaned log {topic}-{partition} (dirty section = "
        f"[{state.first_dirty_offset}, {stats.end_offset}]) in {stats.passes} pass(es)\n"
        f"\t{read_mb:.1f} MB of log processed in {secs:.1f} seconds "
        f"({read_mb / secs:.1f} MB/sec).\n"
        f"\tIndexed {stats.map_messages_read} messages into the offset map.\n"
        f"\tBuffer utilization: {100.0 * stats.max_buffer_utilization:.1f}%\n"
        f"\tStart size: {stats.start_size_bytes / MEGABYTE:.1f} MB "
        f"({stats.messages_read} messages)\n"
        f"\tEnd size: {stats.end_size_bytes / MEGABYTE:.1f} MB "
        f"({stats.messages_written} messages)\n"
        f"\t{reduction:.1f}% size reduction ({fewer:.1f}% fewer messages)")
