"""Kafka requests the client libraries do not offer, sent with headrace's blocking wire client.

confluent-kafka (librdkafka) has no DescribeLogDirs call, so ``topics describe`` asks each
partition leader itself: one ``headrace.client.broker_connection.BrokerConnection`` per
broker (which negotiates API versions when it opens), then DescribeLogDirs, at the highest
version both sides speak, for the topic's partitions that broker leads.

A broker that does not implement DescribeLogDirs, or answers with an error, yields no sizes
for its partitions (shown as unknown), never an exception. An unreachable broker, or one that
fails mid-request, is a ``UserError`` (``connect_broker`` and ``broker_failures``, shared with
``headrace transactions``). Stateless; used from the CLI's main thread.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
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
        with connect_broker(broker.host, broker.port, timeout_ms) as connection, \
                broker_failures(connection):
            sizes.update(_leader_sizes(connection, topic, led))
    return sizes


def connect_broker(host: str, port: int, timeout_ms: int) -> BrokerConnection:
    """A connection to one broker, its API versions negotiated; UserError if it fails."""
    try:
        return BrokerConnection((host, port), CLIENT_ID, request_timeout_ms=timeout_ms)
    except (OSError, WireClientError) as error:
        raise UserError(f"broker {host}:{port} failed: {error}") from None


@contextmanager
def broker_failures(connection: BrokerConnection) -> Iterator[None]:
    """A connection that fails mid-request (or a version neither side speaks) as a
    UserError naming the broker."""
    try:
        yield
    except (OSError, WireClientError, UnsupportedVersion) as error:
        raise UserError(f"broker {connection.address_text} failed: {error}") from None


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
