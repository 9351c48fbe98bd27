"""The sink's own write path: Spark's Arrow batches to Kafka v2 record batches, no Python per row.

Owns: ``WireTaskWriter``, which turns each Arrow record batch of a Spark task into column
views (``headrace.spark.encoder.BinaryColumn`` / ``HeaderColumn`` over the Arrow buffers
themselves: strings are cast to binary without a copy), partitions its rows with the
compiled encoder (the Java producer's default partitioner, ``encoder.partition_rows``), encodes
each partition's rows into whole v2 batches in C (``encoder.encode_batches``: batch.size
bytes at most, the task's producer id, epoch and sequences, the write time as every
record's CreateTime, compression.type) and hands them to ``IdempotentProducer``
(``headrace.spark.wire_produce``), which sends and retries them.

Rows go to ``topic`` (the option, else the row's column: a batch mixing topics is split per
topic with one vectorised filter each). A null topic, a partition the topic does not have, a
null header entry or header key raise before anything of that Arrow batch is sent.

Not thread-safe: one writer per Spark task (``write`` then ``finish``, ``close`` always).
"""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from headrace.errors import InvalidRecord, UnknownTopicOrPartition
from headrace.spark.encoder import (
    BinaryColumn,
    HeaderColumn,
    ProducerFields,
    StickyPartition,
    encode_batches,
    partition_rows,
)
from headrace.spark.wire_produce import IdempotentProducer, ProduceClientConfig
from headrace.storage.clock import Clock, SystemClock

UNASSIGNED_PARTITION = -1
_INT32_BYTES = 4


def binary_column(array: pa.Array) -> BinaryColumn:
    """A view of a binary (or string / large / null-typed) Arrow array's buffers."""
    if not pa.types.is_binary(array.type):
        array = array.cast(pa.binary())
    _, offsets, data = array.buffers()
    offsets_view = np.frombuffer(offsets, np.int32, count=len(array) + 1,
                                 offset=array.offset * _INT32_BYTES)
    valid = None
    if array.null_count:
        valid = array.is_valid().to_numpy(zero_copy_only=False)
    return BinaryColumn(offsets_view, data if data is not None else b"", valid)


def header_column(array: pa.Array) -> HeaderColumn:
    """A view of an ``array<struct<key: string, value: binary>>`` column's buffers."""
    if pa.types.is_large_list(array.type):
        array = array.cast(pa.list_(array.type.value_type))
    entries = array.values
    if entries.null_count:
        raise InvalidRecord("a header entry is null: every header needs a key")
    keys, values = entries.field(0), entries.field(1)
    if keys.null_count:
        raise InvalidRecord("a header key is null: Kafka header keys are strings")
    list_valid = None
    if array.null_count:
        list_valid = array.is_valid().to_numpy(zero_copy_only=False)
    return HeaderColumn(array.offsets.to_numpy(), list_valid, binary_column(keys),
                        binary_column(values))


def _optional_column(batch: pa.RecordBatch, name: str) -> pa.Array | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index)


class WireTaskWriter:
    """One Spark task's records, sent through one idempotent producer (its own, or the
    given one: a ``TransactionalProducer`` makes them one transaction's batches)."""

    def __init__(self, config: ProduceClientConfig, topic: str | None,
                 extra_header: tuple[bytes, bytes] | None, clock: Clock | None = None,
                 producer: IdempotentProducer | None = None) -> None:
        self._config = config
        self._topic = topic
        self._extra_header = extra_header
        self._clock = clock or SystemClock()
        self._producer = producer or IdempotentProducer(config, self._clock)
        self._sticky: dict[str, StickyPartition] = {}

    def write(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        for topic, rows in self._split_by_topic(batch):
            self._write_topic(topic, rows)

    def finish(self) -> int:
        """Wait for every acknowledgement; the number of records written."""
        return self._producer.flush()

    def close(self) -> None:
        self._producer.close()

    def _split_by_topic(self, batch: pa.RecordBatch) -> list[tuple[str, pa.RecordBatch]]:
        if self._topic:
            return [(self._topic, batch)]
        topics = batch.column(batch.schema.get_field_index("topic"))
        if topics.null_count:
            raise InvalidRecord("null topic in a row and no 'topic' option")
        names = pc.unique(topics).to_pylist()
        if len(names) == 1:
            return [(names[0], batch)]
        return [(name, batch.filter(pc.equal(topics, name))) for name in names]

    def _write_topic(self, topic: str, batch: pa.RecordBatch) -> None:
        count = batch.num_rows
        key_array = _optional_column(batch, "key")
        keys = None if key_array is None else binary_column(key_array)
        values = binary_column(batch.column(batch.schema.get_field_index("value")))
        header_array = _optional_column(batch, "headers")
        headers = None if header_array is None else header_column(header_array)
        partitions = self._partitions(topic, batch, keys, values)
        order = np.argsort(partitions, kind="stable").astype(np.int32)
        counts = np.bincount(partitions, minlength=self._producer.partition_count(topic))
        now_ms = self._clock.now_ms()
        start = 0
        for partition, rows in enumerate(counts.tolist()):
            if not rows:
                continue
            selection = order[start:start + rows]
            start += rows
            producer = ProducerFields(
                self._producer.producer_id, self._producer.producer_epoch,
                self._producer.reserve_sequences(topic, partition, rows),
                transactional=self._producer.transactional_id is not None)
            encoded = encode_batches(count, keys, values, headers, self._extra_header,
                                     selection, now_ms, producer, self._config.codec,
                                     self._config.batch_bytes)
            self._producer.send(topic, partition, encoded.batches())

    def _partitions(self, topic: str, batch: pa.RecordBatch, keys: BinaryColumn | None,
                    values: BinaryColumn) -> np.ndarray:
        partition_count = self._producer.partition_count(topic)
        explicit = None
        partition_array = _optional_column(batch, "partition")
        if partition_array is not None:
            explicit = pc.fill_null(partition_array, UNASSIGNED_PARTITION).to_numpy(
                zero_copy_only=False).astype(np.int64)
            outside = explicit[(explicit >= partition_count) | (explicit < UNASSIGNED_PARTITION)]
            if len(outside):
                raise UnknownTopicOrPartition(
                    f"unknown partition {topic}-{int(outside[0])}: the topic has "
                    f"{partition_count} partitions")
        sticky = self._sticky.get(topic) or StickyPartition(random.randrange(partition_count))
        partitions, self._sticky[topic] = partition_rows(
            batch.num_rows, keys, values, explicit, partition_count, sticky,
            self._config.batch_bytes)
        return partitions
