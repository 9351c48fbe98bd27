"""``headrace consume``: the console consumer.

Like Kafka's ``kafka-console-consumer.sh`` and ``kcat -C``. Without ``--group`` it assigns the
partitions itself (all, or ``--partition``) and commits nothing; the start is the log end by
default, ``--from-beginning``, an absolute ``--offset N`` or the first offset at or after
``--timestamp`` (ms since the epoch or ISO 8601; a naive ISO time is UTC). With ``--group`` it
joins the group by subscribing and commits as it goes (auto-commit, and on exit);
``--from-beginning`` then sets ``auto.offset.reset=earliest`` for partitions without a
committed offset, as in Kafka.

Each record is printed with a kcat-style ``--format`` (see ``message_format``; default one
value per line), the ``--print-key/--print-offset/--print-partition`` shortcuts, or with
``--output json`` as one JSON object per line (``message_format.JSON_LINES``). It stops
after ``--max-messages``, after ``--timeout-ms`` without a record, at the end of every
partition with ``--exit-at-end``, or on Ctrl-C; then it prints ``Processed a total of N
messages`` on stderr, as Kafka's tool does.

Stateless; runs on the main thread. Uses a monotonic clock only to measure idleness.
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime
from typing import Annotated

import typer
from confluent_kafka import (
    OFFSET_BEGINNING,
    OFFSET_END,
    Consumer,
    KafkaError,
    Message,
    TopicPartition,
)

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    Connection,
    OutputFormat,
    OutputOption,
    UserError,
    connection_options,
    describe_kafka_error,
    topic_partitions,
    user_errors,
)
from headrace.cli.message_format import (
    JSON_LINES,
    FormatError,
    MessageFormat,
    compile_format,
    shortcut_format,
)

POLL_INTERVAL_S = 0.2
DEFAULT_KEY_SEPARATOR = "\\t"


@connection_options
def consume(
    topic: Annotated[str, typer.Argument(help="topic to read")],
    from_beginning: Annotated[
        bool, typer.Option("--from-beginning", help="start at the earliest offset")
    ] = False,
    offset: Annotated[
        int | None, typer.Option("--offset", min=0, help="start at this offset (no --group)")
    ] = None,
    timestamp: Annotated[
        str | None,
        typer.Option("--timestamp", help="start at this time: ms since epoch or ISO 8601"),
    ] = None,
    partition: Annotated[
        int | None, typer.Option("--partition", "-p", min=0, help="read only this partition")
    ] = None,
    group: Annotated[
        str | None, typer.Option("--group", "-g", help="consumer group (commits offsets)")
    ] = None,
    output_format: Annotated[
        str | None, typer.Option("--format", "-f", help="kcat-style: %t %p %o %k %s %T %h %K %S")
    ] = None,
    print_key: Annotated[bool, typer.Option("--print-key")] = False,
    print_offset: Annotated[bool, typer.Option("--print-offset")] = False,
    print_partition: Annotated[bool, typer.Option("--print-partition")] = False,
    key_separator: Annotated[
        str, typer.Option("--key-separator", help="between key and value with --print-key")
    ] = DEFAULT_KEY_SEPARATOR,
    max_messages: Annotated[
        int | None, typer.Option("--max-messages", "-n", min=1, help="stop after N records")
    ] = None,
    timeout_ms: Annotated[
        int | None, typer.Option("--timeout-ms", min=1, help="stop after this long idle")
    ] = None,
    exit_at_end: Annotated[
        bool, typer.Option("--exit-at-end", "-e", help="stop at the end of every partition")
    ] = False,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Print the records of a topic, one per line by default (``--output json``: one JSON
    object per record)."""
    with user_errors():
        _check_start_options(from_beginning, offset, timestamp, group, partition)
        message_format = _message_format(output_format, print_key, print_offset,
                                         print_partition, key_separator, output)
        consumer = Consumer(connection.client_config(**{
            "group.id": group or "headrace-console-consumer",
            "enable.auto.commit": group is not None,
            "auto.offset.reset": "earliest" if from_beginning else "latest",
            "enable.partition.eof": True,
        }))
        try:
            metadata = connection.fetch_metadata(consumer)
            partitions = _partitions_to_read(topic_partitions(metadata, topic), partition, topic)
            reader = _Reader(consumer, message_format, len(partitions), exit_at_end)
            if group is None:
                start = _start_position(from_beginning, offset, timestamp)
                consumer.assign(_assignment(consumer, topic, partitions, start,
                                            connection.request_timeout_ms))
                reader.mark_assigned()
            else:
                consumer.subscribe([topic], on_assign=lambda _consumer, _partitions:
                                   reader.mark_assigned())
            reader.run(max_messages, timeout_ms, connection.request_timeout_ms)
        finally:
            consumer.close()
        typer.echo(f"Processed a total of {reader.count} messages", err=True)


def _check_start_options(from_beginning: bool, offset: int | None, timestamp: str | None,
                         group: str | None, partition: int | None) -> None:
    chosen = [name for name, given in (("--from-beginning", from_beginning),
                                       ("--offset", offset is not None),
                                       ("--timestamp", timestamp is not None)) if given]
    if len(chosen) > 1:
        raise UserError(f"choose one start position, not {' and '.join(chosen)}")
    if group is not None:
        for name, given in (("--offset", offset is not None),
                            ("--timestamp", timestamp is not None),
                            ("--partition", partition is not None)):
            if given:
                raise UserError(f"{name} cannot be used with --group (the group assigns)")


def _message_format(output_format: str | None, print_key: bool, print_offset: bool,
                    print_partition: bool, key_separator: str,
                    output: OutputFormat) -> MessageFormat:
    shortcuts = print_key or print_offset or print_partition
    if output is OutputFormat.json:
        if output_format is not None or shortcuts:
            raise UserError("--output json cannot be combined with --format or --print-*")
        return JSON_LINES
    if output_format is not None and shortcuts:
        raise UserError("--format cannot be combined with the --print-* shortcuts")
    text = output_format or shortcut_format(print_key, print_offset, print_partition,
                                            key_separator)
    try:
        return compile_format(text)
    except FormatError as error:
        raise UserError(f"bad --format: {error}") from None


def _partitions_to_read(available: list[int], partition: int | None, topic: str) -> list[int]:
    if partition is None:
        return available
    if partition not in available:
        raise UserError(f"topic {topic!r} has no partition {partition} "
                        f"(it has {len(available)})")
    return [partition]


def parse_timestamp_ms(text: str) -> int:
    """Milliseconds since the epoch from digits or an ISO 8601 time (naive means UTC)."""
    if text.lstrip("-").isdigit():
        return int(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise UserError(f"bad --timestamp {text!r}: expected ms since epoch or ISO 8601") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


class _StartAtTime(int):
    """A start position given as a timestamp, resolved per partition by ListOffsets."""


def _start_position(from_beginning: bool, offset: int | None, timestamp: str | None) -> int:
    if from_beginning:
        return OFFSET_BEGINNING
    if offset is not None:
        return offset
    if timestamp is not None:
        return _StartAtTime(parse_timestamp_ms(timestamp))
    return OFFSET_END


def _assignment(consumer: Consumer, topic: str, partitions: list[int], start: int,
                request_timeout_ms: int) -> list[TopicPartition]:
    assignment = [TopicPartition(topic, partition_id, start) for partition_id in partitions]
    if not isinstance(start, _StartAtTime):
        return assignment
    found = consumer.offsets_for_times(assignment, timeout=request_timeout_ms / 1000)
    for topic_partition in found:  # -1: no record that late; start at the end
        if topic_partition.offset < 0:
            topic_partition.offset = OFFSET_END
    return found


class _Reader:
    """The poll loop: formats records to stdout and decides when to stop."""

    def __init__(self, consumer: Consumer, message_format: MessageFormat, partitions: int,
                 exit_at_end: bool) -> None:
        self.consumer = consumer
        self.message_format = message_format
        self.partitions = partitions
        self.exit_at_end = exit_at_end
        self.count = 0
        self.at_end: set[int] = set()
        self.out = sys.stdout.buffer
        self.assigned_at_s: float | None = None

    def mark_assigned(self) -> None:
        """Partitions are ours (assign, or the group's first assignment): idleness counts
        from here, so a slow group join is not mistaken for an idle topic."""
        if self.assigned_at_s is None:
            self.assigned_at_s = time.monotonic()

    def run(self, max_messages: int | None, timeout_ms: int | None,
            request_timeout_ms: int) -> None:
        started_s = time.monotonic()
        last_record_s: float | None = None
        try:
            while max_messages is None or self.count < max_messages:
                message = self.consumer.poll(POLL_INTERVAL_S)
                if message is None:
                    self.out.flush()
                    if self._idle_too_long(started_s, last_record_s, timeout_ms,
                                           request_timeout_ms):
                        return
                    continue
                if self._handle(message):
                    return
                last_record_s = time.monotonic()
        except KeyboardInterrupt:
            pass
        except BrokenPipeError:
            self._discard_output()
        finally:
            self._flush_quietly()

    def _idle_too_long(self, started_s: float, last_record_s: float | None,
                       timeout_ms: int | None, request_timeout_ms: int) -> bool:
        now_s = time.monotonic()
        if self.assigned_at_s is None:
            if (now_s - started_s) * 1000 >= request_timeout_ms:
                raise UserError(f"the group coordinator assigned no partitions within "
                                f"{request_timeout_ms} ms")
            return False
        quiet_since_s = last_record_s if last_record_s is not None else self.assigned_at_s
        return timeout_ms is not None and (now_s - quiet_since_s) * 1000 >= timeout_ms

    def _handle(self, message: Message) -> bool:
        """Print a record or note an event; True when reading should stop."""
        error = message.error()
        if error is None:
            self.at_end.discard(message.partition())
            self.out.write(self.message_format.render(message))
            self.count += 1
            return False
        if error.code() == KafkaError._PARTITION_EOF:
            self.at_end.add(message.partition())
            return self.exit_at_end and len(self.at_end) >= self.partitions
        if error.retriable():
            return False
        raise UserError(describe_kafka_error(error))

    def _flush_quietly(self) -> None:
        try:
            self.out.flush()
        except BrokenPipeError:
            self._discard_output()

    def _discard_output(self) -> None:
        """The reader of stdout is gone (``| head``): not an error; send the rest nowhere so
        the interpreter's final flush stays quiet."""
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, self.out.fileno())
        os.close(devnull)
