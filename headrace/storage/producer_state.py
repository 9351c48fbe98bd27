"""Idempotent-producer state of one partition (Kafka's ProducerStateManager, simplified).

Owns, per producer id: the epoch and the metadata of its last ``BATCHES_RETAINED_PER_PRODUCER``
(5) batches -- (first_seq, last_seq, first_offset, last_offset) -- and the rules Kafka applies
on append:

* a batch equal (same first and last sequence) to one of the retained five is a duplicate:
  answered with the original offsets, nothing written;
* an epoch lower than the known one -> InvalidProducerEpoch;
* a higher (new) epoch must start at sequence 0 -> else OutOfOrderSequenceNumber;
* otherwise first_seq must follow the last sequence (wrapping at 2**31) -> else
  OutOfOrderSequenceNumber; an unknown producer may start anywhere (Kafka 2.x+ behaviour for
  producers whose state expired).

Snapshot files ``<20-digit offset>.snapshot`` in the partition directory hold the state of
every producer as of that offset (all batches below it applied). Format, big-endian::

    magic   4 bytes  b"HRPS"
    version int16    2
    crc     uint32   CRC-32C of everything after this field
    count   int32    number of producers
    count x { producer_id int64, epoch int16, last_timestamp_ms int64,
              coordinator_epoch int32, current_txn_first_offset int64 (-1: none),
              batches int8,
              batches x { first_seq int32, last_seq int32, first_offset int64, last_offset int64 } }

(Version 1, written before transactions, lacks the two transaction fields and is still read.)
A snapshot that is short or fails its CRC is ignored (an older one, or a replay, is used).

Transactions (Kafka's ProducerAppendInfo): a transactional data batch of a producer with no
ongoing transaction begins one at its base offset (``ongoing_txns``, whose earliest first
offset bounds the last stable offset); a marker (``check_marker``, then ``complete_txn``)
ends it, fenced by producer epoch and coordinator epoch. A marker is written even when the
producer has no ongoing transaction (as Kafka does: retried WriteTxnMarkers), and then
completes nothing.

Thread-safety: used only under the owning log's append lock, except
``first_unstable_offset`` (any thread).
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from headrace.errors import (
    InvalidProducerEpoch,
    InvalidTxnState,
    OutOfOrderSequenceNumber,
    TransactionCoordinatorFenced,
)
from headrace.protocol.batch import BatchHeader
from headrace.protocol.kernel import crc32c
from headrace.storage.fs import FileSystem, read_whole_file, write_file_atomically
from headrace.storage.txn_index import AbortedTxn

BATCHES_RETAINED_PER_PRODUCER = 5
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_MAGIC = b"HRPS"
SNAPSHOT_VERSION = 2
SNAPSHOT_VERSION_WITHOUT_TXNS = 1
SEQUENCE_MODULUS = 1 << 31
NO_COORDINATOR_EPOCH = -1
NO_TXN = -1
_PREAMBLE = struct.Struct(">4shI")
_COUNT = struct.Struct(">i")
_PRODUCER = struct.Struct(">qhqiqb")
_PRODUCER_V1 = struct.Struct(">qhqb")
_BATCH = struct.Struct(">iiqq")


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(frozen=True, slots=True)
class CompletedTxn:
    """A transaction ended by a marker at ``last_offset`` (Kafka's CompletedTxn): the first
    offset of its data and whether it was aborted."""

    producer_id: int
    first_offset: int
    last_offset: int
    aborted: bool


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    last_timestamp_ms: int = -1
    coordinator_epoch: int = NO_COORDINATOR_EPOCH
    current_txn_first_offset: int = NO_TXN
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=BATCHES_RETAINED_PER_PRODUCER))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


@dataclass(frozen=True, slots=True)
class ActiveProducer:
    """One producer's state as DescribeProducers reports it (Kafka's ``activeProducers``):
    -1 for a last sequence, timestamp or coordinator epoch not known, and for no ongoing
    transaction."""

    producer_id: int
    producer_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    coordinator_epoch: int
    current_txn_start_offset: int


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


class ProducerStateManager:
    """Producer id -> epoch and recent batches, with snapshot files."""

    def __init__(self, fs: FileSystem, directory: Path) -> None:
        self.fs = fs
        self.directory = directory
        self.producers: dict[int, ProducerEntry] = {}
        # producer id -> first offset of its ongoing transaction (Kafka's ongoingTxns)
        self.ongoing_txns: dict[int, int] = {}
        # their minimum, published for readers on other threads (one attribute read)
        self._first_unstable_offset: int | None = None

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """Validate an incoming data batch; return the original metadata if it is a
        duplicate. A non-transactional batch from a producer with an ongoing transaction
        raises InvalidTxnState (Kafka's ProducerAppendInfo.appendDataBatch)."""
        entry = self.producers.get(header.producer_id)
        if entry is None or header.base_sequence < 0:
            return None
        duplicate = self._check_sequence(entry, header)
        if duplicate is None and entry.current_txn_first_offset != NO_TXN \
                and not header.is_transactional:
            raise InvalidTxnState(
                f"producer {header.producer_id} sent a non-transactional batch while its "
                f"transaction from offset {entry.current_txn_first_offset} is ongoing")
        return duplicate

    @staticmethod
    def _check_sequence(entry: ProducerEntry, header: BatchHeader) -> BatchMetadata | None:
        epoch = header.producer_epoch
        if epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"producer {header.producer_id} epoch {epoch} is older than {entry.epoch}")
        if epoch > entry.epoch:
            if header.base_sequence != 0:
                raise OutOfOrderSequenceNumber(
                    f"producer {header.producer_id} new epoch {epoch} starts at sequence "
                    f"{header.base_sequence}, expected 0")
            return None
        for batch in entry.batches:
            if batch.first_seq == header.base_sequence and batch.last_seq == header.last_sequence:
                return batch
        expected = (entry.last_seq + 1) % SEQUENCE_MODULUS
        if entry.batches and header.base_sequence != expected:
            raise OutOfOrderSequenceNumber(
                f"producer {header.producer_id} sent sequence {header.base_sequence}, "
                f"expected {expected}")
        return None

    def _entry_at_epoch(self, producer_id: int, epoch: int) -> ProducerEntry:
        """The producer's entry, moved to ``epoch`` (its batches dropped when the epoch
        changes; an ongoing transaction and the coordinator epoch are kept, as Kafka's
        ``maybeUpdateProducerEpoch``)."""
        entry = self.producers.get(producer_id)
        if entry is None:
            entry = self.producers[producer_id] = ProducerEntry(epoch)
        elif entry.epoch != epoch:
            entry.epoch = epoch
            entry.batches.clear()
        return entry

    def update(self, header: BatchHeader, base_offset: int) -> None:
        """Record an appended data batch (its assigned ``base_offset``); a transactional
        batch of a producer with no ongoing transaction begins one at ``base_offset``."""
        entry = self._entry_at_epoch(header.producer_id, header.producer_epoch)
        entry.last_timestamp_ms = header.max_timestamp
        if header.base_sequence >= 0:
            entry.batches.append(BatchMetadata(
                header.base_sequence, header.last_sequence, base_offset,
                base_offset + header.last_offset_delta))
        if header.is_transactional and entry.current_txn_first_offset == NO_TXN:
            entry.current_txn_first_offset = base_offset
            self.ongoing_txns[header.producer_id] = base_offset
            if self._first_unstable_offset is None:
                self._first_unstable_offset = base_offset

    def check_marker(self, producer_id: int, producer_epoch: int, coordinator_epoch: int
                     ) -> None:
        """Raise as Kafka's ``appendEndTxnMarker`` does for a marker from the coordinator:
        InvalidProducerEpoch for an epoch older than the producer's, TransactionCoordinatorFenced
        for a coordinator epoch older than the last marker's."""
        entry = self.producers.get(producer_id)
        if entry is None:
            return
        if producer_epoch < entry.epoch:
            raise InvalidProducerEpoch(
                f"marker for producer {producer_id} has epoch {producer_epoch}, older than "
                f"{entry.epoch}")
        if coordinator_epoch < entry.coordinator_epoch:
            raise TransactionCoordinatorFenced(
                f"marker for producer {producer_id} has coordinator epoch {coordinator_epoch} "
                f"(zombie), {entry.coordinator_epoch} (current)")

    def complete_txn(self, producer_id: int, producer_epoch: int, coordinator_epoch: int,
                     commit: bool, offset: int, timestamp_ms: int) -> CompletedTxn | None:
        """Apply a marker written at ``offset``: the producer's ongoing transaction ends
        (None when it had none: such a marker changes no stable offset and no index)."""
        entry = self._entry_at_epoch(producer_id, producer_epoch)
        first_offset = entry.current_txn_first_offset
        entry.coordinator_epoch = coordinator_epoch
        entry.last_timestamp_ms = timestamp_ms
        entry.current_txn_first_offset = NO_TXN
        if self.ongoing_txns.pop(producer_id, None) is not None:
            self._first_unstable_offset = min(self.ongoing_txns.values(), default=None)
        if first_offset == NO_TXN:
            return None
        return CompletedTxn(producer_id, first_offset, offset, not commit)

    def active_producers(self) -> tuple[ActiveProducer, ...]:
        """Every producer's state, by producer id (call under the log's lock)."""
        return tuple(ActiveProducer(producer_id, entry.epoch, entry.last_seq,
                                    entry.last_timestamp_ms, entry.coordinator_epoch,
                                    entry.current_txn_first_offset)
                     for producer_id, entry in sorted(self.producers.items()))

    def first_unstable_offset(self) -> int | None:
        """The first offset of the earliest ongoing transaction; None when there is none.
        Safe to call from any thread."""
        return self._first_unstable_offset

    def last_stable_offset_after(self, completed: CompletedTxn) -> int:
        """The stable offset once ``completed`` ends (Kafka's ``lastStableOffset``): the
        first offset of the earliest other ongoing transaction, else the marker's offset+1."""
        others = [first for producer_id, first in self.ongoing_txns.items()
                  if producer_id != completed.producer_id]
        return min(others, default=completed.last_offset + 1)

    def aborted_entry(self, completed: CompletedTxn) -> AbortedTxn:
        """The aborted-transaction index entry of ``completed`` (an abort)."""
        return AbortedTxn(completed.producer_id, completed.first_offset, completed.last_offset,
                          self.last_stable_offset_after(completed))

    def replay(self, header: BatchHeader, marker: tuple[bool, int] | None = None
               ) -> CompletedTxn | None:
        """Apply a batch read back from the log (recovery), without validation; a control
        batch with its ``marker`` (commit, coordinator_epoch): the transaction it ends."""
        if header.producer_id < 0:
            return None
        if not header.is_control:
            self.update(header, header.base_offset)
        elif marker is not None:
            commit, coordinator_epoch = marker
            return self.complete_txn(header.producer_id, header.producer_epoch,
                                     coordinator_epoch, commit, header.base_offset,
                                     header.max_timestamp)
        return None

    # ---- snapshots -----------------------------------------------------------------------

    def encode(self) -> bytes:
        parts = [_COUNT.pack(len(self.producers))]
        for producer_id, entry in sorted(self.producers.items()):
            parts.append(_PRODUCER.pack(producer_id, entry.epoch, entry.last_timestamp_ms,
                                        entry.coordinator_epoch,
                                        entry.current_txn_first_offset, len(entry.batches)))
            parts.extend(_BATCH.pack(b.first_seq, b.last_seq, b.first_offset, b.last_offset)
                         for b in entry.batches)
        body = b"".join(parts)
        return _PREAMBLE.pack(SNAPSHOT_MAGIC, SNAPSHOT_VERSION, crc32c(body)) + body

    @staticmethod
    def decode(raw: bytes) -> dict[int, ProducerEntry] | None:
        """The producers in a snapshot, or None if it is damaged."""
        if len(raw) < _PREAMBLE.size + _COUNT.size:
            return None
        magic, version, crc = _PREAMBLE.unpack_from(raw)
        body = raw[_PREAMBLE.size:]
        if magic != SNAPSHOT_MAGIC or crc32c(body) != crc or \
                version not in (SNAPSHOT_VERSION, SNAPSHOT_VERSION_WITHOUT_TXNS):
            return None
        producers: dict[int, ProducerEntry] = {}
        (count,), pos = _COUNT.unpack_from(body), _COUNT.size
        for _ in range(count):
            if version == SNAPSHOT_VERSION:
                producer_id, epoch, last_timestamp_ms, coordinator_epoch, txn_first_offset, \
                    batches = _PRODUCER.unpack_from(body, pos)
                pos += _PRODUCER.size
            else:
                producer_id, epoch, last_timestamp_ms, batches = _PRODUCER_V1.unpack_from(body, pos)
                coordinator_epoch, txn_first_offset = NO_COORDINATOR_EPOCH, NO_TXN
                pos += _PRODUCER_V1.size
            entry = ProducerEntry(epoch, last_timestamp_ms, coordinator_epoch, txn_first_offset)
            for _ in range(batches):
                entry.batches.append(BatchMetadata(*_BATCH.unpack_from(body, pos)))
                pos += _BATCH.size
            producers[producer_id] = entry
        return producers

    def take_snapshot(self, offset: int) -> None:
        path = self.directory / snapshot_file_name(offset)
        write_file_atomically(self.fs, path, self.encode())

    def snapshot_offsets(self) -> list[int]:
        offsets = []
        for name in self.fs.listdir(self.directory):
            stem = name[: -len(SNAPSHOT_SUFFIX)]
            if name.endswith(SNAPSHOT_SUFFIX) and stem.isdigit():
                offsets.append(int(stem))
        return sorted(offsets)

    def load_latest_snapshot(self, max_offset: int) -> int:
        """Load the newest intact snapshot at or below ``max_offset``; return its offset, or
        -1 (empty state) when there is none."""
        for offset in reversed(self.snapshot_offsets()):
            if offset > max_offset:
                continue
            producers = self.decode(read_whole_file(self.fs, self.directory /
                                                    snapshot_file_name(offset)))
            if producers is not None:
                self._set_producers(producers)
                return offset
        self._set_producers({})
        return -1

    def _set_producers(self, producers: dict[int, ProducerEntry]) -> None:
        self.producers = producers
        self.ongoing_txns = {producer_id: entry.current_txn_first_offset
                             for producer_id, entry in producers.items()
                             if entry.current_txn_first_offset != NO_TXN}
        self._first_unstable_offset = min(self.ongoing_txns.values(), default=None)

    def remove_snapshots(self, below_offset: int | None = None, above_offset: int | None = None
                         ) -> None:
        """Delete snapshots older than ``below_offset`` (keeping the newest of them) or newer
        than ``above_offset``."""
        offsets = self.snapshot_offsets()
        older = [o for o in offsets if below_offset is not None and o < below_offset]
        doomed = older[:-1] + [o for o in offsets if above_offset is not None and o > above_offset]
        for offset in doomed:
            self.fs.remove(self.directory / snapshot_file_name(offset))
