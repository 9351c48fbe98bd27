"""A small blocking Kafka client for Spark executors: one partition's raw record batches.

Owns: ``FetchClientConfig`` (the ``kafka.*`` options this client honours) and
``PartitionFetchClient``, which speaks just enough of the Kafka protocol over one blocking
PLAINTEXT socket (``headrace.client.broker_connection.BrokerConnection``, shared with the
sink's produce client and the command line) to read one topic-partition:

- ApiVersions v0 on every new connection; Fetch v4-v12 (the versions that name topics, not
  topic ids), Metadata v1-v12 and ListOffsets v1-v7 are negotiated to the highest version both
  sides support.
- Metadata finds the partition's leader; the client connects to it (reusing the bootstrap
  connection when the leader is that broker).
- Fetch requests are sessionless full fetches (session id 0, epoch -1) for one partition,
  at ``isolation.level`` (read_uncommitted by default, as Kafka's consumer; read_committed
  fetches end at the last stable offset and carry the aborted transactions, which
  ``headrace.spark.fetch`` drops). ListOffsets asks at the same level. Requests are encoded with kio through ``headrace.protocol.wire``; Fetch
  responses are parsed by hand here (skipping tagged fields) so the records section stays a
  zero-copy ``memoryview`` of the received frame -- it goes straight to the record kernel.
- ``send_fetch`` / ``receive_fetch`` allow one request in flight while the caller decodes the
  previous response (Kafka answers a connection's requests in order).
- Slow start: a client's first Fetch asks for at most ``FIRST_FETCH_PARTITION_BYTES`` of its
  partition and each later one for twice the last, up to ``max.partition.fetch.bytes``, so a
  task's first records arrive after a 1 MiB response rather than a 16 MiB one (measured on
  one machine: 4 ms against 20 ms) while the bulk still comes in large responses.
- Connections outlive clients: ``release()`` (a client done reading) hands its connection to a
  process-wide pool of idle connections (at most ``IDLE_CONNECTIONS_KEPT``); a later client of
  the same cluster (bootstrap servers and client id) asks its Metadata on one of them, and
  reads from it when that broker leads its partition, instead of connecting and asking
  ApiVersions again (a new connection measured 6.5 ms with Metadata, per Spark task). Every
  client still asks Metadata for its partition's leader. A connection is taken only when
  ``is_reusable()``; ``close()`` -- what a client does after an error -- drops it.
- Response frames are received into regions of a process-wide pool
  (``headrace.protocol.buffers``): a region is reused only once every view of its last frame has
  been released, so a caller that drops each response before receiving the next pays no page
  faults for fresh buffers.

Options (Kafka's names; librdkafka spellings accepted): ``bootstrap.servers``,
``client.id``, ``fetch.max.bytes``, ``max.partition.fetch.bytes``, ``fetch.max.wait.ms``
(``fetch.wait.max.ms``), ``fetch.min.bytes``, ``request.timeout.ms`` (``socket.timeout.ms``),
``isolation.level``.
Only ``security.protocol=PLAINTEXT`` is supported.

Not thread-safe: one client per Spark task. The idle connection pool is process-wide and
locked; a connection belongs to one client at a time.
"""

from __future__ import annotations

import struct
import threading
from dataclasses import dataclass

from headrace.client.broker_connection import (
    DEFAULT_REQUEST_TIMEOUT_MS,
    NO_ERROR,
    BrokerConnection,
    WireClientError,
    check_plaintext,
    connect_any,
    first_option,
    parse_servers,
)
from headrace.errors import error_for_code
from headrace.protocol import wire
from headrace.protocol.buffers import RegionPool
from headrace.protocol.varint import read_unsigned

FETCH_KEY = 1
LIST_OFFSETS_KEY = 2
METADATA_KEY = 3
FETCH_VERSIONS = (4, 12)  # v13+ name topics by id
METADATA_VERSIONS = (1, 12)
LIST_OFFSETS_VERSIONS = (1, 7)
FLEXIBLE_FETCH_VERSION = 12
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1
CONSUMER_REPLICA_ID = -1
READ_UNCOMMITTED = 0
READ_COMMITTED = 1
ISOLATION_LEVELS = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}
NO_FETCH_SESSION_ID = 0
SESSIONLESS_FETCH_EPOCH = -1  # FetchMetadata.FINAL_EPOCH: a full fetch without a session
NO_LEADER_EPOCH = -1
DEFAULT_CLIENT_ID = "headrace-spark-executor"
DEFAULT_FETCH_MAX_BYTES = 64 * 1024 * 1024
# 16 MiB per response: measured on a 1 KiB-record read into Spark (one session, alternating,
# median of 5), the read used ~0.25 CPU s per million rows less than with 4 MiB and ~0.3 less
# than with 1 MiB: fewer, larger Arrow batches cost Spark's JVM less. (With fresh buffers per
# response, page faults made 4 MiB the cheapest; frames and columns now reuse their buffers.)
DEFAULT_MAX_PARTITION_FETCH_BYTES = 16 * 1024 * 1024
FIRST_FETCH_PARTITION_BYTES = 1024 * 1024
DEFAULT_FETCH_MAX_WAIT_MS = 100
DEFAULT_FETCH_MIN_BYTES = 1
SOCKET_RECEIVE_BUFFER_BYTES = 4 * 1024 * 1024
LARGEST_BATCH_BYTES = wire.DEFAULT_MAX_FRAME_BYTES  # socket.request.max.bytes' default
# Response frames kept for reuse by the process's connections (see receive_frame): a task
# holds one at a time, a second while it asks ListOffsets with a Fetch response in hand.
FRAME_REGIONS = 2
_FRAMES = RegionPool(FRAME_REGIONS)
# Idle leader connections a process keeps between clients: a Spark Python worker runs one task
# at a time, so one per broker it reads from; more are closed when released.
IDLE_CONNECTIONS_KEPT = 4

_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_INT64 = struct.Struct(">q")


# The shared connection layer's error, under the name this client has always raised.
FetchClientError = WireClientError


@dataclass(frozen=True, slots=True)
class FetchClientConfig:
    bootstrap_servers: tuple[tuple[str, int], ...]
    client_id: str = DEFAULT_CLIENT_ID
    fetch_max_bytes: int = DEFAULT_FETCH_MAX_BYTES
    max_partition_fetch_bytes: int = DEFAULT_MAX_PARTITION_FETCH_BYTES
    fetch_max_wait_ms: int = DEFAULT_FETCH_MAX_WAIT_MS
    fetch_min_bytes: int = DEFAULT_FETCH_MIN_BYTES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    isolation_level: int = READ_UNCOMMITTED

    @classmethod
    def from_client_options(cls, options: dict[str, str]) -> FetchClientConfig:
        """From the ``kafka.*`` options of the source (prefix already removed)."""
        check_plaintext(options, "executor's fetch client")
        return cls(
            bootstrap_servers=parse_servers(options["bootstrap.servers"]),
            client_id=options.get("client.id", DEFAULT_CLIENT_ID),
            fetch_max_bytes=first_option(options, ("fetch.max.bytes",),
                                          DEFAULT_FETCH_MAX_BYTES),
            max_partition_fetch_bytes=first_option(
                options, ("max.partition.fetch.bytes",), DEFAULT_MAX_PARTITION_FETCH_BYTES),
            fetch_max_wait_ms=first_option(options, ("fetch.max.wait.ms", "fetch.wait.max.ms"),
                                            DEFAULT_FETCH_MAX_WAIT_MS),
            fetch_min_bytes=first_option(options, ("fetch.min.bytes",),
                                          DEFAULT_FETCH_MIN_BYTES),
            request_timeout_ms=first_option(options, ("request.timeout.ms",
                                                       "socket.timeout.ms"),
                                             DEFAULT_REQUEST_TIMEOUT_MS),
            isolation_level=isolation_level_of(options),
        )


def isolation_level_of(options: dict[str, str]) -> int:
    """``isolation.level`` (read_uncommitted, the Kafka consumer's default, or
    read_committed) as the wire's isolation_level."""
    text = options.get("isolation.level", "read_uncommitted").strip().lower()
    if text not in ISOLATION_LEVELS:
        raise FetchClientError(
            f"isolation.level must be read_uncommitted or read_committed, got {text!r}")
    return ISOLATION_LEVELS[text]


@dataclass(frozen=True, slots=True)
class FetchedPartition:
    """One partition of a Fetch response; ``records`` views the received frame.
    ``aborted_transactions``: (producer id, first offset) of the aborted transactions in the
    fetched range, answered to read_committed fetches."""

    error_code: int
    high_watermark: int
    log_start_offset: int  # -1 before Fetch v5 or when the broker does not know it
    records: memoryview
    last_stable_offset: int = -1
    aborted_transactions: tuple[tuple[int, int], ...] = ()


ClusterKey = tuple[tuple[tuple[str, int], ...], str]  # bootstrap servers, client id


class IdleConnections:
    """Broker connections kept open between clients, by cluster; thread-safe. The most
    recently released are kept; a connection is handed to one client at a time."""

    def __init__(self, max_connections: int) -> None:
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._connections: list[tuple[ClusterKey, BrokerConnection]] = []

    @property
    def idle_count(self) -> int:
        return len(self._connections)

    def take(self, cluster: ClusterKey,
             address: tuple[str, int] | None = None) -> BrokerConnection | None:
        """A reusable idle connection to ``cluster`` (to the broker at ``address`` if given),
        the most recently released first; None when there is none."""
        while True:
            with self._lock:
                connection = self._pop(cluster, address)
            if connection is None or connection.is_reusable():
                return connection
            connection.close()  # closed by the broker meanwhile

    def _pop(self, cluster: ClusterKey,
             address: tuple[str, int] | None) -> BrokerConnection | None:
        for index in range(len(self._connections) - 1, -1, -1):
            key, connection = self._connections[index]
            if key == cluster and address in (None, connection.address):
                del self._connections[index]
                return connection
        return None

    def give_back(self, cluster: ClusterKey, connection: BrokerConnection) -> None:
        """Keep ``connection`` for a later client of ``cluster`` if it is reusable."""
        if not connection.is_reusable():
            connection.close()
            return
        with self._lock:
            self._connections.append((cluster, connection))
            surplus = self._connections[:-self.max_connections]
            del self._connections[:-self.max_connections]
        for _, extra in surplus:
            extra.close()


_IDLE_CONNECTIONS = IdleConnections(IDLE_CONNECTIONS_KEPT)


class PartitionFetchClient:
    """Reads one topic-partition from its leader; after ``close()`` the next request
    reconnects through Metadata."""

    def __init__(self, config: FetchClientConfig, topic: str, partition: int,
                 idle_connections: IdleConnections = _IDLE_CONNECTIONS) -> None:
        self.config = config
        self.topic = topic
        self.partition = partition
        self._idle_connections = idle_connections
        self._cluster: ClusterKey = (config.bootstrap_servers, config.client_id)
        self._leader: BrokerConnection | None = None
        self._partition_max_bytes = min(config.max_partition_fetch_bytes,
                                        FIRST_FETCH_PARTITION_BYTES)
        self._partition_limit_bytes = config.max_partition_fetch_bytes
        # A response holds at most what was asked for, plus (KIP-74) one first batch over
        # it, no larger than the produce request that brought it.
        self._max_response_bytes = (max(config.fetch_max_bytes, config.max_partition_fetch_bytes)
                                    + LARGEST_BATCH_BYTES)

    def _connection_options(self) -> dict:
        return {"request_timeout_ms": self.config.request_timeout_ms,
                "max_response_bytes": self._max_response_bytes,
                "receive_buffer_bytes": SOCKET_RECEIVE_BUFFER_BYTES, "frame_pool": _FRAMES}

    def connect(self) -> None:
        """Find the leader through Metadata and connect to it.

        Raises ``UnknownTopicOrPartition`` when the cluster does not know the partition,
        ``LeaderNotAvailable`` (retriable) when it has no leader now.
        """
        self.close()
        bootstrap = self._idle_connections.take(self._cluster) or connect_any(
            self.config.bootstrap_servers, self.config.client_id, **self._connection_options())
        try:
            leader_address = self._leader_address(bootstrap)
        except BaseException:
            bootstrap.close()
            raise
        if leader_address == bootstrap.address:
            self._leader = bootstrap
        else:
            self._idle_connections.give_back(self._cluster, bootstrap)
            self._leader = self._idle_connections.take(self._cluster, leader_address) or \
                BrokerConnection(leader_address, self.config.client_id,
                                 **self._connection_options())
        self._leader.max_response_bytes = self._max_response_bytes  # an idle one: another's

    def _leader_address(self, connection: BrokerConnection) -> tuple[str, int]:
        version = connection.version_for(METADATA_KEY, METADATA_VERSIONS)
        body = wire.build(wire.request_class(METADATA_KEY, version),
                          {"topics": [{"name": self.topic}], "allow_auto_topic_creation": False})
        response = connection.request(METADATA_KEY, version, body)
        brokers = {broker.node_id: (broker.host, broker.port) for broker in response.brokers}
        for topic in response.topics:
            if topic.name != self.topic:
                continue
            if int(topic.error_code) != NO_ERROR:
                raise error_for_code(int(topic.error_code), f"Metadata for topic {self.topic}")
            for partition in topic.partitions:
                if partition.partition_index != self.partition:
                    continue
                if int(partition.error_code) != NO_ERROR and partition.leader_id < 0:
                    raise error_for_code(int(partition.error_code),
                                         f"Metadata for {self.topic}-{self.partition}")
                if partition.leader_id not in brokers:
                    raise error_for_code(5, f"{self.topic}-{self.partition} has no leader")
                return brokers[partition.leader_id]
        raise error_for_code(3, f"the cluster does not know {self.topic}-{self.partition}")

    def _connection(self) -> BrokerConnection:
        if self._leader is None:
            self.connect()
        assert self._leader is not None
        return self._leader

    def list_offset(self, timestamp_ms: int) -> int:
        """ListOffsets for one timestamp (EARLIEST_TIMESTAMP: log start, LATEST: log end, or
        the last stable offset under read_committed)."""
        connection = self._connection()
        version = connection.version_for(LIST_OFFSETS_KEY, LIST_OFFSETS_VERSIONS)
        body = wire.build(wire.request_class(LIST_OFFSETS_KEY, version), {
            "replica_id": CONSUMER_REPLICA_ID, "isolation_level": self.config.isolation_level,
            "topics": [{"name": self.topic, "partitions": [{
                "partition_index": self.partition, "current_leader_epoch": NO_LEADER_EPOCH,
                "timestamp": timestamp_ms}]}]})
        response = connection.request(LIST_OFFSETS_KEY, version, body)
        for topic in response.topics:
            for partition in topic.partitions:
                if topic.name == self.topic and partition.partition_index == self.partition:
                    if int(partition.error_code) != NO_ERROR:
                        raise error_for_code(int(partition.error_code),
                                             f"ListOffsets for {self.topic}-{self.partition}")
                    return partition.offset
        raise FetchClientError(f"ListOffsets response lacks {self.topic}-{self.partition}")

    @property
    def partition_fetch_bytes(self) -> int:
        """What the next Fetch asks for at most of the partition."""
        return self._partition_max_bytes

    def send_fetch(self, offset: int) -> None:
        """Send a Fetch for ``offset``; ``receive_fetch`` returns its answer. Each Fetch
        asks for up to twice the partition bytes of the one before, up to the limit."""
        connection = self._connection()
        version = connection.version_for(FETCH_KEY, FETCH_VERSIONS)
        body = wire.build(wire.request_class(FETCH_KEY, version), {
            "replica_id": CONSUMER_REPLICA_ID,
            "max_wait": self.config.fetch_max_wait_ms,
            "min_bytes": self.config.fetch_min_bytes,
            "max_bytes": max(self.config.fetch_max_bytes, self._partition_max_bytes),
            "isolation_level": self.config.isolation_level,
            "session_id": NO_FETCH_SESSION_ID,
            "session_epoch": SESSIONLESS_FETCH_EPOCH,
            "topics": [{"topic": self.topic, "partitions": [{
                "partition": self.partition, "current_leader_epoch": NO_LEADER_EPOCH,
                "fetch_offset": offset, "last_fetched_epoch": NO_LEADER_EPOCH,
                "log_start_offset": -1, "partition_max_bytes": self._partition_max_bytes}]}],
        })
        connection.send(FETCH_KEY, version, body)
        self._partition_max_bytes = min(self._partition_max_bytes * 2,
                                        self._partition_limit_bytes)

    def receive_fetch(self) -> FetchedPartition:
        _, version, frame = self._connection().receive_frame()
        return parse_fetch_response(frame, version, self.topic, self.partition)

    def grow_partition_fetch_bytes(self, batch_bytes: int) -> None:
        """Allow at least one batch of ``batch_bytes`` per fetch (brokers before KIP-74)."""
        self._partition_max_bytes = max(self._partition_max_bytes * 2, batch_bytes)
        self._partition_limit_bytes = max(self._partition_limit_bytes, self._partition_max_bytes)

    def release(self) -> None:
        """Done reading: the connection stays open for the process's next client of this
        cluster (closed instead when a request is still in flight)."""
        if self._leader is not None:
            self._idle_connections.give_back(self._cluster, self._leader)
            self._leader = None

    def close(self) -> None:
        """Drop the connection (after an error: it may be broken, the leader may have moved)."""
        if self._leader is not None:
            self._leader.close()
            self._leader = None


class _Reader:
    """Sequential reads of Kafka primitive types from a response frame."""

    def __init__(self, frame: bytearray | memoryview, flexible: bool) -> None:
        self.view = memoryview(frame)
        self.position = 0
        self.flexible = flexible

    def int16(self) -> int:
        (value,) = _INT16.unpack_from(self.view, self.position)
        self.position += 2
        return value

    def int32(self) -> int:
        (value,) = _INT32.unpack_from(self.view, self.position)
        self.position += 4
        return value

    def int64(self) -> int:
        (value,) = _INT64.unpack_from(self.view, self.position)
        self.position += 8
        return value

    def uvarint(self) -> int:
        value, self.position = read_unsigned(self.view, self.position, error=FetchClientError)
        return value

    def length(self) -> int:
        """An array, string or bytes length; -1 for null."""
        if self.flexible:
            return self.uvarint() - 1
        return self.int32()

    def string(self) -> str | None:
        size = self.uvarint() - 1 if self.flexible else self.int16()
        if size < 0:
            return None
        value = bytes(self.view[self.position:self.position + size]).decode()
        self.position += size
        return value

    def nullable_bytes(self) -> memoryview:
        size = self.length()
        if size < 0:
            return self.view[0:0]
        value = self.view[self.position:self.position + size]
        if len(value) != size:
            raise FetchClientError("records overrun the Fetch response")
        self.position += size
        return value

    def skip_tagged_fields(self) -> None:
        if not self.flexible:
            return
        for _ in range(self.uvarint()):
            self.uvarint()  # tag
            size = self.uvarint()
            self.position += size


def parse_fetch_response(frame: bytearray | memoryview, version: int, topic: str,
                         partition: int) -> FetchedPartition:
    """The named partition of a Fetch v4-v12 response frame (correlation id included).

    A top-level error (v7+) is reported as that partition's error.
    """
    reader = _Reader(frame, flexible=version >= FLEXIBLE_FETCH_VERSION)
    reader.int32()  # correlation id
    reader.skip_tagged_fields()  # response header v1
    reader.int32()  # throttle_time_ms
    top_level_error = NO_ERROR
    if version >= 7:
        top_level_error = reader.int16()
        reader.int32()  # session_id
    found = None
    for _ in range(max(reader.length(), 0)):
        name = reader.string()
        for _ in range(max(reader.length(), 0)):
            fetched, index = _read_partition(reader, version)
            if name == topic and index == partition:
                found = fetched
        reader.skip_tagged_fields()
    if top_level_error != NO_ERROR:
        return FetchedPartition(top_level_error, -1, -1, reader.view[0:0])
    if found is None:
        raise FetchClientError(f"Fetch response lacks {topic}-{partition}")
    return found


def _read_partition(reader: _Reader, version: int) -> tuple[FetchedPartition, int]:
    index = reader.int32()
    error_code = reader.int16()
    high_watermark = reader.int64()
    last_stable_offset = reader.int64()
    log_start_offset = reader.int64() if version >= 5 else -1
    aborted = []
    for _ in range(max(reader.length(), 0)):  # null (-1) under read_uncommitted
        producer_id = reader.int64()
        aborted.append((producer_id, reader.int64()))
        reader.skip_tagged_fields()
    if version >= 11:
        reader.int32()  # preferred_read_replica
    records = reader.nullable_bytes()
    reader.skip_tagged_fields()
    return FetchedPartition(error_code, high_watermark, log_start_offset, records,
                            last_stable_offset, tuple(aborted)), index
