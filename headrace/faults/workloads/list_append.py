"""The list-append workload: each partition is a list; appends add unique values, reads return
the whole partition.

One appender (an idempotent confluent-kafka producer, acks=all, at most ``max_in_flight``
unacknowledged, ``max_appends`` in all) appends ``a-<n>`` round-robin over the partitions: an
``invoke`` append, then ``ok`` with its offset or ``info``. One reader reads the partitions in
turn: an ``invoke`` read, then the high watermark, then every record from offset 0 up to it,
recorded as ``ok`` with ``[[offset, value], ...]`` (or ``info`` if it cannot finish within
``read_timeout_s``). After healing, ``final-read`` reads each partition once more.

Judged by ``checkers.list_append``. Thread-safety: one thread per client; the history is
shared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from headrace.faults.checkers import list_append as list_append_checker
from headrace.faults.history import INFO, INVOKE, OK, History
from headrace.faults.namespace import Namespace
from headrace.faults.workloads import CLIENT_SETTINGS, Workload, WriterSettings, create_topic

READ_POLL_TIMEOUT_S = 0.1
READ_BATCH_RECORDS = 1_000
WATERMARK_TIMEOUT_S = 2.0
FINAL_READ_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class ListAppendConfig:
    topic: str = "faults-list-append"
    partitions: int = 2
    max_appends: int = 20_000
    max_in_flight: int = 10
    message_timeout_ms: int = 20_000
    read_timeout_s: float = 5.0


class PartitionReadTimeout(Exception):
    pass


class ListAppendWorkload(Workload):
    def __init__(self, bootstrap: str, history: History, namespace: Namespace | None,
                 config: ListAppendConfig = ListAppendConfig(),
                 unsynced_loss_allowed: bool = False) -> None:
        super().__init__(bootstrap, history, namespace)
        self.config = config
        self.unsynced_loss_allowed = unsynced_loss_allowed

    def setup(self) -> None:
        self.in_namespace(lambda: create_topic(self.bootstrap, self.config.topic,
                                               self.config.partitions), 60)

    def start(self) -> None:
        self.spawn("appender", self._append)
        self.spawn("reader", self._read_until_stopped)

    def _append(self) -> None:
        self.write_unique_values("appender", "append", WriterSettings(
            self.config.topic, self.config.partitions, "a-", True, self.config.max_appends,
            self.config.max_in_flight, self.config.message_timeout_ms))

    def _reader(self) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": "faults-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         **CLIENT_SETTINGS})

    def _read_until_stopped(self) -> None:
        consumer = self._reader()
        try:
            partition = 0
            while not self.stopping.is_set():
                self._read("reader", consumer, partition, self.config.read_timeout_s)
                partition = (partition + 1) % self.config.partitions
        finally:
            consumer.close()

    def _read(self, process: str, consumer: Consumer, partition: int, timeout_s: float) -> None:
        self.history.record(INVOKE, process, "read", partition=partition)
        try:
            entries = self._whole_partition(consumer, partition, timeout_s)
        except (KafkaException, PartitionReadTimeout) as error:
            self.history.record(INFO, process, "read", partition=partition, error=str(error))
            return
        self.history.record(OK, process, "read", entries, partition=partition)

    def _whole_partition(self, consumer: Consumer, partition: int,
                         timeout_s: float) -> list[list]:
        deadline = time.monotonic() + timeout_s
        topic_partition = TopicPartition(self.config.topic, partition)
        _, high = consumer.get_watermark_offsets(topic_partition, WATERMARK_TIMEOUT_S,
                                                 cached=False)
        entries: list[list] = []
        if high <= 0:
            return entries
        consumer.assign([TopicPartition(self.config.topic, partition, OFFSET_BEGINNING)])
        try:
            while not entries or entries[-1][0] + 1 < high:
                if time.monotonic() > deadline:
                    raise PartitionReadTimeout(
                        f"partition {partition}: {len(entries)} records of {high} in "
                        f"{timeout_s} s")
                for message in consumer.consume(READ_BATCH_RECORDS, READ_POLL_TIMEOUT_S):
                    if message.error() is None and message.offset() < high:
                        entries.append([message.offset(), message.value().decode()])
        finally:
            consumer.unassign()
        return entries

    def final_reads(self) -> None:
        def read_all() -> None:
            consumer = self._reader()
            try:
                for partition in range(self.config.partitions):
                    self._read("final-read", consumer, partition, FINAL_READ_TIMEOUT_S)
            finally:
                consumer.close()

        self.in_namespace(read_all, FINAL_READ_TIMEOUT_S * self.config.partitions + 30)
        finished = {op.partition for op in self.history.ops()
                    if op.process == "final-read" and op.type == OK}
        if len(finished) < self.config.partitions:
            raise RuntimeError(f"final reads finished for partitions {sorted(finished)} only")

    def check(self, ops) -> list_append_checker.ListAppendResult:
        return list_append_checker.check(ops, list_append_checker.ListAppendExpectations(
            unsynced_loss_allowed=self.unsynced_loss_allowed))
