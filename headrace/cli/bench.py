"""``headrace bench produce|consume``: quick load tests against any Kafka-compatible cluster.

``produce`` writes ``--records`` records of ``--record-size-bytes`` random bytes (one random
block reused, so the generator costs nothing) to a topic, creating it with ``--partitions`` if
missing, and waits for every delivery report. ``consume`` reads ``--records`` records (default:
everything up to the high watermarks) from the beginning of every partition, without a group.
Both show a progress bar on stderr and report records/s and MB/s (1 MB = 10^6 bytes of
values) measured with a monotonic clock from the first send/poll to the last
delivery/record. For careful comparisons with a peer broker use ``bench/`` and
``../shared/bench/kbench.py``; this command is for a quick look.

Stateless; runs on the main thread (delivery callbacks run inside ``poll``/``flush``).
"""

from __future__ import annotations

import os
import time
from typing import Annotated

import typer
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import NewTopic
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    Connection,
    OutputFormat,
    OutputOption,
    UserError,
    connection_options,
    describe_kafka_error,
    emit,
    make_table,
    topic_partitions,
    user_errors,
    wait_all,
)
from headrace.cli.produce import Acks, Codec, DeliveryTally

DEFAULT_RECORDS = 100_000
DEFAULT_RECORD_SIZE_BYTES = 100
BYTES_PER_MB = 1_000_000
PROGRESS_EVERY_RECORDS = 1000
QUEUE_FULL_WAIT_S = 0.05
CONSUME_POLL_S = 0.5
CONSUME_BATCH_MESSAGES = 1000

app = typer.Typer(no_args_is_help=True, help="Quick produce/consume load tests.")


def _progress() -> Progress:
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), console=Console(stderr=True), transient=True)


def _report(output: OutputFormat, phase: str, records: int, value_bytes: int,
            elapsed_s: float) -> None:
    elapsed_s = max(elapsed_s, 1e-9)
    data = {
        "phase": phase, "records": records, "bytes": value_bytes,
        "elapsed_s": round(elapsed_s, 3),
        "records_per_s": round(records / elapsed_s, 1),
        "mb_per_s": round(value_bytes / BYTES_PER_MB / elapsed_s, 2),
    }
    emit(output, data, make_table(f"bench {phase}", list(data), [list(data.values())]))


def _ensure_topic(connection: Connection, topic: str, partitions: int) -> None:
    admin, metadata = connection.admin()
    if topic not in metadata.topics:
        futures = admin.create_topics([NewTopic(topic, partitions, 1)],
                                      request_timeout=connection.request_timeout_s)
        wait_all(futures, connection.request_timeout_ms)


@app.command("produce")
@connection_options
def bench_produce(
    topic: Annotated[str, typer.Argument(help="topic (created if missing)")],
    records: Annotated[int, typer.Option("--records", "-n", min=1)] = DEFAULT_RECORDS,
    record_size_bytes: Annotated[
        int, typer.Option("--record-size-bytes", "-s", min=0)
    ] = DEFAULT_RECORD_SIZE_BYTES,
    partitions: Annotated[
        int, typer.Option("--partitions", "-p", min=1, help="when creating the topic")
    ] = 1,
    acks: Annotated[Acks, typer.Option("--acks")] = Acks.all,
    compression: Annotated[Codec, typer.Option("--compression", "-z")] = Codec.none,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Produce records as fast as possible and report the throughput."""
    with user_errors():
        _ensure_topic(connection, topic, partitions)
        producer = Producer(connection.client_config(**{
            "acks": acks.value, "compression.type": compression.value,
            "linger.ms": 5, "message.timeout.ms": connection.request_timeout_ms,
        }))
        value = os.urandom(record_size_bytes)
        tally = DeliveryTally()
        started_s = time.monotonic()
        with _progress() as progress:
            task = progress.add_task("produce", total=records)
            for sent in range(1, records + 1):
                _produce_one(producer, topic, value, tally)
                if sent % PROGRESS_EVERY_RECORDS == 0:
                    producer.poll(0)
                    progress.update(task, completed=tally.delivered)
            while len(producer) and tally.failed == 0:
                producer.poll(QUEUE_FULL_WAIT_S)
                progress.update(task, completed=tally.delivered)
        elapsed_s = time.monotonic() - started_s
        if tally.failed:
            raise UserError(f"{tally.failed} records not delivered: "
                            f"{describe_kafka_error(tally.first_error)}")
        _report(output, "produce", records, records * record_size_bytes, elapsed_s)


def _produce_one(producer: Producer, topic: str, value: bytes, tally: DeliveryTally) -> None:
    while True:
        try:
            producer.produce(topic, value, on_delivery=tally.on_delivery)
            return
        except BufferError:
            producer.poll(QUEUE_FULL_WAIT_S)


@app.command("consume")
@connection_options
def bench_consume(
    topic: Annotated[str, typer.Argument(help="topic to read from the beginning")],
    records: Annotated[
        int | None, typer.Option("--records", "-n", min=1, help="default: up to the end")
    ] = None,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Read records from the beginning as fast as possible and report the throughput."""
    with user_errors():
        consumer = Consumer(connection.client_config(**{
            "group.id": "headrace-bench", "enable.auto.commit": False,
        }))
        try:
            metadata = connection.fetch_metadata(consumer)
            assignment = [TopicPartition(topic, partition_id, OFFSET_BEGINNING)
                          for partition_id in topic_partitions(metadata, topic)]
            target = records if records is not None else \
                _records_available(consumer, assignment, connection.request_timeout_ms)
            consumer.assign(assignment)
            count, value_bytes, elapsed_s = _consume_count(
                consumer, target, connection.request_timeout_ms)
        finally:
            consumer.close()
        _report(output, "consume", count, value_bytes, elapsed_s)


def _records_available(consumer: Consumer, assignment: list[TopicPartition],
                       request_timeout_ms: int) -> int:
    total = 0
    for topic_partition in assignment:
        low, high = consumer.get_watermark_offsets(topic_partition,
                                                   timeout=request_timeout_ms / 1000)
        total += high - low
    if total == 0:
        raise UserError(f"topic {assignment[0].topic!r} is empty")
    return total


def _consume_count(consumer: Consumer, target: int, request_timeout_ms: int
                   ) -> tuple[int, int, float]:
    """Consume ``target`` records; a stall longer than the request timeout is an error."""
    count = value_bytes = 0
    started_s = last_record_s = time.monotonic()
    with _progress() as progress:
        task = progress.add_task("consume", total=target)
        while count < target:
            messages = consumer.consume(min(CONSUME_BATCH_MESSAGES, target - count),
                                        CONSUME_POLL_S)
            for message in messages:
                error = message.error()
                if error is not None and not error.retriable() and \
                        error.code() != KafkaError._PARTITION_EOF:
                    raise UserError(describe_kafka_error(error))
                if error is None:
                    count += 1
                    value_bytes += len(message.value() or b"")
            now_s = time.monotonic()
            if messages:
                last_record_s = now_s
            elif (now_s - last_record_s) * 1000 > request_timeout_ms:
                raise UserError(f"no records for {request_timeout_ms} ms after {count} of "
                                f"{target}")
            progress.update(task, completed=count)
    return count, value_bytes, time.monotonic() - started_s
