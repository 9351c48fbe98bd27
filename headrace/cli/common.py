"""Shared plumbing of the client commands: connection options, bounded timeouts, user errors,
output rendering (rich tables or ``--output json``).

Every command that talks to a cluster takes ``--bootstrap-server HOST:PORT`` (default
``127.0.0.1:9092`` or ``$HEADRACE_BOOTSTRAP_SERVER``) and ``--request-timeout-ms`` (default
10000): the first metadata round trip must succeed within it, so an unreachable broker fails
fast instead of entering librdkafka's endless reconnect loop. librdkafka's own log lines are
silenced; errors reach the user once, as one line on stderr with a non-zero exit status
(``UserError`` and the ``user_errors`` context manager).

A command declares ``connection: Connection = DEFAULT_CONNECTION`` and is decorated with
``@connection_options``: the parameter becomes the two options at its place in the signature
(same names, help and defaults in ``--help``), and the command receives them as one
``Connection``. ``topic_spark_session`` is the Spark commands' check-the-topic-then-start
pair (Spark is imported only when it is called).

The clients are confluent-kafka (librdkafka), so the commands work against any
Kafka-compatible cluster. Stateless module; each command runs on the main thread.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any

import typer
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ClusterMetadata
from rich.console import Console
from rich.table import Table

DEFAULT_BOOTSTRAP_SERVER = "127.0.0.1:9092"
BOOTSTRAP_ENV = "HEADRACE_BOOTSTRAP_SERVER"
DEFAULT_REQUEST_TIMEOUT_MS = 10_000
USER_ERROR_EXIT_CODE = 1
PIPE_CONSOLE_WIDTH_CHARS = 200

_SILENT_LOGGER = logging.getLogger("headrace.cli.librdkafka")
_SILENT_LOGGER.addHandler(logging.NullHandler())
_SILENT_LOGGER.propagate = False


class OutputFormat(StrEnum):
    table = "table"
    json = "json"


BootstrapOption = Annotated[
    str,
    typer.Option(
        "--bootstrap-server", "-b", envvar=BOOTSTRAP_ENV, help="HOST:PORT of a broker"
    ),
]
RequestTimeoutOption = Annotated[
    int,
    typer.Option(
        "--request-timeout-ms", min=1, help="give up on an unreachable broker after this long"
    ),
]
OutputOption = Annotated[
    OutputFormat, typer.Option("--output", "-o", help="table for people, json for scripts")
]
ConfigSetOption = Annotated[
    list[str] | None, typer.Option("--set", help="key=value to set (repeatable)")
]
ConfigDeleteOption = Annotated[
    list[str] | None, typer.Option("--delete", help="key to reset to its default")
]


class UserError(Exception):
    """A mistake or condition the user can fix: printed as one line, exit status 1."""


def fail(message: str) -> typer.Exit:
    """Print ``headrace: message`` on stderr and return the Exit to raise."""
    typer.echo(f"headrace: {message}", err=True)
    return typer.Exit(USER_ERROR_EXIT_CODE)


def describe_kafka_error(error: KafkaError | Any) -> str:
    if isinstance(error, KafkaError):
        return f"{error.name()}: {error.str()}"
    return str(error)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the errors a user can cause into one line on stderr and a non-zero exit."""
    try:
        yield
    except UserError as error:
        raise fail(str(error)) from None
    except KafkaException as error:
        raise fail(describe_kafka_error(error.args[0] if error.args else error)) from None
    except OSError as error:
        raise fail(f"{error.strerror or error}: {error.filename or ''}".rstrip(": ")) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def client_config(bootstrap: str, request_timeout_ms: int, **extra: Any) -> dict[str, Any]:
    """librdkafka settings shared by every client the CLI creates."""
    return {
        "bootstrap.servers": bootstrap,
        # librdkafka refuses values below 1000 ms
        "socket.connection.setup.timeout.ms": max(1000, request_timeout_ms),
        "logger": _SILENT_LOGGER,
        "error_cb": _ignore_client_error,
        **extra,
    }


def _ignore_client_error(_error: KafkaError) -> None:
    """Transport errors surface through the bounded metadata call instead."""


def fetch_metadata(
    client: AdminClient | Producer | Consumer, bootstrap: str, request_timeout_ms: int,
    topic: str | None = None,
) -> ClusterMetadata:
    """One metadata round trip within the timeout, or a UserError naming the broker."""
    try:
        if topic is None:
            return client.list_topics(timeout=request_timeout_ms / 1000)
        return client.list_topics(topic=topic, timeout=request_timeout_ms / 1000)
    except KafkaException as error:
        kafka_error = error.args[0]
        if kafka_error.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
            raise UserError(
                f"cannot reach a broker at {bootstrap} within {request_timeout_ms} ms"
            ) from None
        raise


def connect_admin(bootstrap: str, request_timeout_ms: int) -> tuple[AdminClient, ClusterMetadata]:
    """An AdminClient whose cluster answered a metadata request in time."""
    admin = AdminClient(client_config(bootstrap, request_timeout_ms))
    return admin, fetch_metadata(admin, bootstrap, request_timeout_ms)


@dataclass(frozen=True, slots=True)
class Connection:
    """Where a command reaches the cluster and how long it waits for an answer."""

    bootstrap_server: str
    request_timeout_ms: int

    @property
    def request_timeout_s(self) -> float:
        return self.request_timeout_ms / 1000

    def client_config(self, **extra: Any) -> dict[str, Any]:
        return client_config(self.bootstrap_server, self.request_timeout_ms, **extra)

    def fetch_metadata(
        self, client: AdminClient | Producer | Consumer, topic: str | None = None
    ) -> ClusterMetadata:
        return fetch_metadata(client, self.bootstrap_server, self.request_timeout_ms, topic)

    def admin(self) -> tuple[AdminClient, ClusterMetadata]:
        return connect_admin(self.bootstrap_server, self.request_timeout_ms)


DEFAULT_CONNECTION = Connection(DEFAULT_BOOTSTRAP_SERVER, DEFAULT_REQUEST_TIMEOUT_MS)
CONNECTION_PARAMETER = "connection"


def connection_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Turn the command's ``connection: Connection = <default>`` parameter into the options
    ``--bootstrap-server`` and ``--request-timeout-ms`` (typer reads the new signature) and
    hand the command their values as one ``Connection``."""
    signature = inspect.signature(command, eval_str=True)
    default = signature.parameters[CONNECTION_PARAMETER].default
    parameters: list[inspect.Parameter] = []
    for parameter in signature.parameters.values():
        if parameter.name != CONNECTION_PARAMETER:
            parameters.append(parameter)
            continue
        parameters += [
            parameter.replace(name="bootstrap_server", annotation=BootstrapOption,
                              default=default.bootstrap_server),
            parameter.replace(name="request_timeout_ms", annotation=RequestTimeoutOption,
                              default=default.request_timeout_ms),
        ]

    @functools.wraps(command)
    def with_connection(*, bootstrap_server: str, request_timeout_ms: int, **options: Any):
        return command(connection=Connection(bootstrap_server, request_timeout_ms), **options)

    with_connection.__signature__ = signature.replace(parameters=parameters)
    with_connection.__annotations__ = {p.name: p.annotation for p in parameters}
    return with_connection


def topic_spark_session(master: str, app_name: str, connection: Connection, topic: str):
    """Start Spark for a job on ``topic`` once the broker has shown the topic exists (a
    JobError names the unreachable broker or the unknown topic, before Spark starts)."""
    from headrace.spark.jobs.session import build_session, topic_partition_ids

    topic_partition_ids(connection.bootstrap_server, topic, connection.request_timeout_ms)
    return build_session(master, app_name)


def topic_partitions(metadata: ClusterMetadata, topic: str) -> list[int]:
    """Partition ids of ``topic`` from a metadata answer; UserError when it does not exist."""
    topic_metadata = metadata.topics.get(topic)
    if topic_metadata is None:
        raise UserError(f"unknown topic {topic!r}")
    if topic_metadata.error is not None and topic_metadata.error.code() != KafkaError.NO_ERROR:
        raise UserError(f"topic {topic!r}: {describe_kafka_error(topic_metadata.error)}")
    return sorted(topic_metadata.partitions)


def wait_all(futures: dict[Any, Any], timeout_ms: int) -> dict[Any, Any]:
    """Results of admin futures, each within the timeout; the first error is raised."""
    results = {}
    for key, future in futures.items():
        try:
            results[key] = future.result(timeout=timeout_ms / 1000)
        except TimeoutError:
            raise UserError(f"no answer for {key} within {timeout_ms} ms") from None
    return results


def parse_key_values(items: Sequence[str] | None, what: str) -> dict[str, str]:
    """``["k=v", ...]`` (also ``k=v,k2=v2`` in one item) as a dict; UserError on a bad item."""
    parsed: dict[str, str] = {}
    for item in items or ():
        for pair in _split_pairs(item):
            key, separator, value = pair.partition("=")
            if not separator or not key:
                raise UserError(f"bad {what} {pair!r}: expected key=value")
            parsed[key.strip()] = value
    return parsed


def _split_pairs(item: str) -> list[str]:
    """Split ``a=1,b=2`` on commas that start a new ``key=`` (values may contain commas)."""
    pieces = item.split(",")
    pairs: list[str] = []
    for piece in pieces:
        if pairs and "=" not in piece:
            pairs[-1] += "," + piece
        else:
            pairs.append(piece)
    return pairs


def emit(output: OutputFormat, data: Any, *tables: Table) -> None:
    """Print ``data`` as JSON (one document), or the ``tables`` with rich."""
    if output is OutputFormat.json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    console = Console()
    if not console.is_terminal:  # pipes get whole lines, not an 80-column guess
        console = Console(width=PIPE_CONSOLE_WIDTH_CHARS)
    for table in tables:
        console.print(table)


def report(output: OutputFormat, message: str, data: Any) -> None:
    """A command's outcome: ``message`` as one line for people, or ``data`` as JSON."""
    if output is OutputFormat.json:
        emit(output, data)
    else:
        typer.echo(message)


def make_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> Table:
    table = Table(title=title, show_lines=False)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*("" if cell is None else str(cell) for cell in row))
    return table
