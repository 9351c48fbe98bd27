"""``headrace topics``: create, list, describe, alter-config, add-partitions, delete.

The equivalent of Kafka's ``kafka-topics.sh`` (and the topic half of ``kafka-configs.sh``)
through confluent-kafka's AdminClient, so it works against any Kafka-compatible cluster.
``describe`` shows each partition's leader, replicas, in-sync replicas and its low/high
offsets (ListOffsets earliest/latest) and its size on disk: the leader replica's log size from
DescribeLogDirs, which confluent-kafka does not expose, so it is sent by ``raw_requests``
(unknown, shown empty / null, when the broker lacks that API). Stateless; runs on the main
thread.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    OffsetSpec,
)

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    ConfigDeleteOption,
    ConfigSetOption,
    Connection,
    OutputFormat,
    OutputOption,
    UserError,
    connection_options,
    emit,
    make_table,
    parse_key_values,
    report,
    topic_partitions,
    user_errors,
    wait_all,
)
from headrace.cli.raw_requests import partition_sizes

DEFAULT_PARTITIONS = 1
DEFAULT_REPLICATION_FACTOR = 1

app = typer.Typer(no_args_is_help=True, help="Create, inspect, change and delete topics.")

ConfigOption = Annotated[
    list[str] | None, typer.Option("--config", "-c", help="topic config key=value (repeatable)")
]


@app.command()
@connection_options
def create(
    name: Annotated[str, typer.Argument(help="topic name")],
    partitions: Annotated[int, typer.Option("--partitions", "-p", min=1)] = DEFAULT_PARTITIONS,
    replication_factor: Annotated[
        int, typer.Option("--replication-factor", "-r", min=1)
    ] = DEFAULT_REPLICATION_FACTOR,
    config: ConfigOption = None,
    if_not_exists: Annotated[
        bool, typer.Option("--if-not-exists", help="succeed when the topic already exists")
    ] = False,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Create a topic."""
    with user_errors():
        topic_config = parse_key_values(config, "--config")
        admin, metadata = connection.admin()
        if if_not_exists and name in metadata.topics:
            report(output, f"Topic {name} already exists.", {"topic": name, "created": False})
            return
        new_topic = NewTopic(name, partitions, replication_factor, config=topic_config)
        futures = admin.create_topics([new_topic], request_timeout=connection.request_timeout_s)
        wait_all(futures, connection.request_timeout_ms)
        report(output, f"Created topic {name}.", {
            "topic": name, "created": True, "partitions": partitions,
            "replication_factor": replication_factor, "configs": topic_config})


@app.command("list")
@connection_options
def list_topics(
    include_internal: Annotated[
        bool, typer.Option("--include-internal", help="also list __consumer_offsets etc.")
    ] = False,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """List topics with their partition counts."""
    with user_errors():
        _admin, metadata = connection.admin()
        names = sorted(
            name for name in metadata.topics if include_internal or not name.startswith("__")
        )
        rows = [{"topic": name, "partitions": len(metadata.topics[name].partitions)}
                for name in names]
        table = make_table(None, ["topic", "partitions"],
                           [(row["topic"], row["partitions"]) for row in rows])
        emit(output, rows, table)


@app.command()
@connection_options
def describe(
    name: Annotated[str, typer.Argument(help="topic name")],
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Partitions of a topic: leader, replicas, in-sync replicas, offsets, size on disk."""
    with user_errors():
        admin, metadata = connection.admin()
        partition_ids = topic_partitions(metadata, name)  # full listing: never auto-creates
        offsets = _partition_offsets(admin, name, partition_ids, connection.request_timeout_ms)
        sizes = partition_sizes(metadata, name, partition_ids, connection.request_timeout_ms)
        topic_metadata = metadata.topics[name]
        rows = []
        for partition_id in partition_ids:
            partition = topic_metadata.partitions[partition_id]
            low, high = offsets[partition_id]
            rows.append({
                "partition": partition_id, "leader": partition.leader,
                "replicas": list(partition.replicas), "isr": list(partition.isrs),
                "low_offset": low, "high_offset": high, "messages": high - low,
                "size_bytes": sizes.get(partition_id),
            })
        emit(output, {"topic": name, "partitions": rows}, _describe_table(name, rows))


def _partition_offsets(
    admin: AdminClient, topic: str, partition_ids: list[int], request_timeout_ms: int
) -> dict[int, tuple[int, int]]:
    """``partition -> (earliest, latest)`` offsets through ListOffsets."""
    found: dict[int, list[int]] = {partition_id: [0, 0] for partition_id in partition_ids}
    for slot, spec in enumerate((OffsetSpec.earliest(), OffsetSpec.latest())):
        request = {TopicPartition(topic, partition_id): spec for partition_id in partition_ids}
        futures = admin.list_offsets(request, request_timeout=request_timeout_ms / 1000)
        for topic_partition, info in wait_all(futures, request_timeout_ms).items():
            found[topic_partition.partition][slot] = info.offset
    return {partition_id: (low, high) for partition_id, (low, high) in found.items()}


def _describe_table(name: str, rows: list[dict]):
    columns = ["partition", "leader", "replicas", "isr", "low_offset", "high_offset", "messages",
               "size_bytes"]
    cells = [[_cell(row[column]) for column in columns] for row in rows]
    return make_table(f"topic {name}", columns, cells)


def _cell(value: object) -> object:
    if isinstance(value, list):
        return ", ".join(map(str, value))
    return "" if value is None else value


@app.command("alter-config")
@connection_options
def alter_config(
    name: Annotated[str, typer.Argument(help="topic name")],
    set_items: ConfigSetOption = None,
    delete_keys: ConfigDeleteOption = None,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Set or delete topic configs (IncrementalAlterConfigs)."""
    with user_errors():
        admin, _ = connection.admin()
        changes = alter_resource_config(admin, ConfigResource.Type.TOPIC, name, set_items,
                                        delete_keys, connection.request_timeout_ms)
        report(output, f"Updated config of topic {name}.", {"topic": name, **changes})


def alter_resource_config(
    admin: AdminClient, resource_type: ConfigResource.Type, name: str,
    set_items: list[str] | None, delete_keys: list[str] | None, request_timeout_ms: int,
) -> dict[str, Any]:
    """IncrementalAlterConfigs: SET each key=value and DELETE each key on one resource;
    returns ``{"set": {key: value}, "deleted": [key]}``."""
    to_set = parse_key_values(set_items, "--set")
    entries = [
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET)
        for key, value in to_set.items()
    ]
    entries += [
        ConfigEntry(key, None, incremental_operation=AlterConfigOpType.DELETE)
        for key in delete_keys or ()
    ]
    if not entries:
        raise UserError("nothing to change: give --set key=value and/or --delete key")
    resource = ConfigResource(resource_type, name, incremental_configs=entries)
    futures = admin.incremental_alter_configs(
        [resource], request_timeout=request_timeout_ms / 1000
    )
    wait_all(futures, request_timeout_ms)
    return {"set": to_set, "deleted": list(delete_keys or ())}


@app.command("add-partitions")
@connection_options
def add_partitions(
    name: Annotated[str, typer.Argument(help="topic name")],
    partitions: Annotated[
        int, typer.Option("--partitions", "-p", min=1, help="the new total partition count")
    ],
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Grow a topic to --partitions partitions in total (CreatePartitions)."""
    with user_errors():
        admin, _ = connection.admin()
        futures = admin.create_partitions(
            [NewPartitions(name, partitions)], request_timeout=connection.request_timeout_s
        )
        wait_all(futures, connection.request_timeout_ms)
        report(output, f"Topic {name} now has {partitions} partitions.",
               {"topic": name, "partitions": partitions})


@app.command()
@connection_options
def delete(
    names: Annotated[list[str], typer.Argument(help="topic names")],
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Delete topics."""
    with user_errors():
        admin, _ = connection.admin()
        futures = admin.delete_topics(names, request_timeout=connection.request_timeout_s)
        wait_all(futures, connection.request_timeout_ms)
        report(output, "\n".join(f"Deleted topic {name}." for name in names),
               {"deleted": list(names)})
