"""A transactional copier in its own process, after Kafka's TransactionalMessageCopier: the
consume-transform-produce loop of Kafka's transactions system test, on confluent-kafka.

Subscribes to ``--input`` (read_committed), and for every batch of up to ``--batch-records``
records: begins a transaction, produces each value to the same partition of ``--output``,
sends the consumed positions to the transaction (``send_offsets_to_transaction`` with the
group's metadata) and commits. Any other than a fatal error (a broker restart, a rebalance,
a timeout) aborts the transaction and rewinds the consumer to the group's committed offsets,
as Kafka's copier does; a fatal one (PRODUCER_FENCED), a failed abort, or a hung
send_offsets_to_transaction (see HUNG_CALL_EXIT_S), exits non-zero. SIGTERM stops it after the current transaction. Prints
"started" once subscribed. Run: python copier_child.py --help.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

TIMEOUT_S = 10.0
# librdkafka 2.16's send_offsets_to_transaction can block past its timeout once the group
# coordinator it cached was decommissioned by a re-bootstrap (a broker restart):
# confluentinc/librdkafka#5456 and #5511. The copier then exits with this status and a new
# one (the same transactional.id, fencing this one) takes over, as restarting the client is
# the only way out.
HUNG_CALL_EXIT_S = 2 * TIMEOUT_S
HUNG_CALL_EXIT_STATUS = 3
POLL_TIMEOUT_S = 0.5


def _rewind(consumer: Consumer) -> None:
    """Back to the committed positions: the aborted transaction's records are read again."""
    assignment = consumer.assignment()
    if not assignment:
        return
    for committed in consumer.committed(assignment, TIMEOUT_S):
        offset = committed.offset if committed.offset >= 0 else 0
        consumer.seek(TopicPartition(committed.topic, committed.partition, offset))


def _copy_batch(consumer: Consumer, producer: Producer, output: str, records: int,
                transform_ms: int) -> None:
    messages = [m for m in consumer.consume(records, POLL_TIMEOUT_S) if m.error() is None]
    if not messages:
        return
    producer.begin_transaction()
    try:
        for message in messages:
            producer.produce(output, message.value(), key=message.key(),
                             partition=message.partition())
        producer.flush(TIMEOUT_S)
        time.sleep(transform_ms / 1000)  # the workload's transform time, not a synchronisation
        positions = consumer.position(consumer.assignment())
        watchdog = threading.Timer(HUNG_CALL_EXIT_S, os._exit, args=(HUNG_CALL_EXIT_STATUS,))
        watchdog.start()
        try:
            producer.send_offsets_to_transaction(
                [tp for tp in positions if tp.offset >= 0], consumer.consumer_group_metadata(),
                TIMEOUT_S)
        finally:
            watchdog.cancel()
        producer.commit_transaction(TIMEOUT_S)
    except KafkaException as error:
        if error.args[0].fatal():
            raise
        producer.abort_transaction(TIMEOUT_S)
        _rewind(consumer)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--transactional-id", required=True)
    parser.add_argument("--batch-records", type=int, default=50)
    parser.add_argument("--session-timeout-ms", type=int, default=1000)
    parser.add_argument("--transform-ms", type=int, default=0,
                        help="time each transaction's transform takes, records produced")
    args = parser.parse_args()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = Consumer({"bootstrap.servers": args.bootstrap, "group.id": args.group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed",
                         "session.timeout.ms": args.session_timeout_ms,
                         "heartbeat.interval.ms": max(100, args.session_timeout_ms // 3)})
    producer = Producer({"bootstrap.servers": args.bootstrap,
                         "transactional.id": args.transactional_id})
    producer.init_transactions(TIMEOUT_S)
    consumer.subscribe([args.input])
    print("started", flush=True)
    while not stop.is_set():
        _copy_batch(consumer, producer, args.output, args.batch_records, args.transform_ms)
    consumer.close()


if __name__ == "__main__":
    sys.exit(main())
