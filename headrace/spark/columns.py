"""The columns of the Spark source and sink, as Spark DDL and as Arrow schemas.

Owns: the row layout of Spark's Kafka connector -- key binary, value binary, topic string,
partition int, offset long, timestamp timestamp, timestampType int, and with includeHeaders
headers array<struct<key string, value binary>> -- and the mapping of Kafka timestamp types to
Spark's ints (0 CreateTime, 1 LogAppendTime, -1 none; Kafka's TimestampType ids).

``record_columns_to_arrow`` wraps the record kernel's column buffers
(``headrace.protocol.kernel.RecordColumns``) as an Arrow batch of the source schema without a
Python object per record. ``ArrowBatchDecoder`` is the source's path without headers: the
kernel's ``decode_arrow`` writes key, value, offset and timestamp columns straight into Arrow
buffers carved from one pooled region per Fetch response (``headrace.protocol.buffers``), and the
constant topic and partition columns are slices of arrays built once per task.

Pure data and pure functions are thread-safe; an ``ArrowBatchDecoder`` belongs to one thread
(the batches it returns may be used and released anywhere).
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from headrace.protocol.buffers import RegionPool
from headrace.protocol.kernel import (
    ArrowBuffers,
    ArrowFilled,
    RecordColumns,
    arrow_buffers_in,
    arrow_region_bytes,
    decode_arrow,
    plan_arrow_decode,
)

BASE_COLUMNS_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_COLUMN_DDL = "headers array<struct<key: string, value: binary>>"

CREATE_TIME = 0
LOG_APPEND_TIME = 1

ARROW_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
ARROW_TIMESTAMP_TYPE = pa.timestamp("us", tz="UTC")
MICROS_PER_MILLI = 1000


def source_ddl(include_headers: bool) -> str:
    return f"{BASE_COLUMNS_DDL}, {HEADERS_COLUMN_DDL}" if include_headers else BASE_COLUMNS_DDL


def source_arrow_schema(include_headers: bool) -> pa.Schema:
    fields = [
        ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
        ("partition", pa.int32()), ("offset", pa.int64()),
        ("timestamp", ARROW_TIMESTAMP_TYPE), ("timestampType", pa.int32()),
    ]
    if include_headers:
        fields.append(("headers", ARROW_HEADER_TYPE))
    return pa.schema(fields)


SOURCE_SCHEMA = source_arrow_schema(include_headers=False)


def _validity(valid: np.ndarray) -> pa.Buffer | None:
    """An Arrow validity bitmap from a bool-per-row array; None when nothing is null."""
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _binary_array(arrow_type: pa.DataType, offsets: np.ndarray, data: np.ndarray,
                  valid: np.ndarray) -> pa.Array:
    return pa.Array.from_buffers(
        arrow_type, len(valid), [_validity(valid), pa.py_buffer(offsets), pa.py_buffer(data)])


def _headers_array(columns: RecordColumns) -> pa.Array:
    header_count = len(columns.header_value_valid)
    header_keys = _binary_array(pa.string(), columns.header_key_offsets,
                                columns.header_key_data, np.ones(header_count, np.bool_))
    header_values = _binary_array(pa.binary(), columns.header_value_offsets,
                                  columns.header_value_data, columns.header_value_valid)
    entries = pa.StructArray.from_arrays([header_keys, header_values],
                                         fields=list(ARROW_HEADER_TYPE.value_type))
    return pa.Array.from_buffers(ARROW_HEADER_TYPE, columns.count,
                                 [None, pa.py_buffer(columns.header_list_offsets)],
                                 children=[entries])


def record_columns_to_arrow(columns: RecordColumns, topic: str, partition: int,
                            include_headers: bool, start: int, stop: int) -> pa.RecordBatch:
    """Records [start, stop) of kernel-decoded ``columns`` as one batch of the source schema.

    Key, value, offset and header columns wrap the kernel's buffers without copying; only the
    timestamps (ms -> us) and timestamp types (int8 -> int32) are converted, vectorised.
    """
    count = stop - start
    timestamps_us = columns.timestamps_ms[start:stop] * MICROS_PER_MILLI
    arrays = [
        _binary_array(pa.binary(), columns.key_offsets, columns.key_data,
                      columns.key_valid).slice(start, count),
        _binary_array(pa.binary(), columns.value_offsets, columns.value_data,
                      columns.value_valid).slice(start, count),
        pa.repeat(pa.scalar(topic, pa.string()), count),
        pa.repeat(pa.scalar(partition, pa.int32()), count),
        pa.Array.from_buffers(pa.int64(), count,
                              [None, pa.py_buffer(columns.offsets[start:stop])]),
        pa.Array.from_buffers(ARROW_TIMESTAMP_TYPE, count, [None, pa.py_buffer(timestamps_us)]),
        pa.Array.from_buffers(pa.int32(), count, [
            None, pa.py_buffer(columns.timestamp_types[start:stop].astype(np.int32))]),
    ]
    if include_headers:
        arrays.append(_headers_array(columns).slice(start, count))
    return pa.RecordBatch.from_arrays(arrays, schema=source_arrow_schema(include_headers))


def arrow_chunks(record_bytes_before: np.ndarray, start: int, stop: int, max_records: int,
                 max_bytes: int) -> Iterator[tuple[int, int]]:
    """Record index ranges covering [start, stop), each at most ``max_records`` records and,
    unless one record alone is larger, ``max_bytes`` of keys and values; record i's keys and
    values start at byte ``record_bytes_before[i]`` (n + 1 entries)."""
    while start < stop:
        limit = record_bytes_before[start] + max_bytes
        by_bytes = int(np.searchsorted(record_bytes_before, limit, "right")) - 1
        chunk_stop = min(stop, start + max_records, max(by_bytes, start + 1))
        yield start, chunk_stop
        start = chunk_stop


def _filled_binary(count: int, null_count: int, offsets: memoryview, validity: memoryview,
                   data: memoryview, data_bytes: int) -> pa.Array:
    bitmap = pa.py_buffer(validity[:(count + 7) // 8]) if null_count else None
    return pa.Array.from_buffers(
        pa.binary(), count,
        [bitmap, pa.py_buffer(offsets[:4 * (count + 1)]), pa.py_buffer(data[:data_bytes])],
        null_count=null_count)


def _filled_fixed(arrow_type: pa.DataType, count: int, width_bytes: int,
                  values: memoryview) -> pa.Array:
    return pa.Array.from_buffers(arrow_type, count,
                                 [None, pa.py_buffer(values[:width_bytes * count])],
                                 null_count=0)


class ArrowBatchDecoder:
    """Decodes one topic-partition's Fetch responses into record batches of the source
    schema without headers, reusing its buffers once Spark has released their batches."""

    def __init__(self, topic: str, partition: int, pool: RegionPool) -> None:
        self.topic = topic
        self.partition = partition
        self._pool = pool
        self._topics = pa.array([], pa.string())
        self._partitions = pa.array([], pa.int32())

    def decode(self, records: memoryview, from_offset: int, until_offset: int,
               max_records: int, max_bytes: int) -> Iterator[pa.RecordBatch]:
        """The records of ``records`` (whole batches) in [from_offset, until_offset)
        (CRC-32C checked, control batches skipped), in batches of at most ``max_records``
        rows and, unless one record alone is larger, ``max_bytes`` of keys and values."""
        plan = plan_arrow_decode(records)
        out = arrow_buffers_in(self._pool.take(arrow_region_bytes(plan)), plan)
        filled = decode_arrow(records, plan, out, from_offset, until_offset)
        if filled.count == 0:
            return
        batch = self._batch(out, filled)
        if filled.count <= max_records and filled.key_bytes + filled.value_bytes <= max_bytes:
            yield batch
            return
        record_bytes_before = (
            np.frombuffer(out.key_offsets, np.int32, filled.count + 1).astype(np.int64)
            + np.frombuffer(out.value_offsets, np.int32, filled.count + 1))
        for start, stop in arrow_chunks(record_bytes_before, 0, filled.count, max_records,
                                        max_bytes):
            yield batch.slice(start, stop - start)

    def _constant_columns(self, count: int) -> tuple[pa.Array, pa.Array]:
        if len(self._topics) < count:
            self._topics = pa.repeat(pa.scalar(self.topic, pa.string()), count)
            self._partitions = pa.repeat(pa.scalar(self.partition, pa.int32()), count)
        return self._topics.slice(0, count), self._partitions.slice(0, count)

    def _batch(self, out: ArrowBuffers, filled: ArrowFilled) -> pa.RecordBatch:
        count = filled.count
        topics, partitions = self._constant_columns(count)
        arrays = [
            _filled_binary(count, filled.key_null_count, out.key_offsets, out.key_validity,
                           out.key_data, filled.key_bytes),
            _filled_binary(count, filled.value_null_count, out.value_offsets,
                           out.value_validity, out.value_data, filled.value_bytes),
            topics, partitions,
            _filled_fixed(pa.int64(), count, 8, out.offsets),
            _filled_fixed(ARROW_TIMESTAMP_TYPE, count, 8, out.timestamps_us),
            _filled_fixed(pa.int32(), count, 4, out.timestamp_types),
        ]
        return pa.RecordBatch.from_arrays(arrays, schema=SOURCE_SCHEMA)
