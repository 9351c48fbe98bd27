"""Kafka requests the client libraries do not offer, sent over a plain blocking socket.

confluent-kafka (librdkafka) has no DescribeLogDirs call, so ``topics describe`` asks each
partition leader itself: one connection per broker, ApiVersions (v0, which every broker
answers) to pick the highest DescribeLogDirs version both sides speak, then DescribeLogDirs for
the topic's partitions that broker leads. Framing and codecs are ``headrace.protocol.wire``.

A broker that does not implement DescribeLogDirs, or answers with an error, yields no sizes
for its partitions (shown as unknown), never an exception. An unreachable broker is a
``UserError``. Not thread-safe: one ``BrokerConnection`` per thread; used from the CLI's
main thread.
"""

from __future__ import annotations

import socket
import struct
from collections import defaultdict
from typing import Any

from headrace.cli.common import UserError
from headrace.protocol import wire

API_VERSIONS_KEY = 18
API_VERSIONS_VERSION = 0
DESCRIBE_LOG_DIRS_KEY = 35
DESCRIBE_LOG_DIRS_VERSIONS = (1, 5)  # the versions this module can encode and decode
CLIENT_ID = "headrace-cli"
FRAME_LENGTH_BYTES = 4


class BrokerConnection:
    """One socket to one broker; ``request`` sends a request and returns the decoded body."""

    def __init__(self, host: str, port: int, timeout_ms: int) -> None:
        try:
            self._sock = socket.create_connection((host, port), timeout=timeout_ms / 1000)
        except OSError as error:
            raise UserError(f"cannot reach broker {host}:{port}: {error}") from None
        self._address = f"{host}:{port}"
        self._correlation_id = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> BrokerConnection:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def request(self, api_key: int, api_version: int, values: dict[str, Any]) -> Any:
        self._correlation_id += 1
        body = wire.build(wire.request_class(api_key, api_version), values)
        frame = wire.encode_request(api_key, api_version, self._correlation_id, CLIENT_ID, body)
        try:
            self._sock.sendall(frame)
            (size,) = struct.unpack(">i", self._receive_exactly(FRAME_LENGTH_BYTES))
            correlation_id, response = wire.decode_response(api_key, api_version,
                                                            self._receive_exactly(size))
        except OSError as error:
            raise UserError(f"broker {self._address} failed: {error}") from None
        if correlation_id != self._correlation_id:
            raise UserError(f"broker {self._address} answered out of order")
        return response

    def _receive_exactly(self, count: int) -> bytes:
        received = bytearray()
        while len(received) < count:
            chunk = self._sock.recv(count - len(received))
            if not chunk:
                raise ConnectionError("connection closed by the broker")
            received += chunk
        return bytes(received)

    def supported_version(self, api_key: int, our_min: int, our_max: int) -> int | None:
        """The highest version of ``api_key`` both sides support, or None."""
        response = self.request(API_VERSIONS_KEY, API_VERSIONS_VERSION, {})
        for api in response.api_keys:
            if api.api_key == api_key:
                highest = min(our_max, api.max_version)
                return highest if highest >= max(our_min, api.min_version) else None
        return None


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
        with BrokerConnection(broker.host, broker.port, timeout_ms) as connection:
            sizes.update(_leader_sizes(connection, topic, led))
    return sizes


def _leader_sizes(connection: BrokerConnection, topic: str, partitions: list[int]
                  ) -> dict[int, int]:
    version = connection.supported_version(DESCRIBE_LOG_DIRS_KEY, *DESCRIBE_LOG_DIRS_VERSIONS)
    if version is None:
        return {}
    response = connection.request(DESCRIBE_LOG_DIRS_KEY, version,
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
