"""Kafka's end-transaction markers: the control batches a transaction coordinator writes to
each partition of a transaction when it commits or aborts it.

Owns the encoding of a marker batch and the decoding of a marker record. A marker is a v2
batch with the transactional and control attribute bits, the producer's id and epoch, no
sequence (-1), and one record whose (big-endian) key and value are::

    key   { version int16 = 0, type int16: 0 abort, 1 commit }      (Kafka's ControlRecordType)
    value { version int16 = 0, coordinator_epoch int32 }            (Kafka's EndTransactionMarker)

Other control record types (Kafka's leader-change and snapshot records) are not markers.
Pure functions; thread-safe.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from headrace.errors import CorruptMessage
from headrace.protocol.records import build_batch, decode_batch

ABORT_MARKER_TYPE = 0
COMMIT_MARKER_TYPE = 1
CONTROL_KEY_VERSION = 0
END_TXN_MARKER_VALUE_VERSION = 0
NO_SEQUENCE = -1

_CONTROL_KEY = struct.Struct(">hh")
_MARKER_VALUE = struct.Struct(">hi")


@dataclass(frozen=True, slots=True)
class EndTxnMarker:
    commit: bool
    coordinator_epoch: int


def build_end_txn_marker_batch(producer_id: int, producer_epoch: int, commit: bool,
                               coordinator_epoch: int, timestamp_ms: int,
                               base_offset: int = 0) -> bytes:
    """One marker batch (Kafka's ``MemoryRecords.withEndTransactionMarker``)."""
    key = _CONTROL_KEY.pack(CONTROL_KEY_VERSION,
                            COMMIT_MARKER_TYPE if commit else ABORT_MARKER_TYPE)
    value = _MARKER_VALUE.pack(END_TXN_MARKER_VALUE_VERSION, coordinator_epoch)
    return build_batch([(key, value, (), timestamp_ms)], base_offset=base_offset,
                       producer_id=producer_id, producer_epoch=producer_epoch,
                       base_sequence=NO_SEQUENCE, transactional=True, control=True)


def parse_end_txn_marker(key: bytes | None, value: bytes | None) -> EndTxnMarker | None:
    """The marker a control record holds; None for another control record type. Raises
    CorruptMessage for a marker whose key or value is short."""
    if key is None or len(key) < _CONTROL_KEY.size:
        raise CorruptMessage("control record key shorter than 4 bytes")
    _, marker_type = _CONTROL_KEY.unpack_from(key)
    if marker_type not in (ABORT_MARKER_TYPE, COMMIT_MARKER_TYPE):
        return None
    if value is None or len(value) < _MARKER_VALUE.size:
        raise CorruptMessage("end transaction marker value shorter than 6 bytes")
    _, coordinator_epoch = _MARKER_VALUE.unpack_from(value)
    return EndTxnMarker(marker_type == COMMIT_MARKER_TYPE, coordinator_epoch)


def marker_of_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> EndTxnMarker | None:
    """The marker of the control batch at ``pos`` (its first record); None if it holds
    none."""
    batch = decode_batch(buf, pos)
    if not batch.records:
        return None
    record = batch.records[0]
    return parse_end_txn_marker(record.key, record.value)
