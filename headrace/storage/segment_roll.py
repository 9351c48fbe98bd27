"""When the active segment of a log must roll: Kafka's ``LogSegment.shouldRoll`` rules for one
log's config.

Owns the roll decision -- by size (segment.bytes), by a full offset or time index, by the
offset range an index can address (``MAX_RELATIVE_OFFSET``), and by age -- and the segment's
age limit: Kafka's ``LogConfig.maxSegmentMs`` (``segment.ms``, or for a compacted log
``min(segment.ms, max.compaction.lag.ms)``) less a jitter drawn once per log below
``segment.jitter.ms``. Age is Kafka's ``timeWaitedForRoll``: a segment whose first batch has a
timestamp (>= 0) rolls when a batch to append has a max timestamp more than that limit past
it; a segment whose first batch has none (-1) when the broker time is that far past its
creation. No files.

Thread-safety: used by the owning log under its lock; ``must_roll`` may also be called without
it for a hint (``Log.append_needs_no_io_wait``): the cached deadlines are replaced whole.
"""

from __future__ import annotations

import random

from headrace.storage.config import LogConfig
from headrace.storage.segment import MAX_RELATIVE_OFFSET, LogSegment

ROLL_NEVER = 2**63 - 1  # a roll deadline that is never passed


class RollPolicy:
    """The roll rules of one log's current config."""

    def __init__(self, config: LogConfig, rng: random.Random) -> None:
        self._rng = rng
        self.jitter_ms = self._pick_jitter(config)
        self.config = config
        self._cached_deadlines: tuple[LogSegment | None, tuple[int, int]] = (None, (0, 0))

    def reconfigure(self, config: LogConfig) -> None:
        """Take a new config: a new jitter if segment.ms or segment.jitter.ms changed, and
        the cached deadlines forgotten."""
        if (config.segment_jitter_ms, config.segment_ms) != (
                self.config.segment_jitter_ms, self.config.segment_ms):
            self.jitter_ms = self._pick_jitter(config)
        self.config = config
        self._cached_deadlines = (None, (0, 0))

    def _pick_jitter(self, config: LogConfig) -> int:
        if config.segment_jitter_ms <= 0:
            return 0
        return self._rng.randrange(min(config.segment_jitter_ms, config.segment_ms))

    def must_roll(self, active: LogSegment, size_bytes: int, last_offset: int,
                  max_timestamp_ms: int, now_ms: int) -> bool:
        """Whether appending ``size_bytes`` ending at ``last_offset`` with batches whose
        largest timestamp is ``max_timestamp_ms`` needs a new segment first."""
        broker_deadline_ms, message_deadline_ms = self.deadlines(active)
        return (now_ms > broker_deadline_ms or max_timestamp_ms > message_deadline_ms
                or active.size_bytes + size_bytes > self.config.segment_bytes
                or len(active.offset_index.positions) >= active.offset_index.max_entries
                or len(active.time_index.timestamps) >= active.time_index.max_entries
                or last_offset - active.base_offset > MAX_RELATIVE_OFFSET)

    def deadlines(self, segment: LogSegment) -> tuple[int, int]:
        """When ``segment`` is too old to append to: (``ROLL_NEVER``, the largest batch max
        timestamp it takes) for a segment whose first batch has a timestamp, else (the
        broker time after which it rolls, ``ROLL_NEVER``). Cached per segment once its
        first batch is known."""
        cached_segment, deadlines = self._cached_deadlines
        if cached_segment is segment:
            return deadlines
        limit_ms = self.max_segment_ms - self.jitter_ms
        first_timestamp_ms = segment.first_batch_timestamp_ms
        if first_timestamp_ms is not None and first_timestamp_ms >= 0:
            deadlines = (ROLL_NEVER, first_timestamp_ms + limit_ms)
        else:
            deadlines = (segment.created_ms + limit_ms, ROLL_NEVER)
        if first_timestamp_ms is not None:
            self._cached_deadlines = (segment, deadlines)
        return deadlines

    def expired(self, segment: LogSegment, now_ms: int) -> bool:
        """Roll by time without a batch to append (headrace's maintenance; Kafka rolls only
        at an append): by broker time for a segment that rolls by its creation time; for
        one that rolls by timestamps only on a compact-only log (no retention can follow)
        whose first timestamp is > 0, so its records become cleanable within
        max.compaction.lag.ms. Records with old timestamps are never rolled -- and so
        exposed to retention -- sooner than Kafka would."""
        broker_deadline_ms, message_deadline_ms = self.deadlines(segment)
        if now_ms > broker_deadline_ms:
            return True
        config = self.config
        return (config.compact_enabled and not config.delete_enabled
                and (segment.first_batch_timestamp_ms or 0) > 0 and now_ms > message_deadline_ms)

    @property
    def max_segment_ms(self) -> int:
        """Kafka's ``LogConfig.maxSegmentMs``: a compacted log also rolls by
        max.compaction.lag.ms."""
        config = self.config
        if config.compact_enabled:
            return min(config.segment_ms, config.max_compaction_lag_ms)
        return config.segment_ms
