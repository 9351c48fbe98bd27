"""``headrace configs``: describe and alter the configs of a topic or a broker.

The equivalent of Kafka's ``kafka-configs.sh --describe/--alter`` for the ``topic`` and
``broker`` resource types, through DescribeConfigs and IncrementalAlterConfigs (confluent-kafka
AdminClient). Stateless; runs on the main thread.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer
from confluent_kafka.admin import ConfigResource, ConfigSource

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    ConfigDeleteOption,
    ConfigSetOption,
    Connection,
    OutputFormat,
    OutputOption,
    connection_options,
    emit,
    make_table,
    report,
    user_errors,
    wait_all,
)
from headrace.cli.topics import alter_resource_config

app = typer.Typer(no_args_is_help=True, help="Describe and alter topic and broker configs.")


class ResourceType(StrEnum):
    topic = "topic"
    broker = "broker"


_CONFIG_RESOURCE_TYPES = {
    ResourceType.topic: ConfigResource.Type.TOPIC,
    ResourceType.broker: ConfigResource.Type.BROKER,
}

ResourceTypeArgument = Annotated[ResourceType, typer.Argument(help="topic or broker")]
ResourceNameArgument = Annotated[str, typer.Argument(help="topic name or broker id")]


@app.command()
@connection_options
def describe(
    resource_type: ResourceTypeArgument,
    name: ResourceNameArgument,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Every config of the resource with its value and where the value comes from."""
    with user_errors():
        admin, _ = connection.admin()
        resource = ConfigResource(_CONFIG_RESOURCE_TYPES[resource_type], name)
        futures = admin.describe_configs([resource], request_timeout=connection.request_timeout_s)
        entries = next(iter(wait_all(futures, connection.request_timeout_ms).values()))
        rows = [
            {
                "name": entry.name,
                "value": None if entry.is_sensitive else entry.value,
                "source": ConfigSource(entry.source).name,
                "read_only": entry.is_read_only,
                "sensitive": entry.is_sensitive,
            }
            for entry in sorted(entries.values(), key=lambda entry: entry.name)
        ]
        table = make_table(
            f"{resource_type.value} {name}", ["name", "value", "source", "read_only"],
            [(row["name"], row["value"], row["source"], row["read_only"]) for row in rows],
        )
        emit(output, rows, table)


@app.command()
@connection_options
def alter(
    resource_type: ResourceTypeArgument,
    name: ResourceNameArgument,
    set_items: ConfigSetOption = None,
    delete_keys: ConfigDeleteOption = None,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Set or delete configs (IncrementalAlterConfigs)."""
    with user_errors():
        admin, _ = connection.admin()
        changes = alter_resource_config(admin, _CONFIG_RESOURCE_TYPES[resource_type], name,
                                        set_items, delete_keys, connection.request_timeout_ms)
        report(output, f"Updated config of {resource_type.value} {name}.",
               {"resource_type": resource_type.value, "name": name, **changes})
