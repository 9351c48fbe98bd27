"""``headrace produce``: the console producer (one record per input line).

Like Kafka's ``kafka-console-producer.sh`` and ``kcat -P``: lines come from stdin or
``--file`` (the trailing newline is not part of the value); with ``--key-separator SEP`` each
line is ``key SEP value`` split at the first separator (a line without it is a user error);
``--header k=v`` adds the same headers to every record; ``--partition`` pins the partition,
otherwise the key (or librdkafka's sticky partitioner for null keys) chooses. Delivery is
bounded by ``--request-timeout-ms`` (librdkafka ``message.timeout.ms``); any record not
delivered makes the command exit non-zero after reporting how many failed.

Stateless; runs on the main thread (delivery callbacks run inside ``poll``/``flush`` there).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, BinaryIO

import typer
from confluent_kafka import KafkaError, Message, Producer

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    Connection,
    OutputFormat,
    OutputOption,
    UserError,
    connection_options,
    describe_kafka_error,
    emit,
    parse_key_values,
    topic_partitions,
    user_errors,
)

QUEUE_FULL_WAIT_S = 0.05
FLUSH_GRACE_S = 1.0  # beyond message.timeout.ms, for the last delivery reports


class Codec(StrEnum):
    none = "none"
    gzip = "gzip"
    snappy = "snappy"
    lz4 = "lz4"
    zstd = "zstd"


class Acks(StrEnum):
    none = "0"
    leader = "1"
    all = "all"
    all_numeric = "-1"


class DeliveryTally:
    """Counts delivery reports; remembers the first error to show it."""

    def __init__(self) -> None:
        self.delivered = 0
        self.failed = 0
        self.first_error: KafkaError | str = "delivery timed out"

    def on_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is None:
            self.delivered += 1
            return
        if not self.failed:
            self.first_error = error
        self.failed += 1


@connection_options
def produce(
    topic: Annotated[str, typer.Argument(help="topic to write to")],
    file: Annotated[
        Path | None, typer.Option("--file", "-f", help="read lines from this file, not stdin")
    ] = None,
    key_separator: Annotated[
        str | None, typer.Option("--key-separator", "-K", help="split each line into key SEP value")
    ] = None,
    header: Annotated[
        list[str] | None, typer.Option("--header", "-H", help="k=v header on every record")
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", "-p", min=0, help="write to this partition only")
    ] = None,
    compression: Annotated[Codec, typer.Option("--compression", "-z")] = Codec.none,
    acks: Annotated[Acks, typer.Option("--acks")] = Acks.all,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Write one record per input line (stdin, or --file); prints nothing unless
    ``--output json``, which prints the count delivered."""
    with user_errors():
        headers = list(parse_key_values(header, "--header").items())
        if key_separator == "":
            raise UserError("--key-separator must not be empty")
        producer = Producer(connection.client_config(**{
            "acks": acks.value, "compression.type": compression.value,
            "message.timeout.ms": connection.request_timeout_ms,
            "linger.ms": 5,
        }))
        _check_target(producer, connection, topic, partition)
        tally = DeliveryTally()
        with _open_input(file) as lines:
            for line_number, line in enumerate(lines, start=1):
                key, value = _split_line(line, key_separator, line_number)
                _send(producer, topic, key, value, headers, partition, tally)
        tally.failed += producer.flush(connection.request_timeout_s + FLUSH_GRACE_S)
        _report(tally, topic)
        if output is OutputFormat.json:
            emit(output, {"topic": topic, "delivered": tally.delivered})


def _check_target(
    producer: Producer, connection: Connection, topic: str, partition: int | None
) -> None:
    metadata = connection.fetch_metadata(producer, topic=topic)
    partitions = topic_partitions(metadata, topic)
    if partition is not None and partition not in partitions:
        raise UserError(f"topic {topic!r} has no partition {partition} "
                        f"(it has {len(partitions)})")


class _open_input:
    """Context manager over the input lines as bytes, without their line terminators."""

    def __init__(self, file: Path | None) -> None:
        self.file = file
        self.stream: BinaryIO | None = None

    def __enter__(self) -> Iterator[bytes]:
        self.stream = open(self.file, "rb") if self.file else sys.stdin.buffer  # noqa: SIM115
        return (line.rstrip(b"\r\n") for line in self.stream)

    def __exit__(self, *_exc) -> None:
        if self.file and self.stream is not None:
            self.stream.close()


def _split_line(
    line: bytes, key_separator: str | None, line_number: int
) -> tuple[bytes | None, bytes]:
    if key_separator is None:
        return None, line
    key, separator, value = line.partition(key_separator.encode())
    if not separator:
        raise UserError(f"line {line_number} has no key separator {key_separator!r}")
    return key, value


def _send(
    producer: Producer, topic: str, key: bytes | None, value: bytes,
    headers: list[tuple[str, str]], partition: int | None, tally: DeliveryTally,
) -> None:
    arguments = {"key": key, "value": value, "headers": headers, "on_delivery": tally.on_delivery}
    if partition is not None:
        arguments["partition"] = partition
    while True:
        try:
            producer.produce(topic, **arguments)
            producer.poll(0)
            return
        except BufferError:  # local queue full: let deliveries drain
            producer.poll(QUEUE_FULL_WAIT_S)


def _report(tally: DeliveryTally, topic: str) -> None:
    if tally.failed:
        raise UserError(
            f"{tally.failed} of {tally.failed + tally.delivered} records not delivered to "
            f"{topic!r}: {describe_kafka_error(tally.first_error)}"
        )
