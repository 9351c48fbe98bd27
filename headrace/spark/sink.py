"""The ``headrace`` PySpark sink: ``df.write.format("headrace")`` and ``writeStream``.

Owns: ``HeadraceBatchWriter`` and ``HeadraceStreamWriter`` (Arrow writers: each Spark task
produces its Arrow batches with one confluent-kafka Producer).

Columns, as in Spark's Kafka sink: ``value`` (binary or string) is required; ``key`` (binary or
string), ``headers`` (array<struct<key string, value binary>>), ``topic`` (string) and
``partition`` (int) are optional. The ``topic`` option, when set, overrides the topic column;
without either the write is refused. A row without a partition goes where the producer's
partitioner puts it (librdkafka's default: consistent_random on the key).

Delivery guarantee -- at least once, not exactly once:
- The producer is idempotent (``enable.idempotence=true`` unless overridden), so the producer's
  own retries never duplicate or reorder records within one task attempt.
- A task writes and flushes its records before it reports success; every record is
  acknowledged by the cluster (acks=all, implied by idempotence) or the task fails.
- A retried task, a re-run batch job, or a streaming batch replayed after a failure writes its
  records again: Kafka keeps both copies. ``abort`` cannot take back records already written.
- Streaming writes carry the micro-batch id in the record header ``headrace.batch.id`` (ASCII
  decimal). Readers that need exactly-once drop records of a (topic, batch id) they already
  processed, e.g. by keeping the highest batch id seen per output partition.

Each write() call owns its producer; writers hold only options and are safe to pickle.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pyarrow as pa
from confluent_kafka import KafkaException, Producer
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from headrace.errors import InvalidRecord
from headrace.spark.options import OptionError, SinkOptions

BATCH_ID_HEADER = "headrace.batch.id"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUEUE_FULL_WAIT_S = 0.05
FLUSH_TIMEOUT_S = 300.0
# Throughput settings the user can still override with kafka.* options.
_PRODUCER_DEFAULTS = {
    "linger.ms": "5",
    "batch.size": str(1024 * 1024),
    "queue.buffering.max.kbytes": str(256 * 1024),
}


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    records_written: int


def _check_columns(schema: StructType, options: SinkOptions) -> None:
    names = set(schema.fieldNames())
    if "value" not in names:
        raise OptionError("the sink needs a 'value' column")
    if options.topic is None and "topic" not in names:
        raise OptionError("the sink needs a 'topic' option or a 'topic' column")


def _as_bytes(value) -> bytes | None:
    return value.encode() if isinstance(value, str) else value


class _TaskProducer:
    """One task's producer; remembers the first delivery failure and raises it on flush."""

    def __init__(self, options: SinkOptions) -> None:
        config = dict(_PRODUCER_DEFAULTS)
        config.update(options.client_dict())
        self._producer = Producer(config)
        self._failure = None
        self.records_written = 0

    def _on_delivery(self, error, message) -> None:
        if error is not None and self._failure is None:
            self._failure = error

    def send(self, topic: str, value, key, headers, partition) -> None:
        arguments = {"value": value, "key": key, "on_delivery": self._on_delivery}
        if headers:
            arguments["headers"] = headers
        if partition is not None:
            arguments["partition"] = partition
        while True:
            try:
                self._producer.produce(topic, **arguments)
                break
            except BufferError:
                self._producer.poll(QUEUE_FULL_WAIT_S)
        self.records_written += 1

    def finish(self) -> int:
        remaining = self._producer.flush(FLUSH_TIMEOUT_S)
        if self._failure is not None:
            raise KafkaException(self._failure)
        if remaining:
            raise KafkaException(f"{remaining} records not acknowledged in {FLUSH_TIMEOUT_S} s")
        return self.records_written


def _column(batch: pa.RecordBatch, name: str) -> list | None:
    index = batch.schema.get_field_index(name)
    return None if index < 0 else batch.column(index).to_pylist()


def _write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch],
                   extra_headers: list[tuple[str, bytes]]) -> SinkCommitMessage:
    producer = _TaskProducer(options)
    for batch in batches:
        _write_batch(producer, options, batch, extra_headers)
    return SinkCommitMessage(producer.finish())


def _write_batch(producer: _TaskProducer, options: SinkOptions, batch: pa.RecordBatch,
                 extra_headers: list[tuple[str, bytes]]) -> None:
    count = batch.num_rows
    values = _column(batch, "value")
    keys = _column(batch, "key") or [None] * count
    topics = [options.topic] * count if options.topic else _column(batch, "topic")
    partitions = _column(batch, "partition") or [None] * count
    header_lists = _column(batch, "headers") or [None] * count
    for row in range(count):
        if topics[row] is None:
            raise InvalidRecord("null topic in a row and no 'topic' option")
        headers = [(header["key"], header["value"]) for header in header_lists[row] or ()]
        producer.send(topics[row], _as_bytes(values[row]), _as_bytes(keys[row]),
                      headers + extra_headers, partitions[row])


class HeadraceBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        _check_columns(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return _write_batches(self.options, iterator, [])


class HeadraceStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        _check_columns(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        batch_id = TaskContext.get().getLocalProperty(BATCH_ID_PROPERTY)
        extra_headers = [(BATCH_ID_HEADER, str(batch_id).encode())] if batch_id else []
        return _write_batches(self.options, iterator, extra_headers)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records are visible once written; nothing is left to publish at commit."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Records already acknowledged stay in the log (see the module docstring)."""
