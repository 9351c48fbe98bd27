"""A hand-written Fetch response encoder (versions 0-17) that never copies record data, and
its decoder for the follower's Fetch v12 (``decode_fetch_response``), which never copies it
either.

Kafka's FetchResponse body, per version (v12+ "flexible": compact arrays/strings/bytes as
unsigned varint length+1, and an empty tagged-field section after each struct)::

    throttle_time_ms int32                              (v1+)
    error_code int16, session_id int32                  (v7+)
    responses [ topic string (v0-12) | topic_id uuid (v13+)
                partitions [ partition_index int32, error_code int16, high_watermark int64,
                             last_stable_offset int64 (v4+), log_start_offset int64 (v5+),
                             aborted_transactions [producer_id int64, first_offset int64] (v4+),
                             preferred_read_replica int32 (v11+),
                             records nullable bytes ] ]

``encode_fetch_body`` returns the body as a list of parts: ``bytes`` for every field and the
storage ``FileSlice``s of each partition's records in place, so the connection writes the
bytes and sendfiles the slices in order; the record data never passes through Python.
``decode_fetch_response`` reads a whole v12 response frame (correlation id first) into
``FetchedPartition``s whose records are ``memoryview`` slices of the frame; a frame that does
not parse raises ``wire.MalformedFrame``.
Pure functions; thread-safe.
"""

from __future__ import annotations

import struct
import uuid
from dataclasses import dataclass, field
from typing import Any

from headrace.protocol.varint import encode_unsigned, read_unsigned
from headrace.protocol.wire import MalformedFrame, skip_tagged_fields

NO_PREFERRED_READ_REPLICA = -1
NO_ABORTED_TRANSACTIONS = 0
FIRST_FLEXIBLE_VERSION = 12
FIRST_TOPIC_ID_VERSION = 13

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
# A partition's fields up to its records, per version: index, error, high watermark, last
# stable offset (v4+), log start offset (v5+), aborted_transactions count (v4+: int32, or compact
# "length + 1" byte when flexible), preferred_read_replica (v11+), records length (int32;
# flexible versions append it as an unsigned varint after this fixed part).
_V0_PARTITION_HEAD = struct.Struct(">ihqi")
_V4_PARTITION_HEAD = struct.Struct(">ihqqii")
_V5_PARTITION_HEAD = struct.Struct(">ihqqqii")
_V11_PARTITION_HEAD = struct.Struct(">ihqqqiii")
_FLEXIBLE_PARTITION_HEAD = struct.Struct(">ihqqq")
_PREFERRED_READ_REPLICA = struct.Struct(">i")
_V4_FIXED_HEAD = struct.Struct(">ihqq")  # index, error, high watermark, last stable offset
_INT64 = struct.Struct(">q")
_ABORTED_TXN = struct.Struct(">qq")
_FLEXIBLE_ABORTED_TXN_END = b"\x00"  # each aborted transaction's empty tagged fields
_FLEXIBLE_RESPONSE_HEAD = struct.Struct(">ihi")  # throttle_time_ms, error_code, session_id
_FLEXIBLE_FETCHED_HEAD = struct.Struct(">ihqqq")  # as _FLEXIBLE_PARTITION_HEAD


@dataclass(slots=True)
class PartitionData:
    partition_index: int
    error_code: int = 0
    high_watermark: int = -1
    last_stable_offset: int = -1
    log_start_offset: int = -1
    slices: tuple[Any, ...] = ()  # storage FileSlices of whole batches, or bytes
    size_bytes: int = 0
    # (producer_id, first_offset) of each aborted transaction (read_committed, v4+)
    aborted_transactions: tuple[tuple[int, int], ...] = ()


@dataclass(slots=True)
class TopicData:
    name: str | None
    topic_id: uuid.UUID
    partitions: list[PartitionData] = field(default_factory=list)


def _array_length(count: int, flexible: bool) -> bytes:
    return encode_unsigned(count + 1) if flexible else _INT32.pack(count)


def _string(text: str, flexible: bool) -> bytes:
    encoded = text.encode()
    prefix = encode_unsigned(len(encoded) + 1) if flexible else _INT16.pack(len(encoded))
    return prefix + encoded


def _partition_head(partition: PartitionData, version: int) -> bytes:
    fields = (partition.partition_index, partition.error_code, partition.high_watermark,
              partition.last_stable_offset)
    size = partition.size_bytes
    aborted = partition.aborted_transactions
    if version >= FIRST_FLEXIBLE_VERSION:
        return b"".join((
            _FLEXIBLE_PARTITION_HEAD.pack(*fields, partition.log_start_offset),
            _aborted_transactions(aborted, flexible=True),
            _PREFERRED_READ_REPLICA.pack(NO_PREFERRED_READ_REPLICA), encode_unsigned(size + 1)))
    if aborted and version >= 4:  # the rare case: the fixed-layout structs do not fit
        return b"".join((
            _V4_FIXED_HEAD.pack(*fields),
            _INT64.pack(partition.log_start_offset) if version >= 5 else b"",
            _aborted_transactions(aborted, flexible=False),
            _PREFERRED_READ_REPLICA.pack(NO_PREFERRED_READ_REPLICA) if version >= 11 else b"",
            _INT32.pack(size)))
    if version >= 11:
        return _V11_PARTITION_HEAD.pack(*fields, partition.log_start_offset,
                                        NO_ABORTED_TRANSACTIONS, NO_PREFERRED_READ_REPLICA, size)
    if version >= 5:
        return _V5_PARTITION_HEAD.pack(*fields, partition.log_start_offset,
                                       NO_ABORTED_TRANSACTIONS, size)
    if version >= 4:
        return _V4_PARTITION_HEAD.pack(*fields, NO_ABORTED_TRANSACTIONS, size)
    return _V0_PARTITION_HEAD.pack(*fields[:3], size)


def _aborted_transactions(aborted: tuple[tuple[int, int], ...], flexible: bool) -> bytes:
    """The aborted_transactions array: its length, then producer_id and first_offset of
    each (flexible versions: compact length and a tagged-field byte per entry)."""
    end = _FLEXIBLE_ABORTED_TXN_END if flexible else b""
    return _array_length(len(aborted), flexible) + b"".join(
        _ABORTED_TXN.pack(producer_id, first_offset) + end
        for producer_id, first_offset in aborted)


def encode_fetch_body(
    version: int, error_code: int, session_id: int, topics: list[TopicData]
) -> tuple[list[Any], int]:
    """(parts, total size in bytes) of a Fetch response body of ``version``."""
    flexible = version >= FIRST_FLEXIBLE_VERSION
    pending = bytearray(_INT32.pack(0) if version >= 1 else b"")  # throttle_time_ms
    if version >= 7:
        pending += _INT16.pack(error_code) + _INT32.pack(session_id)
    pending += _array_length(len(topics), flexible)
    parts: list[Any] = []
    size = 0
    for topic in topics:
        if version >= FIRST_TOPIC_ID_VERSION:
            pending += topic.topic_id.bytes
        else:
            pending += _string(topic.name or "", flexible)
        pending += _array_length(len(topic.partitions), flexible)
        for partition in topic.partitions:
            pending += _partition_head(partition, version)
            if partition.slices:
                parts.append(bytes(pending))
                size += len(pending)
                pending = bytearray()
                parts.extend(partition.slices)
                size += partition.size_bytes
            if flexible:
                pending += b"\x00"  # partition tagged fields
        if flexible:
            pending += b"\x00"  # topic tagged fields
    if flexible:
        pending += b"\x00"  # response tagged fields
    parts.append(bytes(pending))
    size += len(pending)
    return parts, size


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a decoded Fetch response; ``records`` is a view of the frame."""

    topic: str
    partition_index: int
    error_code: int
    high_watermark: int
    log_start_offset: int
    records: memoryview


@dataclass(frozen=True, slots=True)
class FetchedResponse:
    error_code: int
    partitions: tuple[FetchedPartition, ...]


class _FlexibleReader:
    """Reads a flexible-version frame from a position; overruns raise MalformedFrame."""

    __slots__ = ("view", "position")

    def __init__(self, frame: bytes | bytearray | memoryview, position: int) -> None:
        self.view, self.position = memoryview(frame).toreadonly(), position

    def unpack(self, layout: struct.Struct) -> tuple:
        if self.position + layout.size > len(self.view):
            raise MalformedFrame("Fetch response ends inside a field")
        values = layout.unpack_from(self.view, self.position)
        self.position += layout.size
        return values

    def length(self) -> int:
        """A compact length (unsigned varint N+1; -1 for null)."""
        value, self.position = read_unsigned(self.view, self.position, error=MalformedFrame)
        return value - 1

    def span(self, size: int) -> memoryview:
        end = self.position + max(size, 0)
        if end > len(self.view):
            raise MalformedFrame("Fetch response ends inside a string or records")
        value, self.position = self.view[self.position:end], end
        return value

    def skip_tagged_fields(self) -> None:
        self.position = skip_tagged_fields(self.view, self.position)


def decode_fetch_response(frame: bytes | bytearray | memoryview) -> FetchedResponse:
    """A whole Fetch v12 response frame (correlation id, header tagged fields, body),
    records as views of ``frame``; aborted transactions are skipped (the follower reads
    uncommitted)."""
    reader = _FlexibleReader(frame, 4)
    reader.skip_tagged_fields()
    _, error_code, _ = reader.unpack(_FLEXIBLE_RESPONSE_HEAD)
    partitions = []
    for _ in range(reader.length()):
        topic = reader.span(reader.length())
        try:
            name = str(topic, "utf-8")
        except UnicodeDecodeError as error:
            raise MalformedFrame(f"Fetch response topic name: {error}") from None
        for _ in range(reader.length()):
            partitions.append(_fetched_partition(reader, name))
        reader.skip_tagged_fields()
    reader.skip_tagged_fields()
    return FetchedResponse(error_code, tuple(partitions))


def _fetched_partition(reader: _FlexibleReader, topic: str) -> FetchedPartition:
    index, error_code, high_watermark, _, log_start_offset = reader.unpack(
        _FLEXIBLE_FETCHED_HEAD)
    for _ in range(reader.length()):  # aborted transactions
        reader.unpack(_ABORTED_TXN)
        reader.skip_tagged_fields()
    reader.unpack(_PREFERRED_READ_REPLICA)
    records = reader.span(reader.length())
    reader.skip_tagged_fields()
    return FetchedPartition(topic, index, error_code, high_watermark, log_start_offset, records)
