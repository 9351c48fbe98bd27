"""The columns of the Spark source and sink, as Spark DDL and as Arrow schemas.

Owns: the row layout of Spark's Kafka connector -- key binary, value binary, topic string,
partition int, offset long, timestamp timestamp, timestampType int, and with includeHeaders
headers array<struct<key string, value binary>> -- and the mapping of Kafka timestamp types to
Spark's ints (0 CreateTime, 1 LogAppendTime, -1 none; Kafka's TimestampType ids).

``record_columns_to_arrow`` wraps the record kernel's column buffers
(``headrace.protocol.kernel.RecordColumns``) as an Arrow batch of the source schema without a
Python object per record.

Pure data and pure functions; thread-safe.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from headrace.protocol.kernel import RecordColumns

BASE_COLUMNS_DDL = (
    "key binary, value binary, topic string, partition int, offset long, "
    "timestamp timestamp, timestampType int"
)
HEADERS_COLUMN_DDL = "headers array<struct<key: string, value: binary>>"

NO_TIMESTAMP_TYPE = -1
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
