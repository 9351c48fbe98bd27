"""The log of one topic-partition, as Kafka's ``UnifiedLog``: the facade the broker, the
cleaner, the scrub and the tools use. It composes ``LogLoader`` (opening and recovering the
directory, rebuilding producer state), ``LocalLog`` (the segment list, its published
snapshot, reads, rolls, flushes, deletions and swaps) and ``RollPolicy`` (when to roll), and
owns the appends, the offsets (log start, log end, high watermark), retention, DeleteRecords,
the cleaner's segment swaps and the cleaning guard, and replication's storage side (below).

Files: the partition directory ``<topic>-<partition>/`` holds the segments (see ``segment``,
``local_log``), producer-state snapshots (``<20-digit offset>.snapshot``; see
``producer_state``), ``leader-epoch-checkpoint`` (see ``leader_epoch_cache``),
``accepted-gaps`` (see ``log_loader``) and ``partition.metadata`` (written by the log manager).

Replication (Kafka's ``UnifiedLog``): every append stamps the caller's ``leader_epoch`` (0 on a
single node) into each batch as partitionLeaderEpoch (header bytes 12..15, outside the CRC;
the kernel's single-batch writev carries it with the base offset, so this costs no Python
per append) and the first append of an epoch records (epoch, log end) in
``leader_epoch_cache`` before any of its batches is written; an older epoch is fenced.
``append_as_follower`` copies the leader's batches with their offsets and epochs,
``truncate_to`` / ``truncate_fully_and_start_at`` cut the log as a follower must (producer
state rebuilt from the newest snapshot at or below the cut, the epoch cache truncated). The
high watermark is the log end offset until replication manages it
(``manage_high_watermark``; ``update_high_watermark`` only moves it forward, within [log
start, log end]; truncation lowers it; the log manager checkpoints it in
``replication-offset-checkpoint``); the last stable offset and DeleteRecords stay below it, and
``read(max_offset=...)`` bounds a consumer's read by it. ``flush_up_to`` makes a prefix
durable (the sole in-sync replica acknowledges only durable records). After a crash the epoch
cache is truncated to the recovered log end (its checkpoint is written before the epoch's
data, so it never lacks an epoch the log holds) and moved to the log start.

Appends are serialized by one lock and do no per-record work in Python: one compiled-kernel call
checks every batch of the request (whole batches, magic, CRC-32C, and Kafka's LogValidator
checks of every record, parsed right after the CRC; see ``validation``) and summarises its
header as a tuple, with the max timestamp taken from the records, ``validation`` checks sizes
on those tuples (and walks the decompressed records of compressed batches), producer state is
consulted only for batches carrying a producer id, each base offset is rewritten and
LogAppendTime stamped if configured (in a copy: the caller's buffer is never changed), and the
request's batches are written with one ``write`` (no per-append fstat or seek; index entries
only each ``index.interval.bytes``). The common request -- one batch in the topic's codec, on a
CreateTime topic, fitting the active segment -- takes the single-batch path
(``_append_single_batch``): one kernel call (``segment_io.append_plain_batch``) makes the same
checks and writes the batch with its new base offset to the segment's descriptor with the GIL
released, reading the caller's buffer in place -- a read-only view of the request frame needs
no copy (a batch with a producer id, compressed records or a header max timestamp that is not
its records' largest: validated by that call, then sequence-checked, its records checked
after decompression, its max timestamp rewritten in a copy, in Python, and written by
``segment_io.write_batch``). That path is open within a ``SingleBatchWindow`` per active segment
(``_single_batch_window``: set after a general append, cleared by a roll, a config change or a
full index) and only when the log's file system is exactly ``RealFileSystem`` (decided once
per log), so a wrapping file system still sees every write. Whatever the kernel declines goes
the general way (``_append_general``), which raises the precise error. The one exception to
"no per-record work": a topic whose ``compression.type`` names a codec gets batches in other
codecs rebuilt in that codec (``validation.recompress_for_topic``; the caller's buffer is left
unchanged). After each append the writer publishes a new ``LogView`` (see ``local_log``).

Transactions (Kafka's log side): a transactional batch of a producer with no ongoing
transaction here begins one (``producer_state``); ``append_transaction_marker`` -- the one
storage function the transaction coordinator calls -- writes the end-transaction control batch
and ends it, an abort adding Kafka's entry to the segment's ``.txnindex`` (``txn_index``).
``last_stable_offset`` is the first offset of the earliest ongoing transaction, else the high
watermark; ``read(max_offset=...)`` stops before it and ``collect_aborted_transactions`` lists
what a read_committed fetch announces. KIP-890 part 1 is not checked here: the Produce handler
asks the coordinator's ``verify(transactional_id, producer_id, producer_epoch, partitions)``
before calling ``append``.

Time-based decisions read a segment's largest timestamp as Kafka's ``largestTimestamp``: the
largest valid (>= 0) batch timestamp, else the segment file's last-modified time (read through
the injected file system), so records sent without a timestamp (-1) age from when they were
written, never from 1970. Retention by retention.ms deletes a sealed segment once that is
older than retention.ms. A batch's max timestamp is its records' largest (-1 when none has
one), written into the stored header where the producer's differs, as Kafka's
setMaxTimestamp does. CreateTime bounds (message.timestamp.before/after.max.ms) are checked on
every record's timestamp.

Rolls happen on the appending thread only (at append, or in ``maintain`` called by the
broker's maintenance on that same thread, which rolls by creation time, and by timestamp only
on compact-only logs so their records become cleanable within max.compaction.lag.ms).

Thread-safety: ``append``, ``append_as_follower``, ``truncate_to``, ``roll``, ``flush``,
retention and ``close`` take the log's lock; ``read``, ``offset_for_timestamp``, the
leader-epoch cache's readers and the properties work on the published snapshot from any
thread; the managed high watermark changes under its own small lock (never held across I/O),
so ``update_high_watermark`` never waits for an append.

Cleaning guard: a cleaner thread brackets a cleaning with ``begin_cleaning``/``end_cleaning``
(a per-log lock, separate from the append lock, so appends never wait for a cleaning) and calls
``check_cleaning_aborted`` between chunks. ``stop_cleaning`` (called by ``close``,
``close_without_flush`` and by the log manager before it renames a deleted partition's
directory) marks the log as no longer cleanable and waits until a cleaning in progress has
stopped, so no cleaner touches a segment file after its descriptor is closed or writes a
``.cleaned`` file into a directory that no longer belongs to this log. It must be called
without holding the log's lock (the cleaner takes that lock in ``replace_segments``).
Retention, DeleteRecords and rolls need no guard: the cleaner reads a sealed segment pinned
open (``LogSegment.pinned``), a retired one stays readable under its ``.deleted`` name until
``file.delete.delay.ms``, and ``replace_segments`` re-checks
under the log's lock that the segments it replaces are still in the log (``CleaningAborted``
otherwise, nothing changed).
"""

from __future__ import annotations

import functools
import logging
import random
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from headrace.errors import (
    CorruptMessage,
    FencedLeaderEpoch,
    KafkaStorageError,
    OffsetOutOfRange,
    OutOfOrderSequenceNumber,
    UnknownServerError,
)
from headrace.protocol.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_BYTES,
    COMPRESSION_MASK,
    CONTROL_BIT,
    LOG_OVERHEAD_BYTES,
    MAX_TIMESTAMP_OFFSET,
    TIMESTAMP_TYPE_BIT,
    BatchHeader,
    crc_is_valid,
    parse_header,
    set_log_append_time,
    set_max_timestamp,
)
from headrace.protocol.control_records import build_end_txn_marker_batch, marker_of_batch
from headrace.protocol.kernel import whole_batches_bytes
from headrace.storage.checkpoint import CheckpointCorrupt
from headrace.storage.config import LogConfig
from headrace.storage.fs import FileSystem, RealFileSystem
from headrace.storage.leader_epoch_cache import LeaderEpochCache
from headrace.storage.local_log import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    MAX_TIMESTAMP,
    CleaningAborted,
    LocalLog,
    ReadResult,
)
from headrace.storage.log_loader import LogLoader, rebuild_producer_state
from headrace.storage.producer_state import (
    SEQUENCE_MODULUS,
    ActiveProducer,
    CompletedTxn,
    ProducerStateManager,
)
from headrace.storage.segment import MAX_RELATIVE_OFFSET, FileSlice, LogSegment
from headrace.storage.segment_io import IndexedBatches, append_plain_batch, write_batch
from headrace.storage.segment_roll import ROLL_NEVER, RollPolicy
from headrace.storage.txn_index import AbortedTxn
from headrace.storage.validation import (
    Summary,
    check_compressed_batch,
    needs_recompression,
    recompress_for_topic,
    record_checks,
    target_codec,
    validate_request,
)

logger = logging.getLogger(__name__)

__all__ = [
    "EARLIEST_TIMESTAMP", "LATEST_TIMESTAMP", "MAX_TIMESTAMP", "AppendResult", "CleaningAborted",
    "FileSlice", "Log", "ReadResult",
]


class UnexpectedAppendOffset(UnknownServerError):
    """A follower's batches do not start at its log end offset (Kafka's
    ``UnexpectedAppendOffsetException``): the fetch raced a truncation, or the leader's log
    diverged. Nothing was written."""

    def __init__(self, message: str, first_offset: int, log_end_offset: int) -> None:
        super().__init__(message)
        self.first_offset = first_offset
        self.log_end_offset = log_end_offset


class AppendResult(NamedTuple):
    """What an append assigned. A named tuple rather than a frozen dataclass: it is built
    on every append, and a tuple costs less than half as much to construct."""

    base_offset: int
    last_offset: int
    log_append_time_ms: int
    log_start_offset: int
    duplicate: bool = False


# What batch.set_base_offset does, without a Python call per batch on the append path.
_pack_base_offset = struct.Struct(">q").pack_into
# The partitionLeaderEpoch field (int32 at byte 12 of a batch, outside the CRC).
PARTITION_LEADER_EPOCH_OFFSET = 12
_pack_leader_epoch = struct.Struct(">i").pack_into
# AppendResult(...) runs NamedTuple's Python-level __new__; this builds the same tuple in C.
_new_append_result = functools.partial(tuple.__new__, AppendResult)

# When a single batch may be appended in one kernel call: (the active segment, the broker
# time after which it must roll by age, the largest last offset its index can address, the
# largest batch max timestamp it takes before rolling by age, the broker time until which no
# batch the kernel accepts -- none stamped past message.timestamp.after.max.ms -- can carry
# a larger one, so the header need not be read, the segment's log file descriptor: open until
# the segment is sealed, which closes the window). A plain tuple: read on every append.
SingleBatchWindow = tuple[LogSegment, int, int, int, int, int]
# A batch header's batch_length (int32 at byte 8) and max_timestamp (int64 at byte 35).
_LENGTH_AND_MAX_TIMESTAMP = struct.Struct(">8xi23xq").unpack_from


def single_batch_max_timestamp(records: bytes | bytearray | memoryview) -> int:
    """The header max timestamp of ``records`` if they are exactly one batch, else
    ``ROLL_NEVER`` (unknown: whoever asks must assume the batch may roll the segment).
    On the single-batch append path: one struct call."""
    size_bytes = len(records)
    if size_bytes < BATCH_HEADER_BYTES:
        return ROLL_NEVER
    batch_length, max_timestamp_ms = _LENGTH_AND_MAX_TIMESTAMP(records)
    return max_timestamp_ms if batch_length + LOG_OVERHEAD_BYTES == size_bytes else ROLL_NEVER


class Log:
    """One topic-partition's log; opened (and recovered) by the constructor."""

    def __init__(self, topic: str, partition: int, directory: Path, config: LogConfig,
                 fs: FileSystem, now_ms: int, recovery_point: int = 0, log_start_offset: int = 0,
                 clean_shutdown: bool = False, rng: random.Random | None = None) -> None:
        self.topic = topic
        self.partition = partition
        self.dir = directory
        self.config = config
        self.fs = fs
        # The kernel may write straight to segment descriptors only when no wrapper (a
        # fault-injecting test file system) needs to see the writes.
        self._fs_is_real = type(fs) is RealFileSystem
        self._lock = threading.Lock()  # not re-entrant: locked paths call *_locked helpers
        self._listeners: list[Callable[[int], None]] = []
        self._roll_policy = RollPolicy(config, rng or random.Random())
        self._apply_config(config)
        self._closed = False
        self._cleaning_lock = threading.Lock()
        self._cleaning_stopped = False
        self.producer_state = ProducerStateManager(fs, directory)
        fs.mkdir(directory)
        loaded = LogLoader(topic, partition, directory, config, fs).load(
            now_ms, recovery_point, log_start_offset, clean_shutdown)
        self._local = LocalLog(topic, partition, directory, config, fs, loaded.segments,
                               loaded.log_end_offset, log_start_offset, now_ms)
        rebuild_producer_state(self.producer_state, loaded.segments, loaded.snapshot_limit,
                               loaded.log_end_offset)
        self.leader_epoch_cache = self._load_leader_epoch_cache()
        # The epoch of the latest entry: an append of another epoch begins a new entry.
        self._append_epoch = self.leader_epoch_cache.latest_epoch()
        # What appends without an explicit leader_epoch stamp (``set_leader_epoch``).
        self._leader_epoch = 0
        # None: the high watermark is the log end offset (single node); else the explicit one
        # replication manages (``manage_high_watermark``). Changed under ``_hw_lock``.
        self._managed_high_watermark: int | None = None
        self._hw_lock = threading.Lock()

    def _load_leader_epoch_cache(self) -> LeaderEpochCache:
        """The checkpointed cache (rebuilt from the batches' headers if the file does not
        parse), truncated to the recovered log as Kafka does after loading: a crash may have
        lost the tail an entry points into."""
        try:
            cache = LeaderEpochCache(self.fs, self.dir, lambda: self.log_end_offset)
        except CheckpointCorrupt as error:
            logger.warning("%s-%d: %s; rebuilding the leader-epoch cache from the log",
                           self.topic, self.partition, error)
            cache = LeaderEpochCache.rebuilt(self.fs, self.dir, lambda: self.log_end_offset,
                                             self._batch_epochs())
        cache.truncate_from_end(self.log_end_offset)
        cache.truncate_from_start(self.log_start_offset)
        return cache

    def _batch_epochs(self):
        """(partitionLeaderEpoch, base offset) of every batch of the log, in order (a
        header walk)."""
        for segment in self._local.view.segments:
            for _, header in segment.iter_batches(0):
                yield header.partition_leader_epoch, header.base_offset

    # ---- public state --------------------------------------------------------------------

    @property
    def log_start_offset(self) -> int:
        return self._local.view.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self._local.view.log_end_offset

    @property
    def high_watermark(self) -> int:
        """The log end offset, unless replication manages the high watermark
        (``manage_high_watermark``): then the explicit one, never above the log end."""
        managed = self._managed_high_watermark
        return self._local.view.log_end_offset if managed is None else managed

    @property
    def last_stable_offset(self) -> int:
        """Kafka's LSO: the first offset of the earliest ongoing transaction -- never below
        the log start offset (Kafka's ``maybeIncrementFirstUnstableOffset``: DeleteRecords or
        retention may remove a transaction's first records) -- else the high watermark. Safe
        from any thread."""
        first_unstable = self.producer_state.first_unstable_offset()
        view = self._local.view
        managed = self._managed_high_watermark
        high_watermark = view.log_end_offset if managed is None else managed
        if first_unstable is None:
            return high_watermark
        return min(max(first_unstable, view.log_start_offset), high_watermark)

    @property
    def recovery_point(self) -> int:
        return self._local.recovery_point

    @property
    def last_flush_ms(self) -> int:
        return self._local.last_flush_ms

    @property
    def size_bytes(self) -> int:
        return self._local.size_bytes

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        return self._local.view.segments

    @property
    def closed(self) -> bool:
        return self._closed

    def active_producers(self) -> tuple[ActiveProducer, ...]:
        """The producers' states (DescribeProducers), read under the log's lock."""
        with self._lock:
            return self.producer_state.active_producers()

    def add_append_listener(self, callback: Callable[[int], None]) -> None:
        self._listeners.append(callback)

    def _apply_config(self, config: LogConfig) -> None:
        """Precompute what every append consults: the target codec, the timestamp type, the
        kernel's record limits; and close the single-batch window (segment.ms may have
        changed)."""
        self._target_codec = target_codec(config)
        self._log_append_time = config.log_append_time
        self._segment_bytes = config.segment_bytes
        self._flush_messages = config.flush_messages
        limits = (config.max_message_bytes, config.message_timestamp_before_max_ms,
                  config.message_timestamp_after_max_ms,
                  -1 if self._target_codec is None else self._target_codec,
                  config.compact_enabled)
        # by from_client: a client's batches may not be control batches (LogValidator)
        self._kernel_record_limits = (limits + (False,), limits + (True,))
        self._single_batch_window: SingleBatchWindow | None = None

    # ---- appending -----------------------------------------------------------------------

    def append(self, records: bytes | bytearray | memoryview, now_ms: int,
               from_client: bool = False, leader_epoch: int | None = None) -> AppendResult:
        """Validate, assign offsets to and write one or more whole v2 batches; a topic whose
        compression.type names a codec gets batches of other codecs recompressed first.
        ``records`` (any contiguous buffer) is only read: the single-batch path writes it with its
        new base offset in one writev, the general path works on a copy. ``from_client``:
        a producer's request (Produce), held to Kafka's client rules (no control batches).
        ``leader_epoch`` (the partition state's; default: the log's ``leader_epoch``, set by
        ``set_leader_epoch``, 0 on a single node) is stamped into every batch as
        partitionLeaderEpoch; the first append of a new epoch records (epoch, log
        end) in ``leader_epoch_cache`` (and its checkpoint) before writing. An epoch below the
        cache's latest raises FencedLeaderEpoch (a deposed leader), nothing written.

        The hot path of every produce request. Its common case -- one batch in the topic's
        codec, on a CreateTime topic, fitting the active segment -- is one kernel call
        (``append_plain_batch``: validate, rewrite the base offset, write; for an idempotent
        producer's batch the sequence check comes between validating and ``write_batch``) and
        the index upkeep, within a window opened by the general path."""
        lock = self._lock
        lock.acquire()  # not ``with``: half the cost, on every append
        try:
            if self._closed:
                raise KafkaStorageError(f"log {self.topic}-{self.partition} is closed")
            if leader_epoch is None:
                leader_epoch = self._leader_epoch
            if leader_epoch != self._append_epoch:
                self._begin_epoch_locked(leader_epoch)
            window = self._single_batch_window
            result = None
            if window is not None and now_ms <= window[1] and (
                    now_ms <= window[4] or single_batch_max_timestamp(records) <= window[3]):
                result = self._append_single_batch(records, window, now_ms, from_client,
                                                   leader_epoch)
            if result is None:
                result = self._append_general(records, now_ms, from_client, leader_epoch)
        finally:
            lock.release()
        if self._listeners and not result.duplicate:
            for listener in self._listeners:
                listener(result.last_offset + 1)
        return result

    @property
    def leader_epoch(self) -> int:
        """The epoch appends stamp when their caller names none (``set_leader_epoch``)."""
        return self._leader_epoch

    def set_leader_epoch(self, leader_epoch: int) -> None:
        """This broker leads the partition in ``leader_epoch`` (the partition state's): every
        later append without an explicit epoch -- produce, the group and transaction
        coordinators' records, transaction markers -- stamps it. Raises ValueError for a
        negative epoch or one older than the log's latest (a stale partition state)."""
        latest = self.leader_epoch_cache.latest_epoch()
        if leader_epoch < 0 or (latest is not None and leader_epoch < latest):
            raise ValueError(f"{self.topic}-{self.partition}: leader epoch {leader_epoch} "
                             f"below 0 or the log's latest epoch {latest}")
        self._leader_epoch = leader_epoch

    def _begin_epoch_locked(self, leader_epoch: int) -> None:
        """The first append of ``leader_epoch``: its entry starts at the log end (Kafka's
        ``maybeAssignEpochStartOffset``), checkpointed before any batch of it is written."""
        latest = self._append_epoch
        if latest is not None and leader_epoch < latest:
            raise FencedLeaderEpoch(f"{self.topic}-{self.partition}: append in leader epoch "
                                    f"{leader_epoch}, the log is at epoch {latest}")
        self.leader_epoch_cache.assign(leader_epoch, self._local.view.log_end_offset)
        self._append_epoch = leader_epoch

    def append_transaction_marker(self, producer_id: int, producer_epoch: int, commit: bool,
                                  coordinator_epoch: int, now_ms: int,
                                  leader_epoch: int | None = None) -> AppendResult:
        """Write the end-transaction marker the transaction coordinator sends for this
        partition (Kafka's append with ``AppendOrigin.COORDINATOR``): one control batch
        (``control_records``) ending the producer's ongoing transaction here, if it has one.

        The one storage function the coordinator side calls (WriteTxnMarkers). As Kafka's:
        raises InvalidProducerEpoch for ``producer_epoch`` older than the producer's and
        TransactionCoordinatorFenced for ``coordinator_epoch`` older than the last marker's;
        otherwise the marker is always written -- also when the producer has no ongoing
        transaction here (a retried marker), which then completes nothing -- so retrying is
        safe. An aborted transaction is recorded in the aborted-transaction index."""
        batch = build_end_txn_marker_batch(producer_id, producer_epoch, commit,
                                           coordinator_epoch, now_ms)
        with self._lock:
            if self._closed:
                raise KafkaStorageError(f"log {self.topic}-{self.partition} is closed")
            self.producer_state.check_marker(producer_id, producer_epoch, coordinator_epoch)
            if leader_epoch is None:
                leader_epoch = self._leader_epoch
            if leader_epoch != self._append_epoch:
                self._begin_epoch_locked(leader_epoch)
            result = self._append_general(batch, now_ms, False, leader_epoch)
            completed = self.producer_state.complete_txn(
                producer_id, producer_epoch, coordinator_epoch, commit, result.base_offset,
                now_ms)
            if completed is not None:
                self._record_completed_txn(completed)
        for listener in self._listeners:
            listener(result.last_offset + 1)
        return result

    # ---- a follower's appends and truncations ---------------------------------------------

    def append_as_follower(self, records: bytes | bytearray | memoryview, now_ms: int
                           ) -> AppendResult:
        """Append whole v2 batches copied from the leader with their offsets, epochs and
        timestamps as they are (Kafka's ``appendAsFollower``): CRC and structure checked, no
        client rules, no recompression; a trailing partial batch (a fetch cut short) is
        ignored. The first batch must start at the log end offset (UnexpectedAppendOffset,
        nothing written; on a compacted log it may start later: the cleaner removed the
        offsets between), and each next batch after the one before. The leader-epoch cache
        takes each batch's partitionLeaderEpoch (before the write) and producer state
        replays the batches exactly as recovery does, so a follower that becomes leader
        keeps idempotence and transactions (aborted ones enter the txn index)."""
        view = memoryview(records).toreadonly()
        whole_bytes = whole_batches_bytes(view)
        with self._lock:
            if self._closed:
                raise KafkaStorageError(f"log {self.topic}-{self.partition} is closed")
            local = self._local
            log_end_offset = local.view.log_end_offset
            if whole_bytes == 0:
                return _new_append_result((log_end_offset, log_end_offset - 1, -1,
                                           local.view.log_start_offset, False))
            data = view[:whole_bytes]
            headers = self._follower_batches(data, log_end_offset)
            for _, header in headers:
                if header.partition_leader_epoch >= 0:
                    self.leader_epoch_cache.assign(header.partition_leader_epoch,
                                                   header.base_offset)
            self._append_epoch = self.leader_epoch_cache.latest_epoch()
            entries = [(h.size_bytes, h.last_offset, h.max_timestamp, p) for p, h in headers]
            last_offset = headers[-1][1].last_offset
            active = self._active_segment_for(whole_bytes, last_offset,
                                              max(entry[2] for entry in entries), now_ms)
            active.append(data, entries, now_ms)
            self._replay_follower_batches(data, headers)
            if last_offset + 1 - local.recovery_point >= self.config.flush_messages:
                local.flush(now_ms, last_offset + 1)
            local.view = local.view.with_tail(last_offset + 1, active.size_bytes)
            self._single_batch_window = None
            result = _new_append_result((headers[0][1].base_offset, last_offset, -1,
                                         local.view.log_start_offset, False))
        for listener in self._listeners:
            listener(last_offset + 1)
        return result

    def _follower_batches(self, data: memoryview, log_end_offset: int
                          ) -> list[tuple[int, BatchHeader]]:
        """(position, header) of each whole batch of ``data``, checked: magic 2, CRC-32C,
        offsets starting at ``log_end_offset`` (later on a compacted log) and increasing."""
        headers, position, expected = [], 0, log_end_offset
        while position < len(data):
            header = parse_header(data, position)
            end = position + header.size_bytes
            if not crc_is_valid(data, position, header):
                raise CorruptMessage(f"{self.topic}-{self.partition}: replicated batch at "
                                     f"offset {header.base_offset} fails its CRC")
            gap_allowed = self.config.compact_enabled
            if header.base_offset < expected or (header.base_offset > expected
                                                 and not gap_allowed):
                raise UnexpectedAppendOffset(
                    f"{self.topic}-{self.partition}: replicated batch starts at offset "
                    f"{header.base_offset}, expected {expected}", header.base_offset,
                    log_end_offset)
            headers.append((position, header))
            expected, position = header.next_offset, end
        return headers

    def _replay_follower_batches(self, data: memoryview, headers: list[tuple[int, BatchHeader]]
                                 ) -> None:
        """Producer state from copied batches, as recovery replays them."""
        state = self.producer_state
        for position, header in headers:
            if header.producer_id < 0:
                continue
            marker = None
            if header.is_control:
                found = marker_of_batch(data[position : position + header.size_bytes])
                marker = None if found is None else (found.commit, found.coordinator_epoch)
            completed = state.replay(header, marker)
            if completed is not None:
                self._record_completed_txn(completed)

    def truncate_to(self, offset: int, now_ms: int = 0) -> bool:
        """Drop every record at or above ``offset`` (a follower truncating to where its
        log and the leader's agree; Kafka's ``UnifiedLog.truncateTo``): segments, indexes,
        aborted-transaction entries; producer state rebuilt from the newest snapshot at or
        below the new end (later snapshots deleted); leader-epoch entries from the new end
        removed; a managed high watermark lowered to it. No-op (False) when ``offset`` >=
        the log end; below the log start, the log is emptied and restarts at ``offset``.
        ``now_ms`` dates the retired segments' deletion."""
        if offset < 0:
            raise ValueError(f"cannot truncate {self.topic}-{self.partition} to {offset}")
        with self._lock:
            if self._closed:
                raise KafkaStorageError(f"log {self.topic}-{self.partition} is closed")
            local = self._local
            if offset >= local.view.log_end_offset:
                return False
            if offset < local.view.log_start_offset:
                self._truncate_fully_locked(offset, now_ms)
                return True
            self._single_batch_window = None
            log_end_offset = local.truncate_to(offset, now_ms)
            # from the newest snapshot at or below the new end; later ones deleted
            rebuild_producer_state(self.producer_state, local.segments, log_end_offset,
                                   log_end_offset)
            self.leader_epoch_cache.truncate_from_end(log_end_offset)
            self._append_epoch = self.leader_epoch_cache.latest_epoch()
            self._lower_high_watermark_locked(log_end_offset)
        return True

    def truncate_fully_and_start_at(self, offset: int, now_ms: int = 0) -> None:
        """Empty the log and restart it at ``offset`` (a follower whose fetch offset fell
        below the leader's log start; Kafka's ``truncateFullyAndStartAt``): every segment
        retired, producer state and its snapshots cleared, the leader-epoch cache emptied,
        log start = log end = ``offset``, a managed high watermark set to it."""
        if offset < 0:
            raise ValueError(f"cannot restart {self.topic}-{self.partition} at {offset}")
        with self._lock:
            if self._closed:
                raise KafkaStorageError(f"log {self.topic}-{self.partition} is closed")
            self._truncate_fully_locked(offset, now_ms)

    def _truncate_fully_locked(self, offset: int, now_ms: int) -> None:
        self._single_batch_window = None
        self._local.truncate_fully_and_start_at(offset, now_ms)
        self.producer_state.remove_snapshots(above_offset=-1)
        self.producer_state.load_latest_snapshot(-1)  # no snapshot left: empty state
        self.leader_epoch_cache.clear()
        self._append_epoch = None
        with self._hw_lock:
            if self._managed_high_watermark is not None:
                self._managed_high_watermark = offset

    def _record_completed_txn(self, completed: CompletedTxn) -> None:
        """An aborted transaction goes into the aborted-transaction index of the segment
        holding its marker (a committed one needs no entry)."""
        if completed.aborted:
            self._local.active_segment.txn_index.append(
                self.producer_state.aborted_entry(completed))

    def _append_single_batch(self, records: bytes | bytearray | memoryview,
                             window: SingleBatchWindow, now_ms: int, from_client: bool,
                             leader_epoch: int) -> AppendResult | None:
        """A single batch in one kernel call (two with a producer id, compressed records
        or a max timestamp to rewrite); None (nothing written) when the kernel declines the
        request and the general path must decide."""
        active, fd, local = window[0], window[5], self._local
        first_offset = local.view.log_end_offset
        written = append_plain_batch(records, fd, first_offset, leader_epoch,
                                     self._segment_bytes - active.size_bytes, window[2],
                                     now_ms, self._kernel_record_limits[from_client])
        if written is None:
            return None
        last_offset, max_timestamp_ms, was_written = written
        if not was_written:
            records, max_timestamp_ms = self._finish_single_batch(records, max_timestamp_ms,
                                                                  now_ms, from_client)
            duplicate = self._write_producer_batch(records, fd, first_offset, leader_epoch)
            if duplicate is not None:
                return duplicate
        if active.note_written_batch(len(records), last_offset, max_timestamp_ms, now_ms):
            self._single_batch_window = None  # an index is full: the next append rolls
        if last_offset + 1 - local.recovery_point >= self._flush_messages:
            local.flush(now_ms, last_offset + 1)  # before fetches can see the records
        view = local.view
        local.view = view.with_tail(last_offset + 1, active.size_bytes)
        return _new_append_result((first_offset, last_offset, -1, view.log_start_offset, False))

    def _finish_single_batch(self, records: bytes | bytearray | memoryview,
                             max_timestamp_ms: int, now_ms: int, from_client: bool
                             ) -> tuple[bytes | bytearray | memoryview, int]:
        """A batch the kernel validated but did not write: a compressed batch's records
        checked (raising as the general path does), and the batch with its header's max
        timestamp set to its records' largest and its LogAppendTime bit cleared (in a copy
        when either differs: Kafka's setMaxTimestamp) and that maximum."""
        if records[22] & COMPRESSION_MASK:  # read-only: the caller's buffer stays as it is
            with memoryview(records) as view, view.toreadonly() as unchanged:
                max_timestamp_ms = check_compressed_batch(
                    unchanged, 0, record_checks(self.config, now_ms, from_client),
                    f"{self.topic}-{self.partition}")
        if (int.from_bytes(records[MAX_TIMESTAMP_OFFSET : MAX_TIMESTAMP_OFFSET + 8], "big",
                           signed=True) != max_timestamp_ms
                or records[ATTRIBUTES_OFFSET + 1] & TIMESTAMP_TYPE_BIT):
            records = bytearray(records)
            set_max_timestamp(records, 0, len(records), max_timestamp_ms)
        return records, max_timestamp_ms

    def _write_producer_batch(self, records: bytes | bytearray | memoryview, fd: int,
                              first_offset: int, leader_epoch: int) -> AppendResult | None:
        """A validated batch, written at ``first_offset``; with a producer id, the original
        result instead if it is a duplicate (else the batch is recorded); raises for a bad
        epoch or sequence, as the general path does."""
        header = parse_header(records)
        duplicate = self._duplicate_of(header) if header.producer_id >= 0 else None
        if duplicate is None:
            write_batch(records, fd, first_offset, leader_epoch)
            if header.producer_id >= 0 and not header.is_control:
                self.producer_state.update(header, first_offset)
        return duplicate

    def _append_general(self, request: bytes | bytearray | memoryview, now_ms: int,
                        from_client: bool, leader_epoch: int) -> AppendResult:
        """Every append the single-batch path declines: several batches, LogAppendTime,
        recompression, a roll, or a request to reject (the precise error is raised here).
        Base offsets and LogAppendTime are written into a copy of ``request``."""
        records = bytearray(request)
        config = self.config
        summaries = validate_request(records, config, now_ms, from_client=from_client,
                                     topic_partition=f"{self.topic}-{self.partition}")
        producer_headers = None
        if len(summaries) > 1 or summaries[0][6] >= 0:  # else: one batch without producer id
            producer_headers = self._producer_headers(records, summaries)
            if producer_headers:
                duplicate = self._check_producers(producer_headers)
                if duplicate is not None:
                    return duplicate
        codec = self._target_codec
        if codec is not None and needs_recompression(summaries, codec):
            records, summaries = recompress_for_topic(records, summaries, codec,
                                                      config.max_message_bytes)
        local = self._local
        first_offset = local.view.log_end_offset
        next_offset, active = self._write(records, summaries, first_offset, now_ms, leader_epoch)
        if producer_headers:
            self._record_producers(producer_headers, first_offset)
        if next_offset - local.recovery_point >= config.flush_messages:
            local.flush(now_ms, next_offset)  # before fetches can see the records
        view = local.view  # after _write: a roll publishes a new segment tuple
        local.view = view.with_tail(next_offset, active.size_bytes)
        self._single_batch_window = self._single_batch_window_for(active)
        return _new_append_result((first_offset, next_offset - 1,
                                   now_ms if self._log_append_time else -1,
                                   view.log_start_offset, False))

    def _single_batch_window_for(self, active: LogSegment) -> SingleBatchWindow | None:
        """The window in which the next appends to ``active`` take the single-batch path, or
        None: only when the kernel may write to its descriptor, the topic uses CreateTime,
        and ``active`` is non-empty with indexes not full (so nothing but its age, which the
        window holds, or its size, which the kernel checks, can make it roll)."""
        if (self._fs_is_real and not self._log_append_time and active.size_bytes
                and not active.offset_index.is_full and not active.time_index.is_full):
            broker_deadline_ms, message_deadline_ms = self._roll_policy.deadlines(active)
            unread_until_ms = ROLL_NEVER if message_deadline_ms == ROLL_NEVER else \
                message_deadline_ms - self.config.message_timestamp_after_max_ms
            return (active, broker_deadline_ms, active.base_offset + MAX_RELATIVE_OFFSET,
                    message_deadline_ms, unread_until_ms, active.fd)
        return None

    def _write(self, records: bytearray, summaries: tuple[Summary, ...], first_offset: int,
               now_ms: int, leader_epoch: int) -> tuple[int, LogSegment]:
        """Assign offsets from ``first_offset`` and stamp ``leader_epoch``, roll if needed,
        write to the active segment:
        the next offset and the segment written. One batch (the usual request) takes a
        path without per-batch lists."""
        log_append_time = self._log_append_time
        if len(summaries) == 1:  # a single whole batch: it starts at position 0
            _pack_base_offset(records, 0, first_offset)
            _pack_leader_epoch(records, PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)
            next_offset = first_offset + summaries[0][3] + 1
            max_timestamp_ms = now_ms if log_append_time else summaries[0][5]
            if log_append_time:
                set_log_append_time(records, 0, now_ms)
            active = self._active_segment_for(len(records), next_offset - 1, max_timestamp_ms,
                                              now_ms)
            active.append_batch(records, next_offset - 1, max_timestamp_ms, now_ms)
            return next_offset, active
        next_offset, entries = self._assign_offsets(records, summaries, first_offset,
                                                    log_append_time, now_ms, leader_epoch)
        max_timestamp_ms = max(entry[2] for entry in entries)
        active = self._active_segment_for(len(records), next_offset - 1, max_timestamp_ms, now_ms)
        active.append(records, entries, now_ms)
        return next_offset, active

    @staticmethod
    def _assign_offsets(records: bytearray, summaries: tuple[Summary, ...], first_offset: int,
                        log_append_time: bool, now_ms: int, leader_epoch: int
                        ) -> tuple[int, list[tuple[int, int, int, int]]]:
        """Rewrite each batch's base offset and leader epoch (and stamp LogAppendTime if
        asked): the next offset and the segment's index entries (size, last offset, max
        timestamp, position)."""
        offset, entries = first_offset, []
        for position, size_bytes, _, last_offset_delta, _, max_timestamp, _, _ in summaries:
            _pack_base_offset(records, position, offset)
            _pack_leader_epoch(records, position + PARTITION_LEADER_EPOCH_OFFSET, leader_epoch)
            if log_append_time:
                set_log_append_time(records, position, now_ms)
                max_timestamp = now_ms
            offset += last_offset_delta + 1
            entries.append((size_bytes, offset - 1, max_timestamp, position))
        return offset, entries

    @staticmethod
    def _producer_headers(records: bytearray, summaries: tuple[Summary, ...]
                          ) -> list[tuple[int, BatchHeader]]:
        """(offset relative to the request's first, header) of each data batch that carries
        a producer id; empty (and no header parsed) for plain producers."""
        found, relative_offset = [], 0
        for position, _, attributes, last_offset_delta, _, _, producer_id, _ in summaries:
            if producer_id >= 0 and not attributes & CONTROL_BIT:
                found.append((relative_offset, parse_header(records, position)))
            relative_offset += last_offset_delta + 1
        return found

    def _check_producers(self, headers: list[tuple[int, BatchHeader]]) -> AppendResult | None:
        pending: dict[int, tuple[int, int]] = {}
        for _, header in headers:
            if header.producer_id in pending:
                self._check_within_request(header, pending[header.producer_id])
            else:
                duplicate = self._duplicate_of(header)
                if duplicate is not None:
                    return duplicate
            pending[header.producer_id] = (header.producer_epoch, header.last_sequence)
        return None

    def _duplicate_of(self, header: BatchHeader) -> AppendResult | None:
        """The original append's result if ``header``'s batch repeats one of its producer's
        last five (raises for a bad epoch or sequence); None for a batch to write."""
        original = self.producer_state.check(header)
        if original is None:
            return None
        return AppendResult(original.first_offset, original.last_offset, -1,
                            self._local.view.log_start_offset, duplicate=True)

    @staticmethod
    def _check_within_request(header: BatchHeader, previous: tuple[int, int]) -> None:
        epoch, last_sequence = previous
        expected = (last_sequence + 1) % SEQUENCE_MODULUS
        if header.producer_epoch != epoch or header.base_sequence != expected:
            raise OutOfOrderSequenceNumber(
                f"producer {header.producer_id} sent sequence {header.base_sequence} in epoch "
                f"{header.producer_epoch}, expected {expected} in epoch {epoch}")

    def _record_producers(self, headers: list[tuple[int, BatchHeader]], first_offset: int) -> None:
        for relative_offset, header in headers:
            self.producer_state.update(header, first_offset + relative_offset)

    # ---- rolling and flushing ------------------------------------------------------------

    def _active_segment_for(self, size_bytes: int, last_offset: int, max_timestamp_ms: int,
                            now_ms: int) -> LogSegment:
        """The segment to append to: the active one, unless it is non-empty and must roll:
        full by size, index or relative offset range, or too old (Kafka's ``shouldRoll``;
        ``max_timestamp_ms`` is the largest timestamp of the batches to append)."""
        active = self._local.active_segment
        if active.size_bytes and self._roll_policy.must_roll(active, size_bytes, last_offset,
                                                             max_timestamp_ms, now_ms):
            active = self._roll_locked(now_ms)
        return active

    def append_needs_no_io_wait(self, size_bytes: int, now_ms: int,
                                records: bytes | bytearray | memoryview = b"",
                                leader_epoch: int | None = None) -> bool:
        """Whether appending ``records`` (``size_bytes`` of them) now certainly neither fsyncs
        nor rolls (flush.messages not reached even if every byte were a record; no roll by
        size, index, offset range or age -- by the batch's max timestamp when the active
        segment rolls by timestamps; not the first append of a leader epoch, which writes the
        leader-epoch checkpoint: the log's first append, or one in ``leader_epoch`` -- default
        the log's ``leader_epoch`` -- newer than the latest) and is not on a compacted log
        (whose lock the cleaner takes for a swap). The broker runs such small appends inline
        on its event loop. A hint read without the lock: a racing append can only make the
        answer stale towards "a roll or flush happens", which the append then simply
        performs."""
        config = self.config
        if config.compact_enabled or self._closed:
            return False
        latest_epoch = self._append_epoch
        epoch = self._leader_epoch if leader_epoch is None else leader_epoch
        if latest_epoch is None or epoch > latest_epoch:
            return False
        local = self._local
        log_end_offset = local.view.log_end_offset
        if log_end_offset + size_bytes - local.recovery_point >= config.flush_messages:
            return False
        active = local.active_segment
        return not (active.size_bytes and self._roll_policy.must_roll(
            active, size_bytes, log_end_offset + size_bytes,
            single_batch_max_timestamp(records), now_ms))


    def roll(self, now_ms: int) -> None:
        with self._lock:
            if self._local.active_segment.size_bytes:
                self._roll_locked(now_ms)

    def maybe_roll_by_time(self, now_ms: int) -> None:
        with self._lock:
            self._maybe_roll_by_time_locked(now_ms)

    def _maybe_roll_by_time_locked(self, now_ms: int) -> None:
        active = self._local.active_segment
        if active.size_bytes and self._roll_policy.expired(active, now_ms):
            self._roll_locked(now_ms)

    def _roll_locked(self, now_ms: int) -> LogSegment:
        """Seal the active segment (everything below the new one made durable first), take
        a producer-state snapshot at the log end and start a new active segment."""
        local = self._local
        local.seal_active_segment(now_ms)
        self._single_batch_window = None
        self.producer_state.take_snapshot(local.view.log_end_offset)
        return local.start_segment(now_ms)

    def maintain(self, now_ms: int, flush_by_time: bool = False,
                 check_retention: bool = False) -> int | None:
        """The broker's periodic work on this log: roll by segment.ms and flush the rolled
        segments; with ``flush_by_time`` flush by flush.ms (Kafka's log flusher, run each
        log.flush.scheduler.interval.ms); with ``check_retention`` delete segments by
        retention (Kafka's retention check, run each log.retention.check.interval.ms).
        Returns the count of segments deleted; None -- nothing done -- while another thread
        holds the log's lock (a cleaner swapping segments in holds it across renames and
        fsyncs): the caller is the append thread, which must not wait for that, and retries
        at its next round."""
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._closed:
                return 0
            self._maybe_roll_by_time_locked(now_ms)
            self._flush_if_due_locked(now_ms, flush_by_time)
            return self._delete_old_segments_locked(now_ms) if check_retention else 0
        finally:
            self._lock.release()

    def flush(self) -> None:
        with self._lock:
            self._local.flush(None)

    def flush_up_to(self, offset: int) -> int:
        """Make every record below ``offset`` durable (the sole-ISR leader's fsync before
        it advances the high watermark): nothing when the recovery point already reaches it,
        else an fsync of everything written (the recovery point becomes the log end). Returns
        the recovery point: all records below it are on disk."""
        with self._lock:
            local = self._local
            if offset > local.recovery_point and not self._closed:
                local.flush(None)
            return local.recovery_point

    def flush_if_due(self, now_ms: int) -> None:
        """Time-based flush (flush.ms), and the flush Kafka schedules after a roll."""
        with self._lock:
            if not self._closed:
                self._flush_if_due_locked(now_ms, flush_by_time=True)

    def _flush_if_due_locked(self, now_ms: int, flush_by_time: bool) -> None:
        """The flush Kafka schedules after a roll (segments below the active one); with
        ``flush_by_time`` also Kafka's ``flushDirtyLogs`` rule: everything once flush.ms has
        passed since the last flush."""
        local = self._local
        if flush_by_time and now_ms - local.last_flush_ms >= self.config.flush_ms:
            local.flush(now_ms)
            local.last_flush_ms = now_ms
        elif local.rolled_unflushed():
            local.flush_rolled_segments()

    # ---- reading -------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, min_one_batch: bool = True,
             max_offset: int | None = None) -> ReadResult:
        """Whole batches from ``offset``; with ``max_offset`` none whose base offset is at
        or after it, nor the batch holding it (a consumer: the high watermark; read_committed:
        the last stable offset; a follower: None, up to the log end). The result's
        ``high_watermark`` is the log's (``high_watermark``)."""
        return self._local.read(offset, max_bytes, min_one_batch, max_offset,
                                self._managed_high_watermark)

    # ---- the high watermark under replication --------------------------------------------

    def manage_high_watermark(self, initial: int) -> None:
        """From now on the high watermark is explicit (replication decides it), starting
        at ``initial`` clamped to [log start, log end] (a checkpointed value, or the log
        end). Safe from any thread."""
        with self._hw_lock:
            view = self._local.view
            self._managed_high_watermark = min(max(initial, view.log_start_offset),
                                               view.log_end_offset)

    def update_high_watermark(self, offset: int) -> bool:
        """Move the managed high watermark forward to ``offset`` clamped to [log start, log
        end]; never backwards. Returns whether it moved. Safe from any thread; never waits
        for an append. Raises ValueError when the high watermark is not managed."""
        with self._hw_lock:
            current = self._managed_high_watermark
            if current is None:
                raise ValueError(f"{self.topic}-{self.partition}: high watermark not managed")
            view = self._local.view
            target = min(max(offset, view.log_start_offset), view.log_end_offset)
            if target <= current:
                return False
            self._managed_high_watermark = target
            return True

    def follow_log_end_offset(self) -> None:
        """Back to the single-node behaviour: the high watermark is the log end offset."""
        with self._hw_lock:
            self._managed_high_watermark = None

    @property
    def high_watermark_managed(self) -> bool:
        return self._managed_high_watermark is not None

    def _lower_high_watermark_locked(self, offset: int) -> None:
        """Truncation: a managed high watermark above ``offset`` comes down to it (held:
        the log's lock; taken here: the high-watermark lock)."""
        with self._hw_lock:
            managed = self._managed_high_watermark
            if managed is not None and managed > offset:
                self._managed_high_watermark = offset

    def collect_aborted_transactions(self, start_offset: int, upper_bound_offset: int
                                     ) -> list[AbortedTxn]:
        """The aborted transactions a read_committed fetch of [start_offset,
        upper_bound_offset) must announce (Kafka's ``collectAbortedTransactions``)."""
        return self._local.collect_aborted_transactions(start_offset, upper_bound_offset)

    def offset_for_timestamp(self, timestamp_ms: int) -> tuple[int, int] | None:
        return self._local.offset_for_timestamp(timestamp_ms)

    # ---- retention -----------------------------------------------------------------------

    def delete_records_before(self, offset: int) -> int:
        """DeleteRecords: advance the log start offset to ``offset`` (<= high watermark)."""
        with self._lock:
            local = self._local
            view = local.view
            high_watermark = self.high_watermark
            if offset < 0 or offset > high_watermark:
                raise OffsetOutOfRange(f"cannot delete records before {offset}: high watermark "
                                       f"is {high_watermark}")
            if offset > view.log_start_offset:
                local.publish_log_start(offset)
                self.leader_epoch_cache.truncate_from_start(offset)
            return local.view.log_start_offset

    def delete_old_segments(self, now_ms: int) -> int:
        """Retention: delete whole sealed segments past retention.ms / retention.bytes
        (cleanup.policy delete) or wholly below the log start offset. Returns the count."""
        with self._lock:
            return 0 if self._closed else self._delete_old_segments_locked(now_ms)

    def _delete_old_segments_locked(self, now_ms: int) -> int:
        deletable = self._deletable_prefix(now_ms)
        if deletable:
            first_kept = self._local.delete_oldest_segments(deletable, now_ms, "retention")
            self.producer_state.remove_snapshots(below_offset=first_kept)
            self.leader_epoch_cache.truncate_from_start(self._local.view.log_start_offset)
        return deletable

    def _deletable_prefix(self, now_ms: int) -> int:
        """How many of the oldest sealed segments retention deletes: never one whose
        records are not all below the high watermark (Kafka's ``deletableSegments``: a
        leader keeps what its followers may still need to copy; on a single node the high
        watermark is the log end, which every sealed segment lies below)."""
        segments, config = self._local.segments, self.config
        log_start = self._local.view.log_start_offset
        high_watermark = self.high_watermark
        count = 0
        excess_bytes = self.size_bytes - config.retention_bytes
        for index, segment in enumerate(segments[:-1]):
            if segments[index + 1].base_offset > high_watermark:
                break
            below_start = segments[index + 1].base_offset <= log_start
            by_time = config.delete_enabled and config.retention_ms >= 0 and \
                now_ms - segment.largest_timestamp_ms() > config.retention_ms
            by_size = config.delete_enabled and config.retention_bytes >= 0 and \
                excess_bytes - segment.size_bytes >= 0
            if not (below_start or by_time or by_size):
                break
            excess_bytes -= segment.size_bytes
            count += 1
        return count

    def remove_deleted_files(self, now_ms: int, force: bool = False) -> None:
        """Close and remove ``.deleted`` segments whose file.delete.delay.ms has passed.

        The files are unlinked after the log's lock is released: unlinking a large file can
        take tens of milliseconds (freeing its blocks, discards), and appends must not wait
        for it."""
        with self._lock:
            due = self._local.take_due_deletions(now_ms, force)
        self._local.remove_files(due)

    # ---- compaction ----------------------------------------------------------------------

    def replace_segments(self, old: list[LogSegment], cleaned_path: Path, now_ms: int,
                         index: IndexedBatches | None = None,
                         aborted_data_removed_below: int = -1) -> LogSegment:
        """Swap the cleaner's fsynced ``<base>.log.cleaned`` in for the consecutive sealed
        segments ``old`` (``LocalLog.replace_segments``) under the log's lock. Raises
        ``CleaningAborted`` (nothing changed) if ``old`` is no longer in the log."""
        with self._lock:
            return self._local.replace_segments(old, cleaned_path, now_ms, index,
                                                aborted_data_removed_below)

    # ---- cleaning guard ------------------------------------------------------------------

    def begin_cleaning(self) -> bool:
        """Take the cleaning lock for one cleaning; False (lock not held) if cleaning stopped
        for good (closed or deleted log). Blocks while another thread cleans this log."""
        self._cleaning_lock.acquire()
        if self._cleaning_stopped:
            self._cleaning_lock.release()
            return False
        return True

    def end_cleaning(self) -> None:
        self._cleaning_lock.release()

    def check_cleaning_aborted(self) -> None:
        """Raise ``CleaningAborted`` once ``stop_cleaning`` has been called."""
        if self._cleaning_stopped:
            raise CleaningAborted(f"{self.topic}-{self.partition}: log closed or deleted")

    def stop_cleaning(self) -> None:
        """No cleaning starts any more; wait for one in progress to stop (at its next chunk).
        Call without holding the log's lock."""
        self._cleaning_stopped = True
        with self._cleaning_lock:
            pass

    # ---- configuration and shutdown ------------------------------------------------------

    def update_config(self, config: LogConfig) -> None:
        with self._lock:
            self._roll_policy.reconfigure(config)
            self.config = config
            self._local.config = config
            self._apply_config(config)

    def close(self) -> None:
        """Flush everything, snapshot producer state at the log end, close all files."""
        self.stop_cleaning()
        with self._lock:
            if self._closed:
                return
            local = self._local
            local.active_segment.seal()
            local.flush(None, force=True)
            self.producer_state.take_snapshot(local.view.log_end_offset)
            self._closed = True
            local.close_files()

    def close_without_flush(self) -> None:
        """Release file descriptors (a deleted partition)."""
        self.stop_cleaning()
        with self._lock:
            self._closed = True
            self._local.close_files()
            self._local.pending_deletions = []
