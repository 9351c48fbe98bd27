"""Executor side of the Spark source: one offset range read into Arrow record batches.

Owns: ``read_range``, which reads one topic-partition's range with the raw Fetch client of
``headrace.spark.wire_fetch``, decodes each response's record batches with the compiled record
kernel (CRC-checked, decompressed, control batches skipped) and yields ``pyarrow.RecordBatch``es
of at most ``records_per_arrow_batch`` rows -- no Python object per record. Without headers the
kernel's ``decode_arrow`` writes the Arrow buffers themselves in one pass, into regions of a
process-wide pool (``headrace.protocol.buffers``) that are reused once Spark has released the
batches made from them: with fresh multi-MiB buffers per response, page faults cost as much as
the decoding. With ``includeHeaders`` the kernel's ``decode_columns`` output is wrapped instead.
The next Fetch is sent before a response is decoded, so the broker works while we decode, and
fetching and decoding run on a prefetch thread (``_Prefetcher``) up to
``PREFETCHED_ARROW_BATCHES`` batches ahead of the caller, so the Python worker's writes of
Arrow batches to Spark's JVM overlap the next fetch and decode (socket I/O and the kernel
release the GIL). Measured: a task otherwise waits for the broker, then for the JVM, in turn.

Range semantics (Spark's KafkaDataConsumer):
- Batches may start before the range: records outside [from, until) are trimmed.
- Offsets missing inside the range (compaction, transaction markers) are normal gaps.
- A range that starts below the log start offset (retention, DeleteRecords), whose topic no
  longer exists, or whose end lies beyond the end of the log (truncation, a recreated topic) is
  data loss: with failOnDataLoss it raises ``OffsetOutOfRange`` / ``UnknownTopicOrPartition``,
  otherwise the missing part is skipped with a warning. The end of the log is reached when a
  fetch at or beyond the high watermark returns no batch.
- Timestamps: LogAppendTime batches give every record the batch's max timestamp.
- ``kafka.isolation.level=read_committed``: fetches stop at the last stable offset (the end of
  the log for data-loss checks) and the batches of aborted transactions are dropped
  (``committed_spans``); offsets they held are gaps.
- No progress for ``poll_timeout_ms`` raises ``RequestTimedOut``; retriable errors (leader
  moved, connection lost) reconnect through Metadata until then.

Nothing is committed and no group is joined. Each call owns its client and its prefetch
thread, which alone touches the client; batches cross to the caller through a bounded queue.
A range read to its end releases the client's connection to the process's idle pool (the
worker's next task reuses it); one stopped early or failed closes it. Calls share only that
pool and the buffer pools, which are thread-safe and never hand out a connection in use or a
region still referenced, so concurrent tasks are safe. When the caller stops early the thread
exits after its current fetch.
"""

from __future__ import annotations

import queue
import struct
import threading
import time
from collections.abc import Callable, Generator, Iterator

import numpy as np
import pyarrow as pa

from headrace.errors import (
    KafkaError,
    OffsetOutOfRange,
    RequestTimedOut,
    UnknownTopicOrPartition,
    error_for_code,
)
from headrace.protocol.batch import BATCH_HEADER_BYTES, CURRENT_MAGIC, parse_header, peek_magic
from headrace.protocol.buffers import RegionPool
from headrace.protocol.control_records import marker_of_batch
from headrace.protocol.kernel import decode_columns
from headrace.spark.columns import ArrowBatchDecoder, arrow_chunks, record_columns_to_arrow
from headrace.spark.offsets import OffsetRange, report_data_loss
from headrace.spark.options import SourceOptions
from headrace.spark.wire_fetch import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    NO_ERROR,
    READ_COMMITTED,
    FetchClientConfig,
    FetchedPartition,
    PartitionFetchClient,
)
from headrace.storage.clock import Clock, SystemClock

RETRY_BACKOFF_MS = 100  # Kafka's retry.backoff.ms
# Keys + values per Arrow batch handed to Spark: one default-sized Fetch response (16k rows of
# 1 KiB) -- larger batches cost Spark's JVM less per row than 4 MiB ones (measured: see
# wire_fetch.DEFAULT_MAX_PARTITION_FETCH_BYTES).
ARROW_BATCH_MAX_BYTES = 16 * 1024 * 1024
PREFETCHED_ARROW_BATCHES = 4  # decoded ahead of Spark per task
# Column buffer regions the process keeps for reuse: the queued batches' and the one Spark is
# writing, plus the one being decoded (each backs one Fetch response's batches) -- a Spark
# Python worker runs one task at a time, and keeps them from one task to the next. Each holds
# up to twice a response's bytes, of which only the pages written become resident.
COLUMN_REGIONS = PREFETCHED_ARROW_BATCHES + 2
_COLUMN_BUFFERS = RegionPool(COLUMN_REGIONS)
PREFETCH_STOP_POLL_MS = 100  # how often a prefetch thread blocked on a full queue checks stop
LOG_OVERHEAD_BYTES = 12  # base offset + batch length
_BATCH_PREFIX = struct.Struct(">qi")  # base offset, batch length
_LAST_OFFSET_DELTA = struct.Struct(">i")
_LAST_OFFSET_DELTA_POSITION = 23


def read_range(options: SourceOptions, offset_range: OffsetRange,
               clock: Clock | None = None) -> Iterator[pa.RecordBatch]:
    reader = _RangeReader(options, offset_range, clock or SystemClock())
    prefetcher = _Prefetcher(reader.batches, reader.client.close,
                             f"headrace-fetch-{offset_range.topic}-{offset_range.partition}")
    try:
        yield from prefetcher.items()
    finally:
        prefetcher.stop()


class _Failure:
    """An exception raised on the prefetch thread, re-raised to the caller."""

    def __init__(self, error: BaseException) -> None:
        self.error = error


_END_OF_ITEMS = object()


class _Prefetcher:
    """Runs ``produce()`` on its own thread, ``PREFETCHED_ARROW_BATCHES`` items ahead of the
    consumer of ``items()``; ``close()`` runs on that thread when it finishes."""

    def __init__(self, produce: Callable[[], Iterator], close: Callable[[], None],
                 thread_name: str) -> None:
        self._queue: queue.Queue = queue.Queue(maxsize=PREFETCHED_ARROW_BATCHES)
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(produce, close),
                                        name=thread_name, daemon=True)
        self._thread.start()

    def _run(self, produce: Callable[[], Iterator], close: Callable[[], None]) -> None:
        try:
            for item in produce():
                if not self._put(item):
                    return
            self._put(_END_OF_ITEMS)
        except BaseException as error:  # noqa: BLE001 -- handed to the consumer's thread
            self._put(_Failure(error))
        finally:
            close()

    def _put(self, item: object) -> bool:
        """Queue ``item``; False when the consumer stopped first."""
        while not self._stopping.is_set():
            try:
                self._queue.put(item, timeout=PREFETCH_STOP_POLL_MS / 1000)
                return True
            except queue.Full:
                continue
        return False

    def items(self) -> Iterator:
        while True:
            item = self._queue.get()
            if item is _END_OF_ITEMS:
                return
            if isinstance(item, _Failure):
                raise item.error
            yield item

    def stop(self) -> None:
        """The consumer is done: the thread exits at its next queue put (or when done)."""
        self._stopping.set()


def next_fetch_offset(records: memoryview, position: int,
                      until_offset: int | None = None) -> tuple[int, int]:
    """(offset after the last whole batch or ``position`` if none, bytes of those batches),
    from the batch headers alone; batches starting at or after ``until_offset`` are left out
    (so a short range does not decode a whole large response)."""
    consumed = 0
    next_offset = position
    while len(records) - consumed >= BATCH_HEADER_BYTES:
        base_offset, batch_length = _BATCH_PREFIX.unpack_from(records, consumed)
        batch_end = consumed + LOG_OVERHEAD_BYTES + batch_length
        if batch_end > len(records) or (until_offset is not None and consumed
                                         and base_offset >= until_offset):
            break
        (delta,) = _LAST_OFFSET_DELTA.unpack_from(records, consumed + _LAST_OFFSET_DELTA_POSITION)
        next_offset = base_offset + delta + 1
        consumed = batch_end
    return next_offset, consumed


def committed_spans(records: memoryview,
                    aborted_transactions: tuple[tuple[int, int], ...]) -> list[tuple[int, int]]:
    """Byte spans ``[start, end)`` of ``records`` (whole batches of a read_committed Fetch
    response) without the batches of aborted transactions, decided as Kafka's consumer does
    (``CompletedFetch``): a producer's transaction counts as aborted from the first offset
    the response's ``(producer id, first offset)`` list gives, for transactional batches with
    that producer id, until that producer's abort marker. Control batches are kept (the
    record kernel skips them) so spans stay as long as they can be."""
    pending = sorted(aborted_transactions, key=lambda aborted: aborted[1])
    next_pending = 0
    aborted_producers: set[int] = set()
    spans: list[tuple[int, int]] = []
    position = 0
    while position < len(records):
        end = position + _first_batch_bytes(records[position:])
        keep = True
        if peek_magic(records, position) == CURRENT_MAGIC:
            header = parse_header(records, position)
            while (next_pending < len(pending) and header.producer_id >= 0
                   and pending[next_pending][1] <= header.last_offset):
                aborted_producers.add(pending[next_pending][0])
                next_pending += 1
            if header.is_control:
                marker = marker_of_batch(records, position)
                if marker is not None and not marker.commit:
                    aborted_producers.discard(header.producer_id)
            else:
                keep = not (header.is_transactional
                            and header.producer_id in aborted_producers)
        if keep and spans and spans[-1][1] == position:
            spans[-1] = (spans[-1][0], end)
        elif keep:
            spans.append((position, end))
        position = end
    return spans


def _first_batch_bytes(records: memoryview) -> int:
    _, batch_length = _BATCH_PREFIX.unpack_from(records, 0)
    return LOG_OVERHEAD_BYTES + batch_length


class _RangeReader:
    """The fetch loop of one range; ``position`` is the next offset wanted."""

    def __init__(self, options: SourceOptions, offset_range: OffsetRange, clock: Clock) -> None:
        self.options = options
        self.range = offset_range
        self.clock = clock
        self.client = PartitionFetchClient(
            FetchClientConfig.from_client_options(options.client_dict()),
            offset_range.topic, offset_range.partition)
        self.position = offset_range.from_offset
        self.last_progress_ms = clock.monotonic_ms()
        self.in_flight_offset: int | None = None
        self._decoder = None if options.include_headers else ArrowBatchDecoder(
            offset_range.topic, offset_range.partition, _COLUMN_BUFFERS)

    @property
    def _name(self) -> str:
        return f"{self.range.topic}-{self.range.partition}"

    def batches(self) -> Iterator[pa.RecordBatch]:
        while self.position < self.range.until_offset:
            finished = yield from self._batches_of_next_response()
            if finished:
                break
        self.client.release()  # read to the end: the connection serves the next task

    def _batches_of_next_response(self) -> Generator[pa.RecordBatch, None, bool]:
        """The batches of the next Fetch response; returns True once the range is finished.
        The response (a view of the client's reused receive buffer) is released on return,
        before the next one is received."""
        response = self._fetch()
        if response is None:
            return True
        if response.error_code != NO_ERROR:
            return not self._handle_error(response.error_code)
        next_offset, whole_bytes = next_fetch_offset(response.records, self.position,
                                                    self.range.until_offset)
        if whole_bytes == 0:
            return not self._handle_empty(response)
        start_position = self.position
        self._advance(next_offset)
        records = response.records[:whole_bytes]
        if not response.aborted_transactions:
            yield from self._arrow_batches(records, start_position)
            return False
        for start, end in committed_spans(records, response.aborted_transactions):
            yield from self._arrow_batches(records[start:end], start_position)
        return False

    def _fetch(self) -> FetchedPartition | None:
        """The response for ``position`` (the one in flight if it asked for it); None when
        the partition is unknown and that loss is tolerated."""
        while True:
            try:
                if self.in_flight_offset != self.position:
                    self._discard_in_flight()
                    self.client.send_fetch(self.position)
                self.in_flight_offset = None
                return self.client.receive_fetch()
            except UnknownTopicOrPartition as error:
                self._data_loss_unknown(error)
                return None
            except (OSError, KafkaError) as error:
                if isinstance(error, KafkaError) and not error.retriable:
                    raise
                self._reconnect(error)

    def _discard_in_flight(self) -> None:
        if self.in_flight_offset is not None:
            self.in_flight_offset = None
            self.client.receive_fetch()

    def _advance(self, next_offset: int) -> None:
        """Move past the whole batches just received and pipeline the next Fetch."""
        self.position = next_offset
        self.last_progress_ms = self.clock.monotonic_ms()
        if next_offset < self.range.until_offset:
            try:
                self.client.send_fetch(next_offset)
                self.in_flight_offset = next_offset
            except OSError:
                self.in_flight_offset = None  # _fetch reconnects

    def _arrow_batches(self, records: memoryview, start_position: int
                       ) -> Iterator[pa.RecordBatch]:
        max_records = self.options.records_per_arrow_batch
        if self._decoder is not None:
            yield from self._decoder.decode(records, start_position, self.range.until_offset,
                                            max_records, ARROW_BATCH_MAX_BYTES)
            return
        columns = decode_columns(records)
        start = int(np.searchsorted(columns.offsets, start_position, "left"))
        stop = int(np.searchsorted(columns.offsets, self.range.until_offset, "left"))
        record_bytes_before = columns.key_offsets.astype(np.int64) + columns.value_offsets
        for chunk_start, chunk_stop in arrow_chunks(record_bytes_before, start, stop,
                                                    max_records, ARROW_BATCH_MAX_BYTES):
            yield record_columns_to_arrow(columns, self.range.topic, self.range.partition,
                                          self.options.include_headers, chunk_start, chunk_stop)

    def _handle_empty(self, response: FetchedPartition) -> bool:
        """No whole batch: the end of the log, a batch too large, or nothing yet.
        False once the range is finished."""
        if len(response.records):
            self.client.grow_partition_fetch_bytes(_first_batch_bytes(response.records))
            return True
        log_end = (response.last_stable_offset
                   if self.client.config.isolation_level == READ_COMMITTED
                   else response.high_watermark)
        if self.position >= log_end >= 0:
            self._data_loss_at_log_end(self.position)
            return False
        self._check_timeout()
        return True

    def _handle_error(self, error_code: int) -> bool:
        """React to a partition error; False once the range is finished."""
        if error_code == OffsetOutOfRange.code:
            return self._out_of_range()
        if error_code == UnknownTopicOrPartition.code:
            self._data_loss_unknown(UnknownTopicOrPartition(f"Fetch for {self._name}"))
            return False
        error = error_for_code(error_code, f"Fetch for {self._name} at offset {self.position}")
        if not error.retriable:
            raise error
        self._reconnect(error)
        return True

    def _out_of_range(self) -> bool:
        log_start = self.client.list_offset(EARLIEST_TIMESTAMP)
        if self.position < log_start:
            report_data_loss(
                f"Cannot fetch offset {self.position} of {self._name}: the log starts at "
                f"{log_start}", self.options.fail_on_data_loss)
            self.position = log_start
            return True
        log_end = self.client.list_offset(LATEST_TIMESTAMP)
        if self.position >= log_end:
            self._data_loss_at_log_end(self.position)
            return False
        self._check_timeout()
        return True

    def _data_loss_at_log_end(self, log_end_offset: int) -> None:
        if log_end_offset < self.range.until_offset:
            report_data_loss(
                f"Cannot fetch offsets [{log_end_offset}, {self.range.until_offset}) of "
                f"{self._name}: the log ends at {log_end_offset}",
                self.options.fail_on_data_loss)

    def _data_loss_unknown(self, error: KafkaError) -> None:
        report_data_loss(
            f"Cannot fetch {self._name} [{self.position}, {self.range.until_offset}): {error}",
            self.options.fail_on_data_loss, UnknownTopicOrPartition)

    def _reconnect(self, cause: Exception) -> None:
        """Drop the connection after a retriable failure; the next request reconnects."""
        self._check_timeout(cause)
        self.in_flight_offset = None
        self.client.close()
        time.sleep(RETRY_BACKOFF_MS / 1000)

    def _check_timeout(self, cause: Exception | None = None) -> None:
        waited_ms = self.clock.monotonic_ms() - self.last_progress_ms
        if waited_ms > self.options.poll_timeout_ms:
            detail = f" (last error: {cause})" if cause is not None else ""
            raise RequestTimedOut(
                f"no records for {self._name} at or after offset {self.position} within "
                f"{self.options.poll_timeout_ms} ms{detail}")
