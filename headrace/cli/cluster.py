"""``headrace cluster info``: cluster id, controller, brokers and topic count.

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
