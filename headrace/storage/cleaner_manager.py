"""Cleaning policy: which compacted partition to clean next, per-partition state, checkpoints.

Owns Kafka's ``LogCleanerManager`` rules for the logs it is given (``logs``: every log of the
broker, ``{(topic, partition): (log_dir, Log)}``):

- the first dirty offset of each partition, kept in ``<log.dir>/cleaner-offset-checkpoint``
  (Kafka's text format, see ``checkpoint``: version 0, entry count, "topic partition offset");
  a checkpoint below the log start or above the log end (or missing) means "from the log
  start"; entries of partitions that no longer exist are dropped when the file is rewritten;
- dirty ratio = bytes of closed segments from the first dirty offset to the cleanable end /
  bytes of all closed segments up to the cleanable end; a log is cleanable when the ratio is
  >= ``min.cleanable.dirty.ratio`` or its earliest dirty record is older than
  ``max.compaction.lag.ms``; the filthiest cleanable log is cleaned first;
- a partition whose cleaning raises is marked uncleanable (``uncleanable_partitions``, with
  the reason in ``uncleanable_reasons``) and skipped until its config changes; the others keep
  being cleaned. A cleaning stopped by ``CleaningAborted`` (log closed or deleted, segments
  changed by retention, cleaner shutting down) is not a failure: it is retried later;
- Kafka's summary log line per cleaning, the cleaner metrics (``metrics()``: Kafka's
  ``LogCleaner`` gauges over the cleaners' last runs -- max-buffer-utilization-percent,
  cleaner-recopy-percent, max-clean-time-secs, max-compaction-delay-secs -- and the
  ``LogCleanerManager`` ones, max-dirty-percent and time-since-last-run-ms; per log dir
  ``log_dir_metrics()``: uncleanable-partitions-count and uncleanable-bytes) and the figures
  of each partition's last cleaning (``last_cleanings``) for the status file (``status``).
  The compaction delay of a log is Kafka's ``maxCompactionDelay``: how far its earliest dirty
  record is past ``max.compaction.lag.ms`` (0 if not past it).

Thread-safety: several cleaner threads, each with its own ``Cleaner`` (and offset map), may
call ``clean_filthiest`` at once: choosing a log, the in-progress set, checkpoints and
metrics are guarded by one lock, a log is cleaned by one thread at a time, and the cleaning
itself runs outside the lock under the log's cleaning guard (``Log.begin_cleaning``).
``metrics``, ``status`` and the properties may be read from any thread (the dictionaries they
read are replaced, not mutated, per update).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from headrace.storage.checkpoint import CheckpointCorrupt, read_checkpoint, write_checkpoint
from headrace.storage.cleaner import (
    Cleaner,
    CleanerStats,
    cleanable_end_offset,
    max_compaction_delay_ms,
)
from headrace.storage.clock import Clock
from headrace.storage.config import LogConfig
from headrace.storage.fs import FileSystem
from headrace.storage.log import CleaningAborted, Log

logger = logging.getLogger(__name__)

CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
MEGABYTE = 1024 * 1024

PartitionKey = tuple[str, int]
Logs = Mapping[PartitionKey, tuple[Path, Log]]


@dataclass(frozen=True, slots=True)
class LogToClean:
    """One compacted log's cleanable state."""

    key: PartitionKey
    log_dir: Path
    log: Log
    first_dirty_offset: int
    clean_bytes: int
    dirty_bytes: int
    compaction_delay_ms: int  # how long past max.compaction.lag.ms the earliest dirty record is

    @property
    def must_clean(self) -> bool:
        """max.compaction.lag.ms exceeded."""
        return self.compaction_delay_ms > 0

    @property
    def dirty_ratio(self) -> float:
        total = self.clean_bytes + self.dirty_bytes
        return self.dirty_bytes / total if total else 0.0


@dataclass(frozen=True, slots=True)
class CleanerRunFigures:
    """One cleaner's figures behind Kafka's per-thread gauges: its last cleaning, and the
    largest compaction delay it saw when it last chose a log."""

    buffer_utilization_percent: float = 0.0
    elapsed_secs: float = 0.0
    bytes_read: int = 0
    bytes_written: int = 0
    max_compaction_delay_ms: int = 0


@dataclass(frozen=True, slots=True)
class CleaningRecord:
    """The figures of one finished cleaning of a partition (the summary line's numbers)."""

    time_ms: int
    first_dirty_offset: int
    end_offset: int
    elapsed_secs: float
    passes: int
    bytes_read: int
    bytes_written: int
    messages_read: int
    messages_written: int
    start_size_bytes: int
    end_size_bytes: int
    buffer_utilization_percent: float

    def to_json(self) -> dict[str, object]:
        return asdict(self)


class CleanerManager:
    """Chooses and cleans the filthiest compacted log; one log per thread at a time."""

    def __init__(self, fs: FileSystem, clock: Clock, cleaner: Cleaner | None = None) -> None:
        self.fs = fs
        self.clock = clock
        self.cleaner = cleaner
        self.uncleanable_partitions: dict[PartitionKey, LogConfig] = {}
        self.uncleanable_reasons: dict[PartitionKey, str] = {}
        self.last_cleanings: dict[PartitionKey, CleaningRecord] = {}
        self._lock = threading.RLock()
        self._in_progress: frozenset[PartitionKey] = frozenset()
        self._checkpoint_cache: dict[Path, dict[PartitionKey, int]] = {}
        self._dirty_ratios: dict[PartitionKey, float] = {}
        self._figures_by_cleaner: dict[int, CleanerRunFigures] = {}
        self._max_dirty_percent = 0.0
        self._last_max_compaction_delay_ms = 0
        self._last_run_ms: int | None = None

    # ---- checkpoints ---------------------------------------------------------------------

    def checkpoints(self, log_dir: Path) -> dict[PartitionKey, int]:
        """The cleaner checkpoint of ``log_dir`` (read once, then kept in memory)."""
        with self._lock:
            cached = self._checkpoint_cache.get(log_dir)
            if cached is None:
                try:
                    cached = read_checkpoint(self.fs, log_dir / CLEANER_OFFSET_CHECKPOINT)
                except CheckpointCorrupt as error:
                    logger.warning("%s; cleaning every compacted log of %s from its start",
                                   error, log_dir)
                    cached = {}
                self._checkpoint_cache[log_dir] = cached
            return dict(cached)

    def _update_checkpoint(self, log_dir: Path, key: PartitionKey, offset: int,
                           logs: Logs) -> None:
        with self._lock:
            offsets = {k: v for k, v in self.checkpoints(log_dir).items() if k in logs}
            offsets[key] = offset
            write_checkpoint(self.fs, log_dir / CLEANER_OFFSET_CHECKPOINT, offsets)
            self._checkpoint_cache[log_dir] = offsets

    # ---- choosing ------------------------------------------------------------------------

    def log_to_clean(self, key: PartitionKey, log_dir: Path, log: Log, now_ms: int
                     ) -> LogToClean:
        checkpoint = self.checkpoints(log_dir).get(key)
        first_dirty = log.log_start_offset
        if checkpoint is not None and log.log_start_offset <= checkpoint <= log.log_end_offset:
            first_dirty = checkpoint
        segments = log.segments
        end_offset = cleanable_end_offset(log, now_ms, first_dirty)
        clean_bytes = dirty_bytes = 0
        for index, segment in enumerate(segments[:-1]):
            if segment.base_offset >= end_offset:
                break
            if segments[index + 1].base_offset <= first_dirty:
                clean_bytes += segment.size_bytes
            else:
                dirty_bytes += segment.size_bytes
        delay_ms = max_compaction_delay_ms(log, now_ms, first_dirty)
        return LogToClean(key, log_dir, log, first_dirty, clean_bytes, dirty_bytes, delay_ms)

    def grab_filthiest(self, logs: Logs, now_ms: int) -> LogToClean | None:
        """The cleanable log with the highest dirty ratio (one past max.compaction.lag.ms
        first) that no other thread is cleaning, or None."""
        with self._lock:
            candidates = []
            max_delay_ms = 0
            ratios = {k: v for k, v in self._dirty_ratios.items() if k in logs}
            for gone in [k for k in self.uncleanable_partitions if k not in logs]:
                self._forget_uncleanable(gone)  # deleted: a new topic of that name starts clean
            for key, (log_dir, log) in logs.items():
                if not log.config.compact_enabled or log.closed or key in self._in_progress:
                    continue
                if self._still_uncleanable(key, log):
                    continue
                state = self.log_to_clean(key, log_dir, log, now_ms)
                ratios[key] = state.dirty_ratio
                max_delay_ms = max(max_delay_ms, state.compaction_delay_ms)
                if state.dirty_bytes and (state.must_clean or state.dirty_ratio >=
                                          log.config.min_cleanable_dirty_ratio):
                    candidates.append(state)
            self._dirty_ratios = ratios
            self._last_max_compaction_delay_ms = max_delay_ms
            if not candidates:
                self._max_dirty_percent = 0.0
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
        self._forget_uncleanable(key)
        return False

    def _forget_uncleanable(self, key: PartitionKey) -> None:
        self.uncleanable_partitions = {k: v for k, v in self.uncleanable_partitions.items()
                                       if k != key}
        self.uncleanable_reasons = {k: v for k, v in self.uncleanable_reasons.items()
                                    if k != key}

    # ---- cleaning ------------------------------------------------------------------------

    def clean_filthiest(self, logs: Logs, cleaner: Cleaner | None = None,
                        on_start: Callable[[PartitionKey], None] | None = None
                        ) -> CleanerStats | None:
        """Clean the filthiest log once with ``cleaner`` (default: the manager's own); None
        when nothing needed cleaning, the cleaning was aborted, or it failed. ``on_start``
        is called with the partition once it is marked in progress, before cleaning."""
        cleaner = cleaner or self.cleaner
        if cleaner is None:
            raise ValueError("no cleaner given")
        now_ms = self.clock.now_ms()
        with self._lock:
            self._last_run_ms = now_ms
            state = self.grab_filthiest(logs, now_ms)
            self._update_figures(cleaner, max_compaction_delay_ms=(
                self._last_max_compaction_delay_ms))
            if state is None:
                return None
            self._in_progress = self._in_progress | {state.key}
        try:
            if on_start is not None:
                on_start(state.key)
            return self._clean(state, cleaner, logs, now_ms)
        finally:
            with self._lock:
                self._in_progress = self._in_progress - {state.key}

    def _clean(self, state: LogToClean, cleaner: Cleaner, logs: Logs, now_ms: int
               ) -> CleanerStats | None:
        log = state.log
        if not log.begin_cleaning():
            return None
        started_ms = self.clock.monotonic_ms()
        try:
            stats = cleaner.clean(log, state.first_dirty_offset, now_ms)
        except CleaningAborted as reason:
            logger.info("%s-%d: cleaning aborted: %s", *state.key, reason)
            return None
        except Exception as error:  # any failure: isolate this partition, keep the others
            logger.error("%s-%d: cleaning failed, marking the partition uncleanable: %s",
                         *state.key, error)
            self._mark_uncleanable(state, f"{type(error).__name__}: {error}")
            return None
        finally:
            log.end_cleaning()
        stats.elapsed_secs = (self.clock.monotonic_ms() - started_ms) / 1000
        self._update_checkpoint(state.log_dir, state.key, stats.end_offset, logs)
        self._record(state, stats, cleaner, now_ms)
        return stats

    def _mark_uncleanable(self, state: LogToClean, reason: str) -> None:
        with self._lock:
            self.uncleanable_partitions = {**self.uncleanable_partitions,
                                           state.key: state.log.config}
            self.uncleanable_reasons = {**self.uncleanable_reasons, state.key: reason}

    def _record(self, state: LogToClean, stats: CleanerStats, cleaner: Cleaner,
                now_ms: int) -> None:
        utilization_percent = 100.0 * stats.max_buffer_utilization
        record = CleaningRecord(
            now_ms, state.first_dirty_offset, stats.end_offset, stats.elapsed_secs,
            stats.passes, stats.bytes_read, stats.bytes_written, stats.messages_read,
            stats.messages_written, stats.start_size_bytes, stats.end_size_bytes,
            utilization_percent)
        with self._lock:
            self._update_figures(cleaner, buffer_utilization_percent=utilization_percent,
                                 elapsed_secs=stats.elapsed_secs, bytes_read=stats.bytes_read,
                                 bytes_written=stats.bytes_written)
            self.last_cleanings = {**self.last_cleanings, state.key: record}
        logger.info(summary_line(state, stats))

    def _update_figures(self, cleaner: Cleaner, **changes: float) -> None:
        """Replace some of ``cleaner``'s run figures (under the lock)."""
        figures = self._figures_by_cleaner.get(id(cleaner), CleanerRunFigures())
        self._figures_by_cleaner = {**self._figures_by_cleaner,
                                    id(cleaner): replace(figures, **changes)}

    def retain_cleaners(self, cleaners: Sequence[Cleaner]) -> None:
        """Forget the figures of every cleaner but ``cleaners`` (the cleaner threads were
        restarted: Kafka's gauges range over the current threads only)."""
        keep = {id(cleaner) for cleaner in cleaners}
        with self._lock:
            self._figures_by_cleaner = {k: v for k, v in self._figures_by_cleaner.items()
                                        if k in keep}

    # ---- reporting -----------------------------------------------------------------------

    def metrics(self) -> dict[str, object]:
        """Kafka's cleaner metrics (over the cleaner threads' last runs, as ``LogCleaner``'s
        gauges: maxima, and the recopy ratio of their summed bytes) and each compacted log's
        dirty ratio. uncleanable-partitions-count is the total over the log dirs."""
        now_ms = self.clock.now_ms()
        since_ms = now_ms - self._last_run_ms if self._last_run_ms is not None else -1
        figures = list(self._figures_by_cleaner.values())
        bytes_read = sum(f.bytes_read for f in figures)
        bytes_written = sum(f.bytes_written for f in figures)
        return {
            "max-buffer-utilization-percent": max(
                (f.buffer_utilization_percent for f in figures), default=0.0),
            "cleaner-recopy-percent": 100.0 * bytes_written / max(bytes_read, 1),
            "max-clean-time-secs": max((f.elapsed_secs for f in figures), default=0.0),
            "max-compaction-delay-secs": max(
                (f.max_compaction_delay_ms for f in figures), default=0) / 1000,
            "max-dirty-percent": self._max_dirty_percent,
            "time-since-last-run-ms": since_ms,
            "uncleanable-partitions-count": len(self.uncleanable_partitions),
            "dirty-ratio": dict(self._dirty_ratios),
        }

    def log_dir_metrics(self, logs: Logs, now_ms: int) -> dict[Path, dict[str, int]]:
        """Kafka's per-log-dir gauges: uncleanable-partitions-count and uncleanable-bytes
        (the cleanable bytes of the uncleanable partitions, ``calculateCleanableBytes``)."""
        by_dir: dict[Path, dict[str, int]] = {}
        for key in self.uncleanable_partitions:
            if key not in logs:
                continue
            log_dir, log = logs[key]
            figures = by_dir.setdefault(log_dir, {"uncleanable-partitions-count": 0,
                                                  "uncleanable-bytes": 0})
            figures["uncleanable-partitions-count"] += 1
            if not log.closed:
                figures["uncleanable-bytes"] += self.log_to_clean(key, log_dir, log,
                                                                  now_ms).dirty_bytes
        return by_dir

    def status(self, logs: Logs, now_ms: int) -> dict[Path, list[dict[str, object]]]:
        """Per log dir, each compacted partition's cleaning state: dirty ratio, first dirty
        offset, sizes, last cleaning figures, uncleanable state and reason."""
        by_dir: dict[Path, list[dict[str, object]]] = {}
        for key, (log_dir, log) in sorted(logs.items()):
            if not log.config.compact_enabled or log.closed:
                continue
            state = self.log_to_clean(key, log_dir, log, now_ms)
            last = self.last_cleanings.get(key)
            by_dir.setdefault(log_dir, []).append({
                "topic": key[0],
                "partition": key[1],
                "dirty_ratio": round(state.dirty_ratio, 6),
                "first_dirty_offset": state.first_dirty_offset,
                "cleanable_bytes": state.dirty_bytes,
                "log_start_offset": log.log_start_offset,
                "log_end_offset": log.log_end_offset,
                "size_bytes": log.size_bytes,
                "in_progress": key in self._in_progress,
                "uncleanable": key in self.uncleanable_partitions,
                "uncleanable_reason": self.uncleanable_reasons.get(key),
                "last_cleaning": last.to_json() if last is not None else None,
            })
        return by_dir

    def restore_last_cleanings(self, records: Mapping[PartitionKey, CleaningRecord]) -> None:
        """Figures of cleanings before a restart (read back from a status file)."""
        with self._lock:
            self.last_cleanings = {**records, **self.last_cleanings}


def summary_line(state: LogToClean, stats: CleanerStats) -> str:
    """Kafka's per-cleaning summary (seed 004; ``LogCleaner.recordStats``): start and end
    sizes are the bytes the rewriting pass read and wrote, so appends during the cleaning do
    not distort the reduction."""
    topic, partition = state.key
    secs = max(stats.elapsed_secs, 1e-9)
    read_mb = stats.bytes_read / MEGABYTE
    reduction = 100.0 * (1 - stats.bytes_written / stats.bytes_read) \
        if stats.bytes_read else 0.0
    fewer = 100.0 * (1 - stats.messages_written / stats.messages_read) \
        if stats.messages_read else 0.0
    return (
        f"Log cleaner cleaned log {topic}-{partition} (dirty section = "
        f"[{state.first_dirty_offset}, {stats.end_offset}]) in {stats.passes} pass(es)\n"
        f"\t{read_mb:.1f} MB of log processed in {secs:.1f} seconds "
        f"({read_mb / secs:.1f} MB/sec).\n"
        f"\tIndexed {stats.map_messages_read} messages into the offset map.\n"
        f"\tBuffer utilization: {100.0 * stats.max_buffer_utilization:.1f}%\n"
        f"\tStart size: {stats.bytes_read / MEGABYTE:.1f} MB "
        f"({stats.messages_read} messages)\n"
        f"\tEnd size: {stats.bytes_written / MEGABYTE:.1f} MB "
        f"({stats.messages_written} messages)\n"
        f"\t{reduction:.1f}% size reduction ({fewer:.1f}% fewer messages)")
