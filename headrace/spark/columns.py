"""The columns of the Spark source and sink, as Spark DDL and as Arrow schemas.

Owns: the row layout of Spark's Kafka connector -- key binary, value binary, topic string,
partition int, offset long, timestamp timestamp, timestampType int, and with includeHeaders
headers array<struct<key string, value binary>> -- and the mapping of Kafka timestamp types to
Spark's ints (0 CreateTime, 1 LogAppendTime, -1 none; Kafka's TimestampType ids).

Pure data; thread-safe.
"""

from __future__ import annotations

import pyarrow as pa

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
