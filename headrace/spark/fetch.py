"""Executor side of the Spark source: one offset range read into Arrow record batches.

Owns: ``read_range``, which assigns a confluent-kafka Consumer to one topic-partition at the
range's first offset, consumes until the range is covered, and yields ``pyarrow.RecordBatch``es
of at most ``records_per_arrow_batch`` rows in the source's column layout.

Range semantics (Spark's KafkaDataConsumer):
- Offsets missing inside the range (compaction, transaction markers) are normal gaps.
- A range that starts below the log start offset (retention, DeleteRecords), whose topic no
  longer exists, or whose end lies beyond the end of the log (truncation, a recreated topic) is
  data loss: with failOnDataLoss it raises ``OffsetOutOfRange`` / ``UnknownTopicOrPartition``,
  otherwise the missing part is skipped with a warning.
- No progress for ``poll_timeout_ms`` raises ``RequestTimedOut``.

The consumer never commits offsets and joins no group (assign, not subscribe). Each call owns
its consumer; nothing is shared between calls, so concurrent tasks are safe.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pyarrow as pa
from confluent_kafka import (
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    Consumer,
    KafkaError,
    KafkaException,
    TopicPartition,
)

from headrace.errors import RequestTimedOut, UnknownTopicOrPartition
from headrace.spark.columns import (
    ARROW_HEADER_TYPE,
    ARROW_TIMESTAMP_TYPE,
    CREATE_TIME,
    LOG_APPEND_TIME,
    MICROS_PER_MILLI,
    NO_TIMESTAMP_TYPE,
    source_arrow_schema,
)
from headrace.spark.offsets import OffsetRange, report_data_loss
from headrace.spark.options import SourceOptions

MESSAGES_PER_CONSUME_CALL = 10_000
CONSUME_WAIT_S = 0.5
WATERMARK_TIMEOUT_S = 30.0
EXECUTOR_GROUP_ID = "spark-kafka-source-headrace-executor"
_SPARK_TIMESTAMP_TYPE = {
    TIMESTAMP_CREATE_TIME: CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME: LOG_APPEND_TIME,
}
# Throughput settings the user can still override with kafka.* options.
_CONSUMER_DEFAULTS = {
    "fetch.wait.max.ms": "100",
    "fetch.max.bytes": str(64 * 1024 * 1024),
    "max.partition.fetch.bytes": str(16 * 1024 * 1024),
    "queued.max.messages.kbytes": str(256 * 1024),
}


def consumer_config(options: SourceOptions) -> dict[str, str]:
    config = dict(_CONSUMER_DEFAULTS)
    config["group.id"] = EXECUTOR_GROUP_ID
    config.update(options.client_dict())
    config.update({
        "enable.auto.commit": "false",
        "enable.partition.eof": "true",
        "auto.offset.reset": "error",
    })
    return config


def read_range(options: SourceOptions, offset_range: OffsetRange) -> Iterator[pa.RecordBatch]:
    consumer = Consumer(consumer_config(options))
    try:
        first_offset = _first_readable_offset(consumer, options, offset_range)
        if first_offset is None or first_offset >= offset_range.until_offset:
            return
        consumer.assign([TopicPartition(offset_range.topic, offset_range.partition,
                                        first_offset)])
        yield from _consume_batches(consumer, options, offset_range)
    finally:
        consumer.close()


def _first_readable_offset(
    consumer: Consumer, options: SourceOptions, offset_range: OffsetRange
) -> int | None:
    """The range's first offset, moved up to the log start if retention removed records."""
    topic_partition = TopicPartition(offset_range.topic, offset_range.partition)
    try:
        log_start, _ = consumer.get_watermark_offsets(topic_partition,
                                                      timeout=WATERMARK_TIMEOUT_S)
    except KafkaException as error:
        report_data_loss(
            f"Cannot fetch {offset_range.topic}-{offset_range.partition} "
            f"[{offset_range.from_offset}, {offset_range.until_offset}): {error}",
            options.fail_on_data_loss, UnknownTopicOrPartition)
        return None
    if offset_range.from_offset < log_start:
        report_data_loss(
            f"Cannot fetch offset {offset_range.from_offset} of {offset_range.topic}-"
            f"{offset_range.partition}: the log starts at {log_start}",
            options.fail_on_data_loss)
        return log_start
    return offset_range.from_offset


class _ColumnBuffers:
    """Column lists for one Arrow batch of records from one topic-partition."""

    def __init__(self, include_headers: bool) -> None:
        self.include_headers = include_headers
        self.clear()

    def clear(self) -> None:
        self.keys: list = []
        self.values: list = []
        self.offsets: list = []
        self.timestamps_us: list = []
        self.timestamp_types: list = []
        self.headers: list = []

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, message) -> None:
        timestamp_type, timestamp_ms = message.timestamp()
        self.keys.append(message.key())
        self.values.append(message.value())
        self.offsets.append(message.offset())
        self.timestamps_us.append(timestamp_ms * MICROS_PER_MILLI)
        self.timestamp_types.append(_SPARK_TIMESTAMP_TYPE.get(timestamp_type, NO_TIMESTAMP_TYPE))
        if self.include_headers:
            self.headers.append([{"key": key, "value": value}
                                 for key, value in (message.headers() or ())])

    def to_batch(self, offset_range: OffsetRange) -> pa.RecordBatch:
        count = len(self.offsets)
        columns = [
            pa.array(self.keys, pa.binary()),
            pa.array(self.values, pa.binary()),
            pa.repeat(pa.scalar(offset_range.topic, pa.string()), count),
            pa.repeat(pa.scalar(offset_range.partition, pa.int32()), count),
            pa.array(self.offsets, pa.int64()),
            pa.array(self.timestamps_us, pa.int64()).cast(ARROW_TIMESTAMP_TYPE),
            pa.array(self.timestamp_types, pa.int32()),
        ]
        if self.include_headers:
            columns.append(pa.array(self.headers, ARROW_HEADER_TYPE))
        return pa.RecordBatch.from_arrays(
            columns, schema=source_arrow_schema(self.include_headers))


def _consume_batches(
    consumer: Consumer, options: SourceOptions, offset_range: OffsetRange
) -> Iterator[pa.RecordBatch]:
    buffers = _ColumnBuffers(options.include_headers)
    last_progress_s = time.monotonic()
    done = False
    while not done:
        messages = consumer.consume(MESSAGES_PER_CONSUME_CALL, CONSUME_WAIT_S)
        if messages:
            last_progress_s = time.monotonic()
        for message in messages:
            done = _handle_message(message, buffers, options, offset_range)
            if done:
                break
            if len(buffers) >= options.records_per_arrow_batch:
                yield buffers.to_batch(offset_range)
                buffers.clear()
        if not done and time.monotonic() - last_progress_s > options.poll_timeout_ms / 1000:
            raise RequestTimedOut(
                f"no records for {offset_range.topic}-{offset_range.partition} at or after "
                f"offset {offset_range.from_offset} within {options.poll_timeout_ms} ms")
    if len(buffers):
        yield buffers.to_batch(offset_range)


def _handle_message(message, buffers: _ColumnBuffers, options: SourceOptions,
                    offset_range: OffsetRange) -> bool:
    """Add one consumed message; True once the range is covered."""
    error = message.error()
    if error is not None:
        if error.code() == KafkaError._PARTITION_EOF:
            return _end_of_log_reached(message.offset(), options, offset_range)
        raise KafkaException(error)
    offset = message.offset()
    if offset >= offset_range.until_offset:
        return True
    buffers.append(message)
    return offset == offset_range.until_offset - 1


def _end_of_log_reached(log_end_offset: int, options: SourceOptions,
                        offset_range: OffsetRange) -> bool:
    """At the end of the log: the range is covered, or its tail no longer exists."""
    if log_end_offset < offset_range.until_offset:
        report_data_loss(
            f"Cannot fetch offsets [{log_end_offset}, {offset_range.until_offset}) of "
            f"{offset_range.topic}-{offset_range.partition}: the log ends at {log_end_offset}",
            options.fail_on_data_loss)
    return True
