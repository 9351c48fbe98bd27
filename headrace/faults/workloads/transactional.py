"""The transactional workload: transactional producers that read, then write, then commit or
abort; read_committed consumers; a read_committed drain after healing.

Each of ``producers`` processes (``txn-<n>``: one thread, one confluent-kafka producer with
``transactional.id`` ``faults-txn-<n>``, and its own read_committed consumer assigned every
partition from the start) repeats, at most ``max_transactions`` times: poll its consumer once
(the records returned are the transaction's reads), then begin a transaction, send 1 to
``max_sends_per_transaction`` unique values (``<process>-<n>``) to seeded partitions, flush,
and commit, or abort with probability ``abort_probability`` (seeded per process). Each
transaction is one ``txn`` operation (``checkers.transactions`` has the value format):
``ok`` when the commit returned, ``fail`` only when the abort returned (certainly aborted),
``info`` otherwise (the outcome is unknown; a producer whose error is fatal is replaced by a
new one with the same transactional.id, which fences the old one).

``consumer-assign`` and ``consumer-subscribe`` poll as in the queue workload, read_committed.
The drain (process ``drain``) reads every partition from its start until its position passes
the high watermark it found (transaction markers are not delivered, so position, not the last
record's offset, tells the end), bounded by ``drain_timeout_s``.

Judged by ``checkers.transactions``. The transaction coordinator is single-node for now: the
runner offers this workload on the one-node target. Thread-safety: one thread per client.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, KafkaException, Producer, TopicPartition

from headrace.faults.checkers import transactions as transactions_checker
from headrace.faults.checkers.queue import DRAIN_PROCESS
from headrace.faults.history import FAIL, INFO, INVOKE, OK, History
from headrace.faults.namespace import Namespace
from headrace.faults.workloads import CLIENT_SETTINGS
from headrace.faults.workloads.queue import QueueConfig, QueueWorkload

READS_PER_TRANSACTION = 50
READ_TIMEOUT_S = 0.05
WATERMARK_TIMEOUT_S = 5.0


@dataclass(frozen=True)
class TransactionalConfig:
    topic: str = "faults-txn"
    partitions: int = 2
    producers: int = 2
    max_transactions: int = 5_000
    max_sends_per_transaction: int = 3
    abort_probability: float = 0.25
    transaction_timeout_ms: int = 10_000
    operation_timeout_s: float = 15.0
    session_timeout_ms: int = 6_000
    drain_timeout_s: float = 60.0
    seed: int = 0


class TransactionalWorkload(QueueWorkload):
    def __init__(self, bootstrap: str, history: History, namespace: Namespace | None,
                 config: TransactionalConfig = TransactionalConfig()) -> None:
        super().__init__(bootstrap, history, namespace, QueueConfig(
            topic=config.topic, partitions=config.partitions, producers_idempotent=(),
            session_timeout_ms=config.session_timeout_ms,
            drain_timeout_s=config.drain_timeout_s))
        self.transactional = config

    def start(self) -> None:
        for number in range(self.transactional.producers):
            self.spawn(f"txn-{number}", lambda n=number: self._transact(n))
        self.spawn("consumer-assign", self._consume_by_assign)
        self.spawn("consumer-subscribe", self._consume_by_subscribe)

    def _consumer(self, group_id: str, **settings):
        return super()._consumer(group_id, **{"isolation.level": "read_committed", **settings})

    def _producer(self, process: str) -> Producer:
        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                             "enable.idempotence": True, "linger.ms": 0,
                             "transactional.id": f"faults-{process}",
                             "transaction.timeout.ms": self.transactional.transaction_timeout_ms,
                             "message.timeout.ms": self.transactional.transaction_timeout_ms,
                             **CLIENT_SETTINGS})
        producer.init_transactions(self.transactional.operation_timeout_s)
        return producer

    def _transact(self, number: int) -> None:
        process = f"txn-{number}"
        rng = random.Random(f"{self.transactional.seed}-{process}")
        reader = self._consumer(f"faults-{process}", **{"enable.auto.commit": False})
        reader.assign([TopicPartition(self.config.topic, p, OFFSET_BEGINNING)
                       for p in range(self.config.partitions)])
        producer: Producer | None = None
        try:
            for sequence in range(self.transactional.max_transactions):
                if self.stopping.is_set():
                    break
                if producer is None:
                    producer = self._open_producer(process)
                    if producer is None:
                        continue
                reads = [[m.partition(), m.offset(), m.value().decode()]
                         for m in reader.consume(READS_PER_TRANSACTION, READ_TIMEOUT_S)
                         if m.error() is None]
                sends = [[rng.randrange(self.config.partitions), f"{process}-{sequence}-{k}"]
                         for k in range(rng.randint(1, self.transactional.max_sends_per_transaction))]
                abort = rng.random() < self.transactional.abort_probability
                if not self._one_transaction(process, producer, sends, reads, abort):
                    producer = None
        finally:
            reader.close()

    def _open_producer(self, process: str) -> Producer | None:
        try:
            return self._producer(process)
        except KafkaException as error:
            self.history.record(INFO, process, "init-transactions", error=str(error))
            self.stopping.wait(1.0)  # bounded: retried on the next turn of a bounded loop
            return None

    def _one_transaction(self, process: str, producer: Producer, sends: list, reads: list,
                         abort: bool) -> bool:
        """Run one transaction and record it; False when the producer must be replaced."""
        offsets: dict[str, int] = {}

        def delivered(error, message) -> None:
            if error is None:
                offsets[message.value().decode()] = message.offset()

        self.history.record(INVOKE, process, "txn",
                            {"sends": [[p, v, None] for p, v in sends], "reads": reads})
        timeout_s = self.transactional.operation_timeout_s
        try:
            producer.begin_transaction()
            for partition, value in sends:
                producer.produce(self.config.topic, value.encode(), partition=partition,
                                 on_delivery=self.reporting_errors(process)(delivered))
            producer.flush(timeout_s)
            if abort:
                producer.abort_transaction(timeout_s)
            else:
                producer.commit_transaction(timeout_s)
        except KafkaException as failure:
            return self._after_failure(process, producer, sends, reads, offsets, failure)
        outcome = FAIL if abort else OK
        self.history.record(outcome, process, "txn", self._value(sends, reads, offsets))
        return True

    def _after_failure(self, process, producer, sends, reads, offsets, failure) -> bool:
        error = failure.args[0]
        if error.txn_requires_abort():
            try:
                producer.abort_transaction(self.transactional.operation_timeout_s)
            except KafkaException:
                pass
            else:
                self.history.record(FAIL, process, "txn", self._value(sends, reads, offsets),
                                    error=str(error.name()))
                return True
        self.history.record(INFO, process, "txn", self._value(sends, reads, offsets),
                            error=str(error.name()))
        return not error.fatal() and error.retriable()

    @staticmethod
    def _value(sends, reads, offsets) -> dict:
        return {"sends": [[p, v, offsets.get(v)] for p, v in sends], "reads": reads}

    def _drain(self) -> None:
        """Read every partition from its start until the consumer's position passes the high
        watermark found first, bounded by ``drain_timeout_s``."""
        consumer = self._consumer("faults-drain", **{"enable.auto.commit": False})
        try:
            deadline = time.monotonic() + self.config.drain_timeout_s
            ends = {}
            for partition in range(self.config.partitions):
                _, high = consumer.get_watermark_offsets(
                    TopicPartition(self.config.topic, partition), WATERMARK_TIMEOUT_S)
                if high > 0:
                    ends[partition] = high
            consumer.assign([TopicPartition(self.config.topic, p, OFFSET_BEGINNING)
                             for p in ends])
            while ends:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"drain did not pass the high watermarks {ends} in "
                                       f"{self.config.drain_timeout_s} s")
                self._poll_once(DRAIN_PROCESS, consumer)
                for position in consumer.position([TopicPartition(self.config.topic, p)
                                                   for p in list(ends)]):
                    if position.offset >= ends.get(position.partition, 0):
                        ends.pop(position.partition, None)
        except KafkaException as error:
            raise RuntimeError(f"drain failed: {error}") from error
        finally:
            consumer.close()

    def check(self, ops) -> transactions_checker.TransactionsResult:
        return transactions_checker.check(ops)
