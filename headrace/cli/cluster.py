"""``headrace cluster info``: cluster id, controller, brokers and topic count; ``headrace
cluster describe``: the brokers, the controller, and per broker the partitions it holds and leads.

DescribeCluster through confluent-kafka's AdminClient plus one Metadata request for the topic
count. Stateless; runs on the main thread.
"""

from __future__ import annotations

import typer

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    Connection,
    OutputFormat,
    OutputOption,
    connection_options,
    emit,
    make_table,
    user_errors,
)

app = typer.Typer(no_args_is_help=True, help="Inspect the cluster.")


@app.command()
@connection_options
def info(
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Cluster id, controller, brokers and how many topics there are."""
    with user_errors():
        admin, metadata = connection.admin()
        description = admin.describe_cluster(
            request_timeout=connection.request_timeout_s
        ).result(timeout=connection.request_timeout_s)
        brokers = [
            {"id": node.id, "host": node.host, "port": node.port, "rack": node.rack}
            for node in sorted(description.nodes, key=lambda node: node.id)
        ]
        controller = description.controller.id if description.controller else None
        topics_count = sum(1 for name in metadata.topics if not name.startswith("__"))
        data = {
            "cluster_id": description.cluster_id, "controller_id": controller,
            "brokers": brokers, "topics_count": topics_count,
        }
        summary = make_table(None, ["cluster id", "controller", "brokers", "topics"], [
            (description.cluster_id, controller, len(brokers), topics_count)
        ])
        broker_table = make_table("brokers", ["id", "host", "port", "rack"], [
            (broker["id"], broker["host"], broker["port"], broker["rack"]) for broker in brokers
        ])
        emit(output, data, summary, broker_table)


@app.command()
@connection_options
def describe(
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Brokers, the controller, and per broker how many partitions it holds and leads."""
    with user_errors():
        admin, metadata = connection.admin()
        description = admin.describe_cluster(
            request_timeout=connection.request_timeout_s
        ).result(timeout=connection.request_timeout_s)
        controller = description.controller.id if description.controller else None
        replicas, leaders = partition_counts_by_broker(metadata)
        brokers = [
            {"id": node.id, "host": node.host, "port": node.port, "rack": node.rack,
             "controller": node.id == controller, "partitions": replicas.get(node.id, 0),
             "leaders": leaders.get(node.id, 0)}
            for node in sorted(description.nodes, key=lambda node: node.id)
        ]
        offline = leaders.get(-1, 0)
        data = {"cluster_id": description.cluster_id, "controller_id": controller,
                "brokers": brokers, "offline_partitions": offline}
        summary = make_table(None, ["cluster id", "controller", "brokers", "offline partitions"],
                             [(description.cluster_id, controller, len(brokers), offline)])
        columns = ["id", "host", "port", "rack", "controller", "partitions", "leaders"]
        broker_table = make_table("brokers", columns, [
            tuple("*" if column == "controller" and broker[column] else
                  "" if column == "controller" else broker[column] for column in columns)
            for broker in brokers])
        emit(output, data, summary, broker_table)


def partition_counts_by_broker(metadata) -> tuple[dict[int, int], dict[int, int]]:
    """(broker id -> replicas it holds, broker id -> partitions it leads; -1 counts the
    partitions without a leader) over every topic of confluent-kafka's ClusterMetadata."""
    replicas: dict[int, int] = {}
    leaders: dict[int, int] = {}
    for topic in metadata.topics.values():
        for partition in topic.partitions.values():
            for replica in partition.replicas:
                replicas[replica] = replicas.get(replica, 0) + 1
            leaders[partition.leader] = leaders.get(partition.leader, 0) + 1
    return replicas, leaders
