"""The ``headrace`` PySpark sink: ``df.write.format("headrace")`` and ``writeStream``.

Owns: ``HeadraceBatchWriter`` and ``HeadraceStreamWriter`` (Arrow writers) and the choice of
each task's write path:

- The sink's own path (``headrace.spark.sink_wire``): the compiled kernel builds Kafka v2
  record batches straight from the Arrow columns and a small idempotent Produce client
  (``headrace.spark.wire_produce``) sends them -- no Python object per record.
- confluent-kafka (one ``Producer.produce()`` per row) when a ``kafka.*`` option asks for
  something that path does not implement: a ``security.protocol`` other than PLAINTEXT,
  ``acks`` other than all, ``enable.idempotence=false``, or any producer option it does not
  know (``headrace.spark.wire_produce`` lists the ones it honours) -- or when the cluster
  offers no InitProducerId.

Columns, as in Spark's Kafka sink: ``value`` (binary or string) is required; ``key`` (binary or
string), ``headers`` (array<struct<key string, value binary>>), ``topic`` (string) and
``partition`` (int) are optional. The ``topic`` option, when set, overrides the topic column;
without either the write is refused. A row without a partition is placed as Spark's own Kafka
sink (the Java producer) places it: a keyed row in ``(murmur2(key) & 0x7fffffff) %
partitions``, a keyless row in a sticky partition that moves on to the next one after
``batch.size`` bytes (the Java producer moves to a random one). On the confluent-kafka path
librdkafka's default partitioner (consistent_random) decides instead.

Delivery guarantee by default -- at least once:
- The producer is idempotent (one producer id per task; acks=all), so its own retries never
  duplicate or reorder records within one task attempt: a retried request carries the same
  batches with the same sequence numbers and the broker keeps one copy.
- A task writes its records and waits for every acknowledgement before it reports success;
  a record the cluster does not acknowledge within ``delivery.timeout.ms`` fails the task.
- A retried task, a re-run batch job, or a streaming batch replayed after a failure writes its
  records again under a new producer id: Kafka keeps both copies. ``abort`` cannot take back
  records already written.
- Streaming writes carry the micro-batch id in the record header ``headrace.batch.id`` (ASCII
  decimal). Readers that need exactly-once drop records of a (topic, batch id) they already
  processed, e.g. by keeping the highest batch id seen per output partition.

Exactly once (option ``exactlyOnce=true``, streaming writes only, on the sink's own path; it
needs the ``topic`` option): read_committed readers see each micro-batch's records once.
Two-phase, as Spark's commit protocol is: tasks write, the driver commits.

- Each task writes inside one Kafka transaction whose ``transactional.id`` is
  ``<transactionalIdPrefix>-<query id>-<task partition id>`` (the query id Spark keeps in the
  checkpoint, so it is the same across task retries, re-run batches and driver restarts).
  The task's InitProducerId fences every earlier attempt of that partition: the open
  transaction of an attempt that failed or was killed is aborted, a straggler still running
  fails on its next request with PRODUCER_FENCED.
- The task records the micro-batch in the same transaction: offset ``batch id + 1``
  (metadata ``spark batch <id>``) of the topic's partition 0, committed for a consumer group
  named after the transactional id (AddOffsetsToTxn, TxnOffsetCommit). It waits for every
  acknowledgement and returns the transaction (id, producer id, epoch) in its commit
  message, still open.
- The task does not commit: Python's ``write`` cannot tell the end of its input from an
  input cut short by a failure upstream in the same task (Spark then fails the task after
  ``write`` returned), so only the driver's ``commit``, called once every task of the batch
  succeeded, ends the transactions (EndTxn(commit), any process may). ``abort`` aborts the
  transactions of the tasks that finished; those of failed tasks are aborted by the next
  attempt's InitProducerId or by ``transaction.timeout.ms`` (``kafka.transaction.timeout.ms``,
  60 s by default: a batch's tasks and its commit must finish within it).
- Before writing, a task reads its marker (OffsetFetch with require_stable, so a commit still
  completing is waited for); when its batch id is below it, that partition of the batch is
  already committed and the task writes nothing. This covers a driver that died while or
  after committing but before writing the batch to the checkpoint's commit log: on restart
  Spark re-runs the batch, committed partitions are skipped and the others' abandoned
  transactions aborted by the re-run's InitProducerId.
- What it relies on: Spark re-runs a micro-batch over the same input (the offsets in the
  checkpoint's offset log) with the same partitioning, as Spark's own exactly-once sinks do;
  the driver commits a batch's transactions one after another, so a reader may see part of a
  batch before the rest; the markers live as long as the group's committed offsets
  (``offsets.retention.minutes``, 7 days by default, after the group's last commit).

Each write() call owns its producer; writers hold only options and are safe to pickle.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import repeat

import pyarrow as pa
from confluent_kafka import KafkaException, Producer
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from headrace.errors import InvalidRecord, KafkaError, UnsupportedVersion
from headrace.spark.options import OptionError, SinkOptions
from headrace.spark.sink_wire import WireTaskWriter
from headrace.spark.wire_produce import ProduceClientConfig, UnsupportedProducerConfig
from headrace.spark.wire_transaction import (
    TransactionalProducer,
    TransactionHandle,
    end_transactions,
)

_log = logging.getLogger(__name__)
BATCH_ID_HEADER = "headrace.batch.id"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
QUERY_ID_PROPERTY = "sql.streaming.queryId"  # the query's id, kept in its checkpoint
MARKER_PARTITION = 0
QUEUE_FULL_WAIT_S = 0.05
FLUSH_TIMEOUT_S = 300.0
RECORDS_PER_POLL = 10_000  # serve (error-only) delivery reports this often
UNASSIGNED_PARTITION = -1  # librdkafka's RD_KAFKA_PARTITION_UA: the partitioner decides
# Throughput settings the user can still override with kafka.* options.
_PRODUCER_DEFAULTS = {
    "linger.ms": "5",
    "batch.size": str(1024 * 1024),
    "queue.buffering.max.kbytes": str(256 * 1024),
}
# Successful deliveries need no Python callback: flush() waits for every acknowledgement and
# only failures are reported, so the produce loop stays free of per-record callbacks.
_PRODUCER_FIXED = {"delivery.report.only.error": True}


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    records_written: int
    transaction: TransactionHandle | None = None  # exactly once: the task's open transaction


def _check_columns(schema: StructType, options: SinkOptions) -> None:
    names = set(schema.fieldNames())
    if "value" not in names:
        raise OptionError("the sink needs a 'value' column")
    if options.topic is None and "topic" not in names:
        raise OptionError("the sink needs a 'topic' option or a 'topic' column")


class _TaskProducer:
    """One task's confluent-kafka producer (the fallback path); remembers the first delivery
    failure and raises it. Each Arrow column becomes Python values once (``to_pylist``), rows
    go to ``produce()`` in one tight loop, and librdkafka reports only failed deliveries
    (``delivery.report.only.error``), so no Python callback runs per record."""

    def __init__(self, options: SinkOptions) -> None:
        config = dict(_PRODUCER_DEFAULTS)
        config.update(options.client_dict())
        config.update(_PRODUCER_FIXED)
        config["on_delivery"] = self._on_delivery
        self._producer = Producer(config)
        self._failure = None
        self.records_written = 0

    def _on_delivery(self, error, message) -> None:
        if error is not None and self._failure is None:
            self._failure = error

    def _raise_failure(self) -> None:
        if self._failure is not None:
            raise KafkaException(self._failure)

    def send_all(self, rows: Iterable[tuple], headers: Iterable | None) -> None:
        """Produce (topic, value, key, partition) rows, with per-row header lists if given."""
        produce = self._producer.produce
        poll = self._producer.poll
        sent = 0
        for row, row_headers in zip(rows, repeat(None) if headers is None else headers,
                                    strict=False):
            while True:
                try:
                    produce(*row, headers=row_headers)
                    break
                except BufferError:
                    poll(QUEUE_FULL_WAIT_S)
            sent += 1
            if sent % RECORDS_PER_POLL == 0:
                poll(0)
                self._raise_failure()
        self.records_written += sent

    def finish(self) -> int:
        remaining = self._producer.flush(FLUSH_TIMEOUT_S)
        self._raise_failure()
        if remaining:
            raise KafkaException(f"{remaining} records not acknowledged in {FLUSH_TIMEOUT_S} s")
        return self.records_written


def _column(batch: pa.RecordBatch, name: str, as_bytes: bool = False) -> list | None:
    """A column as Python values (one conversion per column); with ``as_bytes`` strings
    become their UTF-8 bytes."""
    index = batch.schema.get_field_index(name)
    if index < 0:
        return None
    column = batch.column(index)
    if as_bytes and pa.types.is_string(column.type):
        column = column.cast(pa.binary())
    elif as_bytes and pa.types.is_large_string(column.type):
        column = column.cast(pa.large_binary())
    return column.to_pylist()


def _row_headers(header_lists: list | None, extra_headers: list[tuple[str, bytes]],
                 count: int) -> list | None:
    """Per-row header lists, or None when no row has a header."""
    if header_lists is None:
        return [extra_headers] * count if extra_headers else None
    return [[(header["key"], header["value"]) for header in headers or ()] + extra_headers
            for headers in header_lists]


def _write_batches(options: SinkOptions, batches: Iterator[pa.RecordBatch],
                   extra_headers: list[tuple[str, bytes]]) -> SinkCommitMessage:
    """Write a task's batches on the sink's own path, or on confluent-kafka's when that
    path cannot (see the module docstring)."""
    try:
        config = ProduceClientConfig.from_client_options(options.client_dict())
        writer = WireTaskWriter(config, options.topic, _wire_header(extra_headers))
    except (UnsupportedProducerConfig, UnsupportedVersion):
        return _write_with_confluent_kafka(options, batches, extra_headers)
    try:
        for batch in batches:
            writer.write(batch)
        return SinkCommitMessage(writer.finish())
    finally:
        writer.close()


def _wire_header(extra_headers: list[tuple[str, bytes]]) -> tuple[bytes, bytes] | None:
    if not extra_headers:
        return None
    ((key, value),) = extra_headers
    return key.encode(), value


def _write_with_confluent_kafka(options: SinkOptions, batches: Iterator[pa.RecordBatch],
                                extra_headers: list[tuple[str, bytes]]) -> SinkCommitMessage:
    producer = _TaskProducer(options)
    for batch in batches:
        _write_batch(producer, options, batch, extra_headers)
    return SinkCommitMessage(producer.finish())


def _write_batch(producer: _TaskProducer, options: SinkOptions, batch: pa.RecordBatch,
                 extra_headers: list[tuple[str, bytes]]) -> None:
    count = batch.num_rows
    if options.topic:
        topics = repeat(options.topic, count)
    else:
        topics = _column(batch, "topic")
        if None in topics:
            raise InvalidRecord("null topic in a row and no 'topic' option")
    keys = _column(batch, "key", as_bytes=True) or repeat(None, count)
    partitions = _column(batch, "partition")
    if partitions is None:
        partitions = repeat(UNASSIGNED_PARTITION, count)
    else:
        partitions = [UNASSIGNED_PARTITION if p is None else p for p in partitions]
    rows = zip(topics, _column(batch, "value", as_bytes=True), keys, partitions, strict=True)
    producer.send_all(rows, _row_headers(_column(batch, "headers"), extra_headers, count))


def _write_exactly_once(options: SinkOptions, batches: Iterator[pa.RecordBatch],
                        batch_id: int, transactional_id: str) -> SinkCommitMessage:
    """One task's records and its batch marker in one transaction, left open for the
    driver to commit (see the module docstring); nothing is written when the marker says
    the batch is already committed."""
    config = _exactly_once_config(options)
    producer = TransactionalProducer(config, transactional_id)
    try:
        next_batch_id = producer.committed_offset(transactional_id, options.topic,
                                                  MARKER_PARTITION)
        if batch_id < next_batch_id:
            for _ in batches:  # Spark hands the input over; it was written before
                pass
            return SinkCommitMessage(0)
        writer = WireTaskWriter(config, options.topic,
                                _wire_header([(BATCH_ID_HEADER, str(batch_id).encode())]),
                                producer=producer)
        for batch in batches:
            writer.write(batch)
        producer.send_offsets_to_transaction(transactional_id, {
            (options.topic, MARKER_PARTITION): (batch_id + 1, f"spark batch {batch_id}")})
        transaction = producer.prepare_transaction()
        return SinkCommitMessage(producer.records_acknowledged, transaction)
    finally:
        producer.close()


def _exactly_once_config(options: SinkOptions) -> ProduceClientConfig:
    try:
        return ProduceClientConfig.from_client_options(options.client_dict())
    except UnsupportedProducerConfig as error:
        raise OptionError(f"option 'exactlyOnce' cannot be honoured: {error}") from error


def _transactions(messages: list[WriterCommitMessage | None]) -> list[TransactionHandle]:
    return [message.transaction for message in messages
            if isinstance(message, SinkCommitMessage) and message.transaction is not None]


def _task_transactional_id(options: SinkOptions, context: TaskContext) -> str:
    query_id = context.getLocalProperty(QUERY_ID_PROPERTY)
    if not query_id:
        raise OptionError("option 'exactlyOnce': the task carries no streaming query id")
    return f"{options.transactional_id_prefix}-{query_id}-{context.partitionId()}"


class HeadraceBatchWriter(DataSourceArrowWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        _check_columns(schema, options)
        if options.exactly_once:
            raise OptionError("option 'exactlyOnce' applies to streaming writes "
                              "(writeStream): a batch write has no batch id to record")
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        return _write_batches(self.options, iterator, [])


class HeadraceStreamWriter(DataSourceStreamArrowWriter):
    def __init__(self, options: SinkOptions, schema: StructType) -> None:
        _check_columns(schema, options)
        self.options = options

    def write(self, iterator: Iterator[pa.RecordBatch]) -> SinkCommitMessage:
        context = TaskContext.get()
        batch_id = context.getLocalProperty(BATCH_ID_PROPERTY)
        if self.options.exactly_once:
            return _write_exactly_once(self.options, iterator, int(batch_id),
                                       _task_transactional_id(self.options, context))
        extra_headers = [(BATCH_ID_HEADER, str(batch_id).encode())] if batch_id else []
        return _write_batches(self.options, iterator, extra_headers)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Exactly once: commit every task's transaction. Otherwise records are visible
        once written and nothing is left to publish."""
        if self.options.exactly_once:
            end_transactions(_exactly_once_config(self.options), _transactions(messages),
                             commit=True)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Exactly once: abort the finished tasks' transactions (the others are aborted by
        their next attempt or their timeout). Otherwise records already acknowledged stay
        in the log (see the module docstring)."""
        if not self.options.exactly_once:
            return
        try:
            end_transactions(_exactly_once_config(self.options), _transactions(messages),
                             commit=False)
        except (KafkaError, OSError) as error:  # aborted anyway by the next attempt or timeout
            _log.warning("aborting micro-batch %s's transactions failed: %s", batchId, error)
