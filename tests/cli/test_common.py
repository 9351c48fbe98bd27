"""``connection_options``: a command's ``connection: Connection`` parameter becomes the
``--bootstrap-server`` / ``--request-timeout-ms`` options at its place, with the documented
defaults and environment variable, and the command receives them as one ``Connection``."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from typer.testing import CliRunner

from headrace.cli.common import (
    BOOTSTRAP_ENV,
    DEFAULT_CONNECTION,
    Connection,
    OutputFormat,
    OutputOption,
    connection_options,
)

app = typer.Typer()


@app.command()
@connection_options
def show(
    name: Annotated[str, typer.Argument()],
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Print what the command received."""
    typer.echo(json.dumps([name, connection.bootstrap_server, connection.request_timeout_ms,
                           connection.request_timeout_s, output.value]))


def invoke(*args: str, bootstrap_env: str | None = None) -> list:
    """Run ``show``; the environment variable is unset unless ``bootstrap_env`` is given."""
    result = CliRunner().invoke(app, list(args), env={BOOTSTRAP_ENV: bootstrap_env})
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def test_options_reach_the_command_as_one_connection():
    received = invoke("x", "-b", "broker:9093", "--request-timeout-ms", "250", "-o", "json")
    assert received == ["x", "broker:9093", 250, 0.25, "json"]


def test_defaults_and_environment_variable():
    assert invoke("x") == ["x", "127.0.0.1:9092", 10_000, 10.0, "table"]
    assert invoke("x", bootstrap_env="from-env:1")[1] == "from-env:1"
    assert invoke("x", "-b", "flag:2", bootstrap_env="from-env:1")[1] == "flag:2"


def test_options_take_the_parameter_place_in_help():
    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "200", "TERM": "dumb"})
    positions = [result.output.index(option) for option in
                 ("--bootstrap-server", "--request-timeout-ms", "--output")]
    assert positions == sorted(positions)


def test_request_timeout_must_be_positive():
    result = CliRunner().invoke(app, ["x", "--request-timeout-ms", "0"])
    assert result.exit_code == 2
