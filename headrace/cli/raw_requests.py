"""Kafka requests the client libraries do not offer, sent with headrace's blocking wire client.

confluent-kafka (librdkafka) has no DescribeLogDirs call, so ``topics describe`` asks each
partition leader itself: one ``headrace.client.broker_connection.BrokerConnection`` per
broker (which negotiates API versions when it opens), then DescribeLogDirs, at the highest
version both sides speak, for the topic's partitions that broker leads.

A broker that does not implement DescribeLogDirs, or answers with an error, yields no sizes
for its partitions (shown as unknown), never an exception. An unreachable broker, or one that
fails mid-request, is a ``UserError``. Stateless; used from the CLI's main thread.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from headrace.cli.common import UserError
from headrace.client.broker_connection import BrokerConnection, WireClientError
from headrace.errors import UnsupportedVersion

DESCRIBE_LOG_DIRS_KEY = 35
DESCRIBE_LOG_DIRS_VERSIONS = (1, 5)  # the versions this module can encode and decode
CLIENT_ID = "headrace-cli"


def partition_sizes(metadata: Any, topic: str, partition_ids: list[int],
                    timeout_ms: int) -> dict[int, int]:
    """partition -> bytes on disk of its leader's replica, for the partitions whose leader
    answered DescribeLogDirs; ``metadata`` is confluent-kafka's ClusterMetadata."""
    partitions_by_leader: dict[int, list[int]] = defaultdict(list)
    for partition_id in partition_ids:
        leader = metadata.topics[topic].partitions[partition_id].leader
        if leader in metadata.brokers:
            partitions_by_leader[leader].append(partition_id)
    sizes: dict[int, int] = {}
    for leader, led in partitions_by_leader.items():
        broker = metadata.brokers[leader]
        address = f"{broker.host}:{broker.port}"
        try:
            with BrokerConnection((broker.host, broker.port), CLIENT_ID,
                                  request_timeout_ms=timeout_ms) as connection:
                sizes.update(_leader_sizes(connection, topic, led))
        except (OSError, WireClientError) as error:
            raise UserError(f"broker {address} failed: {error}") from None
    return sizes


def _leader_sizes(connection: BrokerConnection, topic: str, partitions: list[int]
                  ) -> dict[int, int]:
    try:
        version = connection.version_for(DESCRIBE_LOG_DIRS_KEY, DESCRIBE_LOG_DIRS_VERSIONS)
    except UnsupportedVersion:
        return {}
    response = connection.request_values(DESCRIBE_LOG_DIRS_KEY, version,
                                         {"topics": [{"topic": topic, "partitions": partitions}]})
    if getattr(response, "error_code", 0):
        return {}
    wanted = set(partitions)
    sizes: dict[int, int] = {}
    for result in response.results:
        if result.error_code:
            continue
        for described in result.topics:
            if described.name != topic:
                continue
            for partition in described.partitions:
                if partition.partition_index in wanted and not partition.is_future_key:
                    sizes[partition.partition_index] = partition.partition_size
    return sizes
