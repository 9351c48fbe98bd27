"""The ``headrace`` command line (typer). This module owns ``headrace broker``.

``headrace broker [--config server.properties] [--override key=value ...]`` runs a
single-node broker in the foreground until SIGTERM/SIGINT. A bad configuration is reported
in one line with exit status 2. Stateless; runs on the main thread.

Registration is lazy: ``main`` adds the client command groups (topics, produce, consume,
groups, cleaner, spark, ...: their modules import the client, numpy and pyarrow paths) only
when the command line is not ``headrace broker ...``, so starting a broker imports the broker
path alone. ``headrace --help`` and every other command see the full set.
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from headrace.errors import KafkaError

PROCESS_START_MONOTONIC_S = time.monotonic()

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, help="headrace: a Kafka-compatible log")


@app.callback()
def _root() -> None:
    """headrace: a Kafka-compatible streaming log."""


@app.command()
def broker(
    config: Annotated[
        Path | None, typer.Option("--config", help="server.properties file", exists=True)
    ] = None,
    override: Annotated[
        list[str] | None, typer.Option("--override", help="key=value, wins over the file")
    ] = None,
) -> None:
    """Run a single-node broker (default 127.0.0.1:9092, data under ./data)."""
    from headrace.broker.server import run_broker

    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        run_broker(config, list(override or []), PROCESS_START_MONOTONIC_S)
    except (KafkaError, OSError) as error:
        typer.echo(f"headrace broker: {error}", err=True)
        raise typer.Exit(2) from None


BROKER_COMMAND = "broker"


def register_client_commands() -> None:
    """The client commands (topics, produce, consume, ...) live in their own modules."""
    from headrace.cli import cleaner, client_commands, groups, transactions

    client_commands.register(app)
    app.add_typer(groups.app, name="groups")
    app.add_typer(cleaner.app, name="cleaner")
    app.add_typer(transactions.app, name="transactions")
    from headrace.cli.spark import app as spark_app
    app.add_typer(spark_app, name="spark")


def runs_broker_only(arguments: list[str]) -> bool:
    """Whether the command line names ``headrace broker`` (the root takes no options)."""
    return arguments[:1] == [BROKER_COMMAND]


def main() -> None:
    if not runs_broker_only(sys.argv[1:]):
        register_client_commands()
    app()


if __name__ == "__main__":
    main()
