"""Kafka v2 record-batch headers: parse, check and patch batches without decoding records.

Owns the fixed 61-byte header of a v2 record batch (magic 2) -- the unit the log stores,
indexes and serves byte-for-byte. Layout (big-endian)::

    0  base_offset int64         27 base_timestamp int64
    8  batch_length int32        35 max_timestamp int64
   12  partition_leader_epoch    43 producer_id int64
   16  magic int8                51 producer_epoch int16
   17  crc uint32 (CRC-32C of    53 base_sequence int32
       bytes 21..end)            57 records_count int32
   21  attributes int16          61 records...
   23  last_offset_delta int32

``batch_length`` counts the bytes after itself, so a batch occupies ``batch_length + 12``
bytes. Offsets and the leader epoch lie outside the CRC, so assigning offsets is a
single 8-byte write with no CRC work. Record-level decoding lives in ``records``.

Pure functions over bytes-like objects; thread-safe.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from headrace.errors import CorruptMessage
from headrace.protocol import _kernel

LOG_OVERHEAD_BYTES = 12  # base_offset + batch_length: the part not counted by batch_length
BATCH_HEADER_BYTES = 61
PARTITION_LEADER_EPOCH_OFFSET = 12
MAGIC_OFFSET = 16
CRC_OFFSET = 17
ATTRIBUTES_OFFSET = 21
LAST_OFFSET_DELTA_OFFSET = 23
MAX_TIMESTAMP_OFFSET = 35
PRODUCER_ID_OFFSET = 43
BASE_SEQUENCE_OFFSET = 53
CURRENT_MAGIC = 2

COMPRESSION_MASK = 0x07
TIMESTAMP_TYPE_BIT = 0x08  # 1 = LogAppendTime
TRANSACTIONAL_BIT = 0x10
CONTROL_BIT = 0x20
DELETE_HORIZON_BIT = 0x40  # KIP-534: base_timestamp holds the delete horizon

NO_PRODUCER_ID = -1
NO_TIMESTAMP = -1

_HEADER = struct.Struct(">qiibIhiqqqhii")
_OFFSET = struct.Struct(">q")


@dataclass(frozen=True, slots=True)
class BatchHeader:
    """The decoded fixed header of one v2 record batch."""

    base_offset: int
    batch_length: int
    partition_leader_epoch: int
    magic: int
    crc: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records_count: int

    @property
    def size_bytes(self) -> int:
        return self.batch_length + LOG_OVERHEAD_BYTES

    @property
    def last_offset(self) -> int:
        return self.base_offset + self.last_offset_delta

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK

    @property
    def is_log_append_time(self) -> bool:
        return bool(self.attributes & TIMESTAMP_TYPE_BIT)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_BIT)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_BIT)

    @property
    def has_delete_horizon(self) -> bool:
        return bool(self.attributes & DELETE_HORIZON_BIT)

    @property
    def last_sequence(self) -> int:
        if self.base_sequence < 0:
            return -1
        return (self.base_sequence + self.last_offset_delta) % (1 << 31)


def parse_header(buf: bytes | bytearray | memoryview, pos: int = 0) -> BatchHeader:
    """Decode the header at ``pos``; raises CorruptMessage if it is short or not magic 2."""
    if len(buf) - pos < BATCH_HEADER_BYTES:
        raise CorruptMessage(f"record batch header truncated at byte {pos}")
    header = BatchHeader(*_HEADER.unpack_from(buf, pos))
    if header.magic != CURRENT_MAGIC:
        raise CorruptMessage(f"record batch at byte {pos} has magic {header.magic}, expected 2")
    if header.batch_length < BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES:
        raise CorruptMessage(f"record batch at byte {pos} has length {header.batch_length}")
    return header


def peek_magic(buf: bytes | bytearray | memoryview, pos: int = 0) -> int:
    """The magic byte of the batch or legacy message at ``pos`` (-1 if too short)."""
    return buf[pos + MAGIC_OFFSET] if len(buf) - pos > MAGIC_OFFSET else -1


def compute_crc(buf: bytes | bytearray | memoryview, pos: int, size_bytes: int) -> int:
    """CRC-32C over the attributes..end part of the batch at ``pos``."""
    view = memoryview(buf)[pos + ATTRIBUTES_OFFSET : pos + size_bytes]
    return _kernel.crc32c(view)  # kernel.crc32c's own function: kernel.py imports this module


def crc_is_valid(buf: bytes | bytearray | memoryview, pos: int, header: BatchHeader) -> bool:
    return compute_crc(buf, pos, header.size_bytes) == header.crc


def set_base_offset(buf: bytearray | memoryview, pos: int, base_offset: int) -> None:
    """Assign offsets to the batch at ``pos``: one 8-byte write, the CRC is unaffected."""
    _OFFSET.pack_into(buf, pos, base_offset)


def set_max_timestamp(buf: bytearray | memoryview, pos: int, size_bytes: int,
                      timestamp_ms: int) -> None:
    """Write ``max_timestamp`` of the batch at ``pos``, clear the LogAppendTime bit and
    recompute the CRC (Kafka's ``setMaxTimestamp`` for CreateTime)."""
    attributes = struct.unpack_from(">h", buf, pos + ATTRIBUTES_OFFSET)[0]
    struct.pack_into(">h", buf, pos + ATTRIBUTES_OFFSET, attributes & ~TIMESTAMP_TYPE_BIT)
    struct.pack_into(">q", buf, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    struct.pack_into(">I", buf, pos + CRC_OFFSET, compute_crc(buf, pos, size_bytes))


def set_log_append_time(buf: bytearray | memoryview, pos: int, timestamp_ms: int) -> None:
    """Stamp LogAppendTime on the batch at ``pos``: set the attribute bit, write
    ``max_timestamp`` and recompute the CRC (both fields lie inside it)."""
    header = parse_header(buf, pos)
    struct.pack_into(">h", buf, pos + ATTRIBUTES_OFFSET, header.attributes | TIMESTAMP_TYPE_BIT)
    struct.pack_into(">q", buf, pos + MAX_TIMESTAMP_OFFSET, timestamp_ms)
    struct.pack_into(">I", buf, pos + CRC_OFFSET, compute_crc(buf, pos, header.size_bytes))
