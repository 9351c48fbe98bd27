"""The ``headrace`` PySpark data source: batch and streaming reads of any Kafka-protocol cluster.

Owns: ``HeadraceDataSource`` (format name "headrace"; also exported as
``pyspark_headrace.DefaultSource`` so an installed headrace is found by Spark without
registration), ``HeadraceBatchReader`` and ``HeadraceStreamReader``.

Planning happens on the driver: offsets are resolved against the cluster (batch queries through
``BrokerOffsets.shared``: the Python worker Spark reuses for planning keeps its AdminClient from
one query to the next), then each topic-partition's offset range becomes one
``OffsetRangePartition`` (split further for ``minPartitions``); executors read their range
with ``headrace.spark.fetch`` and yield Arrow batches. Streaming offsets are the JSON Spark
checkpoints, ``{"topic": {"partition": offset}}``, where each offset is the next one to read.
``partitions(start, end)`` depends only on its arguments, so recovery replays the same plan.
Admission control: ``maxOffsetsPerTrigger`` is the default read limit and
``latestOffset(start, limit)`` shares it across partitions by backlog. ``Trigger.AvailableNow``
pins the end offsets seen when the query starts. Partitions and topics that appear while a
query runs (``subscribePattern``, added partitions) are read from offset 0.
The source commits nothing to the cluster: Spark's checkpoint is the only consumer state.

Read speed (measured on pyspark 4.3): ``read()`` yields ``pyarrow.RecordBatch``es whose schema
equals pyspark's own Arrow form of the source schema (binary, int32, int64,
timestamp[us, UTC]), so pyspark passes them to the JVM as they are -- no per-row conversion,
no pickled rows; ``spark.sql.execution.arrow.maxRecordsPerBatch`` does not apply to them.
Executors fetch up to 16 MiB per partition per request (starting at 1 MiB, doubling, so the
first rows reach Spark early) and yield one batch per response (~16k rows of 1 KiB): large
batches cost Spark's JVM less per row. A worker keeps its broker connection for its next
task. Responses are received, and decoded by the kernel straight into Arrow buffers, in
regions each Python worker reuses once Spark has released the batches made from them (no
page faults for fresh buffers); a worker keeps these regions between tasks (measured: ~90 MiB
more resident after a task than before the first; peak ~190 MiB against ~120 MiB with fresh
buffers per response).
Each task fetches and decodes on a prefetch thread while its batches are written to the JVM.
A task still spends much of its time waiting (on the broker, on the JVM), so on a small
machine more task slots than cores read faster: e.g. ``local[4]`` on 2 cores read a
6-partition topic ~2x faster than ``local[2]``; on a cluster, ``minPartitions`` splits large
ranges into more tasks. Keep ``spark.python.worker.reuse`` at its default (true): a new
Python worker per task costs an interpreter start and the imports of pyarrow and headrace.
A reused worker runs a full ``gc.collect()`` after every task (pyspark's daemon), which
traverses every object the imports of pyspark, pyarrow and headrace created (~55k): measured
11 ms of CPU per collection on a quiet 2-core machine and 36 ms on a busy one, spent between
one task and the next. So the first read in a worker
process moves the objects alive then into the collector's permanent generation
(``gc.freeze()``): later collections skip them, and they are still freed by reference counting
if they ever become garbage (only cyclic garbage among them stays, once per process).

Readers are created per query on the driver and are not shared between threads.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from headrace.spark.columns import source_ddl
from headrace.spark.offsets import (
    BrokerOffsets,
    OffsetRange,
    PartitionOffsets,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    rate_limit,
    resolve_offsets,
    split_ranges,
)
from headrace.spark.options import SourceOptions, parse_sink_options, parse_source_options

if TYPE_CHECKING:
    from headrace.spark.sink import HeadraceBatchWriter, HeadraceStreamWriter

FORMAT_NAME = "headrace"


class OffsetRangePartition(InputPartition):
    """One Spark task: read ``offset_range`` with ``options``."""

    def __init__(self, offset_range: OffsetRange, options: SourceOptions) -> None:
        super().__init__(offset_range)
        self.offset_range = offset_range
        self.options = options


_worker_heap_frozen = False


def _freeze_worker_heap_once() -> None:
    """Exempt the objects alive at this process's first read (imported modules, classes)
    from the full collection the Spark worker runs after each task."""
    global _worker_heap_frozen
    if not _worker_heap_frozen:
        _worker_heap_frozen = True
        gc.freeze()


def _read_partition(partition: InputPartition) -> Iterator[pa.RecordBatch]:
    from headrace.spark.fetch import read_range  # executors only: planning never loads it

    _freeze_worker_heap_once()
    if isinstance(partition, OffsetRangePartition):
        yield from read_range(partition.options, partition.offset_range)


def _input_partitions(ranges: list[OffsetRange], options: SourceOptions) -> list[InputPartition]:
    return [OffsetRangePartition(offset_range, options)
            for offset_range in split_ranges(ranges, options.min_partitions)]


class HeadraceBatchReader(DataSourceReader):
    """``spark.read.format("headrace")``: offsets resolved once, when the query is planned."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options

    def partitions(self) -> list[InputPartition]:
        broker = BrokerOffsets.shared(self.options.client_dict())
        keys = broker.topic_partitions(self.options.subscription)
        start = resolve_offsets(self.options.starting, keys, broker, is_starting=True,
                                starting_timestamp_strategy=
                                self.options.starting_timestamp_strategy)
        end = resolve_offsets(self.options.ending, keys, broker, is_starting=False)
        ranges = plan_ranges(start, end, self.options.fail_on_data_loss)
        return _input_partitions(ranges, self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition)


class HeadraceStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("headrace")``: micro-batches of per-partition offset ranges."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        self._broker: BrokerOffsets | None = None
        self._available_now_end: PartitionOffsets | None = None

    def __getstate__(self) -> dict:
        # The reader is pickled to executors; the driver's admin client stays behind.
        return {"options": self.options, "_broker": None,
                "_available_now_end": self._available_now_end}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)

    def _cluster(self) -> BrokerOffsets:
        if self._broker is None:
            self._broker = BrokerOffsets(self.options.client_dict())
        return self._broker

    def initialOffset(self) -> dict:
        broker = self._cluster()
        keys = broker.topic_partitions(self.options.subscription)
        start = resolve_offsets(self.options.starting, keys, broker, is_starting=True,
                                starting_timestamp_strategy=
                                self.options.starting_timestamp_strategy)
        return offsets_to_json(start)

    def _latest_now(self) -> PartitionOffsets:
        broker = self._cluster()
        return broker.latest(broker.topic_partitions(self.options.subscription))

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now_end = self._latest_now()

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.options.max_offsets_per_trigger is None:
            return ReadAllAvailable()
        return ReadMaxRows(self.options.max_offsets_per_trigger)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        start_offsets = offsets_from_json(start)
        if self._available_now_end is not None:
            latest = dict(self._available_now_end)
        else:
            latest = self._latest_now()
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(limit.max_rows, start_offsets, latest)
        return offsets_to_json(latest)

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._latest_now())

    def partitions(self, start: dict, end: dict) -> list[InputPartition]:
        ranges = plan_ranges(offsets_from_json(start), offsets_from_json(end),
                             self.options.fail_on_data_loss)
        return _input_partitions(ranges, self.options)

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        return _read_partition(partition)


class HeadraceDataSource(DataSource):
    """Spark's Kafka connector options and columns over any Kafka-protocol cluster."""

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        include_headers = str(self.options.get("includeHeaders", "false")).lower() == "true"
        return source_ddl(include_headers)

    def reader(self, schema: StructType) -> DataSourceReader:
        return HeadraceBatchReader(parse_source_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return HeadraceStreamReader(parse_source_options(self.options, streaming=True))

    def writer(self, schema: StructType, overwrite: bool) -> HeadraceBatchWriter:
        from headrace.spark.sink import HeadraceBatchWriter  # loaded only by writing queries

        return HeadraceBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> HeadraceStreamWriter:
        from headrace.spark.sink import HeadraceStreamWriter  # loaded only by writing queries

        return HeadraceStreamWriter(parse_sink_options(self.options), schema)
