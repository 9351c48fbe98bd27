"""The Spark sink's compiled encoder's Python face (``_encoder.c``): Kafka v2 record batches
from Arrow-layout columns, and the Java producer's default partitioner.

Owns ``partition_rows`` (Kafka's ``BuiltInPartitioner`` without adaptive statistics:
``murmur2`` of the key, or the sticky partition) and ``encode_batches`` (whole v2 batches of
the selected rows, split at ``batch.size``, the producer's sequence carried on; a codec's
records compressed here, in Python, and the batch sealed with
``protocol.kernel.seal_compressed``), and the column views the C reads (``BinaryColumn``, ``HeaderColumn``).
The C builds on the protocol layer's ``kernel_common.h`` and ``crc32c.h``.

Thread-safety: pure functions; the C loops release the GIL over the column buffers a call
holds (at most ``HELD_VIEWS_MAX``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from headrace.protocol.batch import TRANSACTIONAL_BIT
from headrace.protocol.compression import NONE
from headrace.protocol.kernel import BufferLike, seal_compressed
from headrace.spark import _encoder

# The most buffers one encoder call holds while its GIL is released (a test build shrinks it).
HELD_VIEWS_MAX: int = _encoder.HELD_VIEWS_MAX
# The CRC-32C variant the batches are sealed with, as ``protocol.kernel.CRC32C_VARIANT``.
CRC32C_VARIANT: str = _encoder.CRC32C_VARIANT

NO_PRODUCER_ID = -1
SEQUENCE_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class BinaryColumn:
    """An Arrow-layout binary column: row i is ``data[offsets[i]:offsets[i+1]]``, null where
    ``valid`` (if given) is False."""

    offsets: np.ndarray  # int32[n+1]
    data: BufferLike
    valid: np.ndarray | None = None  # bool[n]; None: no nulls

    def _spec(self) -> tuple:
        valid = None if self.valid is None else np.ascontiguousarray(self.valid, np.bool_)
        return (np.ascontiguousarray(self.offsets, np.int32), self.data, valid)


@dataclass(frozen=True, slots=True)
class HeaderColumn:
    """Arrow ``list<struct<key: string, value: binary>>`` buffers: row i's headers are the
    entries ``[list_offsets[i], list_offsets[i+1])`` of ``keys`` (no nulls) and ``values``;
    a null list (``list_valid`` False) has no headers."""

    list_offsets: np.ndarray  # int32[n+1]
    list_valid: np.ndarray | None
    keys: BinaryColumn
    values: BinaryColumn

    def _spec(self) -> tuple:
        valid = (None if self.list_valid is None
                 else np.ascontiguousarray(self.list_valid, np.bool_))
        return (np.ascontiguousarray(self.list_offsets, np.int32), valid, self.keys._spec(),
                self.values._spec(), len(self.keys.offsets) - 1)


@dataclass(frozen=True, slots=True)
class ProducerFields:
    """The idempotent producer's batch fields; ``producer_id`` -1: a plain producer (base
    sequence -1 is written). ``transactional`` sets the batches' transactional attribute
    bit: they belong to the producer's ongoing transaction."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = -1
    base_sequence: int = 0
    transactional: bool = False


@dataclass(frozen=True, slots=True)
class StickyPartition:
    """Where the partitioner puts keyless rows: ``partition`` until ``bytes_in_batch`` reach
    the batch size, then the next partition in turn."""

    partition: int
    bytes_in_batch: int = 0


@dataclass(frozen=True, slots=True)
class EncodedBatches:
    """Whole v2 record batches, back to back; ``bounds[i]`` is batch i's (start, end,
    record count) in ``data``."""

    data: BufferLike
    bounds: np.ndarray  # int64[k, 3]

    def batches(self) -> list[tuple[memoryview, int]]:
        """(bytes, record count) of each batch."""
        view = memoryview(self.data)
        return [(view[start:end], records) for start, end, records in self.bounds.tolist()]


def increment_sequence(sequence: int, increment: int) -> int:
    """Kafka's DefaultRecordBatch.incrementSequence: producer sequences wrap to 0 after
    2**31 - 1."""
    if sequence > SEQUENCE_MAX - increment:
        return increment - (SEQUENCE_MAX - sequence) - 1
    return sequence + increment


def murmur2(data: BufferLike) -> int:
    """Kafka's ``Utils.murmur2`` of ``data`` as a signed 32-bit int."""
    return _encoder.murmur2(data)


def partition_rows(rows: int, keys: BinaryColumn | None, values: BinaryColumn,
                   explicit_partitions: np.ndarray | None, partition_count: int,
                   sticky: StickyPartition, batch_bytes: int
                   ) -> tuple[np.ndarray, StickyPartition]:
    """The Java producer's default partition of each row (``BuiltInPartitioner`` without
    adaptive statistics): an explicit partition (>= 0 in ``explicit_partitions``) as given;
    a keyed row ``(murmur2(key) & 0x7fffffff) % partition_count``; a keyless row the
    sticky partition, which moves to the next partition once its rows' value bytes reach
    ``batch_bytes``. Returns the partitions (int32[rows]) and the sticky state to carry on
    with. An explicit partition >= ``partition_count`` raises ValueError."""
    explicit = (None if explicit_partitions is None
                else np.ascontiguousarray(explicit_partitions, np.int32))
    raw, partition, bytes_in_batch = _encoder.partition_rows(
        rows, None if keys is None else keys._spec(), values._spec(), explicit,
        partition_count, sticky.partition, sticky.bytes_in_batch, batch_bytes)
    return np.frombuffer(raw, np.int32), StickyPartition(partition, bytes_in_batch)


def encode_batches(rows: int, keys: BinaryColumn | None, values: BinaryColumn | None,
                   headers: HeaderColumn | None, extra_header: tuple[bytes, bytes] | None,
                   selection: np.ndarray, timestamp_ms: int, producer: ProducerFields,
                   codec: int, max_batch_bytes: int) -> EncodedBatches:
    """Kafka v2 record batches (magic 2, CreateTime ``timestamp_ms`` for every record, base
    offset 0, partition leader epoch -1) of the rows ``selection`` (int32 row indices, in
    order) of a ``rows``-row table: key, value (None: a null column), the row's headers
    followed by ``extra_header`` if given. A new batch starts when the next record would
    take the batch past ``max_batch_bytes`` (a batch holds at least one record);
    successive batches continue the producer's sequence. With a codec other than NONE the
    records section of each batch is compressed here (the limit applies before
    compression) and the batch's length and CRC-32C sealed."""
    selected = np.ascontiguousarray(selection, np.int32)
    data, bounds = _encoder.encode_batches(
        rows, None if keys is None else keys._spec(),
        None if values is None else values._spec(),
        None if headers is None else headers._spec(), extra_header, selected, timestamp_ms,
        (producer.producer_id, producer.producer_epoch, producer.base_sequence),
        codec | (TRANSACTIONAL_BIT if producer.transactional else 0), max_batch_bytes)
    encoded = EncodedBatches(data, np.frombuffer(bounds, np.int64).reshape(-1, 3))
    if codec == NONE:
        return encoded
    return _compress_batches(encoded, codec)


def _compress_batches(encoded: EncodedBatches, codec: int) -> EncodedBatches:
    sealed = [seal_compressed(batch, codec) for batch, _ in encoded.batches()]
    ends = np.cumsum([len(batch) for batch in sealed], dtype=np.int64)
    bounds = np.stack([ends - [len(batch) for batch in sealed], ends,
                       encoded.bounds[:, 2]], axis=1) if sealed else encoded.bounds
    return EncodedBatches(b"".join(sealed), np.ascontiguousarray(bounds, np.int64))
