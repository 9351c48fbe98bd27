"""The queue workload: producers send unique values, consumers poll them, a drain reads all.

Producers (one thread and confluent-kafka producer each, acks=all, idempotent or not as
configured) send values ``<process>-<n>`` round-robin over the topic's partitions, at most
``max_in_flight`` unacknowledged each and ``max_sends_per_producer`` in all. Every send is an
``invoke`` and then an ``ok`` with its offset, or an ``info`` (the delivery failed or timed
out: it may or may not be in the log). Two consumers poll: ``consumer-assign`` (assigned every
partition from the start) and ``consumer-subscribe`` (a group member with
``session.timeout.ms`` = ``session_timeout_ms``; each assignment and revocation is an
``assign`` info operation). Every non-empty poll is an ``ok`` poll. After the faults are
healed, ``drain`` reads every partition from its start to the high watermark.

Judged by ``checkers.queue``. Thread-safety: one thread per client; the history is shared.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from headrace.faults.checkers import queue as queue_checker
from headrace.faults.history import INFO, INVOKE, OK, History
from headrace.faults.namespace import Namespace
from headrace.faults.workloads import CLIENT_SETTINGS, Workload, WriterSettings, create_topic

POLL_BATCH_RECORDS = 500
POLL_TIMEOUT_S = 0.1
WATERMARK_TIMEOUT_S = 5.0
DRAIN_PROCESS = queue_checker.DRAIN_PROCESS


@dataclass(frozen=True)
class QueueConfig:
    topic: str = "faults-queue"
    partitions: int = 2
    producers_idempotent: tuple[bool, ...] = (True, False)
    max_sends_per_producer: int = 20_000
    max_in_flight: int = 10
    message_timeout_ms: int = 20_000
    session_timeout_ms: int = 6_000
    drain_timeout_s: float = 60.0


class QueueWorkload(Workload):
    def __init__(self, bootstrap: str, history: History, namespace: Namespace | None,
                 config: QueueConfig = QueueConfig(),
                 unsynced_loss_allowed: bool = False) -> None:
        super().__init__(bootstrap, history, namespace)
        self.config = config
        self.unsynced_loss_allowed = unsynced_loss_allowed

    def producer_processes(self) -> list[tuple[str, bool]]:
        return [(f"producer-{i}" + ("" if idempotent else "-plain"), idempotent)
                for i, idempotent in enumerate(self.config.producers_idempotent)]

    def setup(self) -> None:
        self.in_namespace(lambda: create_topic(self.bootstrap, self.config.topic,
                                               self.config.partitions), 60)

    def start(self) -> None:
        for process, idempotent in self.producer_processes():
            self.spawn(process, lambda p=process, i=idempotent: self._produce(p, i))
        self.spawn("consumer-assign", self._consume_by_assign)
        self.spawn("consumer-subscribe", self._consume_by_subscribe)

    def _produce(self, process: str, idempotent: bool) -> None:
        self.write_unique_values(process, "send", WriterSettings(
            self.config.topic, self.config.partitions, f"{process}-", idempotent,
            self.config.max_sends_per_producer, self.config.max_in_flight,
            self.config.message_timeout_ms))

    def _consumer(self, group_id: str, **settings) -> Consumer:
        return Consumer({"bootstrap.servers": self.bootstrap, "group.id": group_id,
                         "auto.offset.reset": "earliest", **CLIENT_SETTINGS, **settings})

    def _consume_by_assign(self) -> None:
        consumer = self._consumer("faults-assign", **{"enable.auto.commit": False})
        consumer.assign([TopicPartition(self.config.topic, p, OFFSET_BEGINNING)
                         for p in range(self.config.partitions)])
        self._poll_until_stopped("consumer-assign", consumer)

    def _consume_by_subscribe(self) -> None:
        process = "consumer-subscribe"
        consumer = self._consumer("faults-subscribe",
                                  **{"session.timeout.ms": self.config.session_timeout_ms})

        def on_change(change: str):
            def callback(_consumer, partitions) -> None:
                self.history.record(INFO, process, "assign",
                                    {change: sorted(p.partition for p in partitions)})
            return callback

        consumer.subscribe([self.config.topic], on_assign=on_change("assigned"),
                           on_revoke=on_change("revoked"), on_lost=on_change("lost"))
        self._poll_until_stopped(process, consumer)

    def _poll_until_stopped(self, process: str, consumer: Consumer) -> None:
        try:
            while not self.stopping.is_set():
                self._poll_once(process, consumer)
        finally:
            consumer.close()

    def _poll_once(self, process: str, consumer: Consumer) -> list:
        messages = consumer.consume(POLL_BATCH_RECORDS, POLL_TIMEOUT_S)
        records = [[m.partition(), m.offset(), m.value().decode()]
                   for m in messages if m.error() is None]
        if records:
            self.history.record(INVOKE, process, "poll")
            self.history.record(OK, process, "poll", records)
        return records

    def final_reads(self) -> None:
        self.in_namespace(self._drain, self.config.drain_timeout_s + 30)

    def _drain(self) -> None:
        """Read every partition from its start up to its high watermark, bounded in time."""
        consumer = self._consumer("faults-drain", **{"enable.auto.commit": False})
        try:
            deadline = time.monotonic() + self.config.drain_timeout_s
            remaining = {}
            for partition in range(self.config.partitions):
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(self.config.topic, partition), WATERMARK_TIMEOUT_S)
                if high > 0:
                    remaining[partition] = high
            consumer.assign([TopicPartition(self.config.topic, p, OFFSET_BEGINNING)
                             for p in remaining])
            while remaining:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"drain did not reach the high watermarks {remaining} "
                                       f"in {self.config.drain_timeout_s} s")
                for partition, offset, _ in self._poll_once(DRAIN_PROCESS, consumer):
                    if offset + 1 >= remaining.get(partition, 0):
                        remaining.pop(partition, None)
        except KafkaException as error:
            raise RuntimeError(f"drain failed: {error}") from error
        finally:
            consumer.close()

    def check(self, ops) -> queue_checker.QueueResult:
        non_idempotent = frozenset(process for process, idempotent in self.producer_processes()
                                   if not idempotent)
        return queue_checker.check(ops, queue_checker.QueueExpectations(
            non_idempotent_processes=non_idempotent,
            unsynced_loss_allowed=self.unsynced_loss_allowed))
