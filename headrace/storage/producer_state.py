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
    version int16    1
    crc     uint32   CRC-32C of everything after this field
    count   int32    number of producers
    count x { producer_id int64, epoch int16, last_timestamp_ms int64, batches int8,
              batches x { first_seq int32, last_seq int32, first_offset int64, last_offset int64 } }

A snapshot that is short or fails its CRC is ignored (an older one, or a replay, is used).

Thread-safety: used only under the owning log's append lock.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from headrace.errors import InvalidProducerEpoch, OutOfOrderSequenceNumber
from headrace.protocol.batch import BatchHeader
from headrace.protocol.kernel import crc32c
from headrace.storage.fs import FileSystem, read_whole_file, write_file_atomically

BATCHES_RETAINED_PER_PRODUCER = 5
SNAPSHOT_SUFFIX = ".snapshot"
SNAPSHOT_MAGIC = b"HRPS"
SNAPSHOT_VERSION = 1
SEQUENCE_MODULUS = 1 << 31
_PREAMBLE = struct.Struct(">4shI")
_COUNT = struct.Struct(">i")
_PRODUCER = struct.Struct(">qhqb")
_BATCH = struct.Struct(">iiqq")


@dataclass(frozen=True, slots=True)
class BatchMetadata:
    first_seq: int
    last_seq: int
    first_offset: int
    last_offset: int


@dataclass(slots=True)
class ProducerEntry:
    epoch: int
    last_timestamp_ms: int = -1
    batches: deque[BatchMetadata] = field(
        default_factory=lambda: deque(maxlen=BATCHES_RETAINED_PER_PRODUCER))

    @property
    def last_seq(self) -> int:
        return self.batches[-1].last_seq if self.batches else -1


def snapshot_file_name(offset: int) -> str:
    return f"{offset:020d}{SNAPSHOT_SUFFIX}"


class ProducerStateManager:
    """Producer id -> epoch and recent batches, with snapshot files."""

    def __init__(self, fs: FileSystem, directory: Path) -> None:
        self.fs = fs
        self.directory = directory
        self.producers: dict[int, ProducerEntry] = {}

    def check(self, header: BatchHeader) -> BatchMetadata | None:
        """Validate an incoming batch; return the original metadata if it is a duplicate."""
        entry = self.producers.get(header.producer_id)
        if entry is None or header.base_sequence < 0:
            return None
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

    def update(self, header: BatchHeader, base_offset: int) -> None:
        """Record an appended batch (its assigned ``base_offset``)."""
        entry = self.producers.get(header.producer_id)
        if entry is None or header.producer_epoch != entry.epoch:
            entry = ProducerEntry(header.producer_epoch)
            self.producers[header.producer_id] = entry
        entry.last_timestamp_ms = header.max_timestamp
        if header.base_sequence >= 0:
            entry.batches.append(BatchMetadata(
                header.base_sequence, header.last_sequence, base_offset,
                base_offset + header.last_offset_delta))

    def replay(self, header: BatchHeader) -> None:
        """Apply a batch read back from the log (recovery), without validation."""
        if header.producer_id >= 0 and not header.is_control:
            self.update(header, header.base_offset)

    # ---- snapshots -----------------------------------------------------------------------

    def encode(self) -> bytes:
        parts = [_COUNT.pack(len(self.producers))]
        for producer_id, entry in sorted(self.producers.items()):
            parts.append(_PRODUCER.pack(producer_id, entry.epoch, entry.last_timestamp_ms,
                                        len(entry.batches)))
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
        if magic != SNAPSHOT_MAGIC or version != SNAPSHOT_VERSION or crc32c(body) != crc:
            return None
        producers: dict[int, ProducerEntry] = {}
        (count,), pos = _COUNT.unpack_from(body), _COUNT.size
        for _ in range(count):
            producer_id, epoch, last_timestamp_ms, batches = _PRODUCER.unpack_from(body, pos)
            pos += _PRODUCER.size
            entry = ProducerEntry(epoch, last_timestamp_ms)
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
                self.producers = producers
                return offset
        self.producers = {}
        return -1

    def remove_snapshots(self, below_offset: int | None = None, above_offset: int | None = None
                         ) -> None:
        """Delete snapshots older than ``below_offset`` (keeping the newest of them) or newer
        than ``above_offset``."""
        offsets = self.snapshot_offsets()
        older = [o for o in offsets if below_offset is not None and o < below_offset]
        doomed = older[:-1] + [o for o in offsets if above_offset is not None and o > above_offset]
        for offset in doomed:
            self.fs.remove(self.directory / snapshot_file_name(offset))
