"""A small blocking idempotent Kafka producer for one Spark task: ready record batches in, acks out.

Owns: ``ProduceClientConfig`` (the ``kafka.*`` options this client honours; anything else
raises ``UnsupportedProducerConfig`` so the sink can fall back to confluent-kafka) and
``IdempotentProducer``, which speaks just enough of the Kafka protocol over blocking PLAINTEXT
sockets (``headrace.client.broker_connection``) to write v2 record batches that the caller
encoded (``headrace.spark.encoder.encode_batches``) with the sequences it reserved here:

- Metadata (v1-v12, topic auto-creation allowed as the Java producer asks) finds partition
  counts and leaders; one connection per leader, so a multi-broker cluster works.
- InitProducerId (v0-v4, no transactional id) gives the producer id and epoch; sequences are
  kept per partition from 0 and wrap as Kafka's do.
- Produce (v3-v12, negotiated; encoded by hand so batches go to ``sendmsg`` without a copy)
  with acks=all carries at most one batch per partition and, past its first batch, at most
  ``max.request.size`` bytes; up to ``max.in.flight.requests.per.connection`` (at most 5, the
  broker's deduplication window) requests are in flight per connection.
- Kafka's idempotent retry semantics: a retriable error (NOT_LEADER_OR_FOLLOWER,
  REQUEST_TIMED_OUT, NOT_ENOUGH_REPLICAS, a lost connection...) sends the same batches with
  the same sequences again after ``retry.backoff.ms`` and fresh metadata (the broker keeps one
  copy); OUT_OF_ORDER_SEQUENCE_NUMBER behind such a failure is part of it; a partition sends
  nothing new until its failed batch is written. DUPLICATE_SEQUENCE_NUMBER is success. Any
  other error (OUT_OF_ORDER_SEQUENCE_NUMBER otherwise, INVALID_PRODUCER_EPOCH,
  MESSAGE_TOO_LARGE, INVALID_RECORD, TOPIC_AUTHORIZATION_FAILED...) and a batch unacknowledged
  after ``delivery.timeout.ms`` raise the ``headrace.errors`` exception of its code, naming
  the partition. A topic or partition still unknown after ``UNKNOWN_TOPIC_METADATA_ATTEMPTS``
  metadata requests raises UnknownTopicOrPartition.

Options (Kafka's names; librdkafka spellings accepted): ``bootstrap.servers``, ``client.id``,
``acks`` (all / -1 only), ``enable.idempotence`` (true only), ``compression.type``
(``compression.codec``: none, gzip, snappy, lz4, zstd), ``batch.size`` (bytes per batch,
default 1 MiB), ``max.request.size`` (``message.max.bytes``; default 8 MiB), ``request.timeout.ms``
(``socket.timeout.ms``), ``delivery.timeout.ms`` (``message.timeout.ms``),
``retry.backoff.ms``, ``max.in.flight.requests.per.connection`` (``max.in.flight``),
``buffer.memory`` (unacknowledged bytes held before ``send`` waits), and ``linger.ms``
(``queue.buffering.max.ms``), accepted without effect: batches are built from whole Arrow
batches, never waiting. Only ``security.protocol=PLAINTEXT``.

Not thread-safe: one producer per Spark task. Time comes from an injected clock.
"""

from __future__ import annotations

import struct
import time
from collections import deque
from dataclasses import dataclass, field

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
from headrace.errors import (
    DuplicateSequenceNumber,
    LeaderNotAvailable,
    MessageTooLarge,
    NetworkException,
    OutOfOrderSequenceNumber,
    UnknownTopicOrPartition,
    error_for_code,
)
from headrace.protocol import wire
from headrace.protocol.compression import NONE, codec_by_name
from headrace.protocol.varint import encode_unsigned
from headrace.spark.encoder import increment_sequence
from headrace.storage.clock import Clock, SystemClock

PRODUCE_KEY = 0
METADATA_KEY = 3
INIT_PRODUCER_ID_KEY = 22
PRODUCE_VERSIONS = (3, 12)  # v13+ name topics by id
FLEXIBLE_PRODUCE_VERSION = 9
METADATA_VERSIONS = (1, 12)
INIT_PRODUCER_ID_VERSIONS = (0, 4)
ACKS_ALL = -1
NO_TRANSACTION_TIMEOUT_MS = 60_000  # InitProducerId's field; unused without a transactional id
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000  # the Java producer's transaction.timeout.ms
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
DEFAULT_CLIENT_ID = "headrace-spark-sink"
DEFAULT_BATCH_BYTES = 1024 * 1024
# The sink's default max.request.size (the Java producer's is 1 MiB): room for a 1 MiB batch of
# each of several partitions in one request, far below the broker's socket.request.max.bytes
# (100 MiB). Measured: 1M rows of 1 KiB into 6 partitions used ~10% less CPU than with 1 MiB.
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
DEFAULT_DELIVERY_TIMEOUT_MS = 120_000
DEFAULT_RETRY_BACKOFF_MS = 100
DEFAULT_MAX_IN_FLIGHT_REQUESTS = 5
MAX_IDEMPOTENT_IN_FLIGHT_REQUESTS = 5  # the broker remembers a producer's last 5 batches
DEFAULT_BUFFER_MEMORY_BYTES = 32 * 1024 * 1024
SOCKET_SEND_BUFFER_BYTES = 4 * 1024 * 1024
UNKNOWN_TOPIC_METADATA_ATTEMPTS = 5
INIT_PRODUCER_ID_ATTEMPTS = 10

_TRUE_VALUES = ("true",)
_ACKS_ALL_VALUES = ("all", "-1")
# Accepted, but without effect on this client (see the module docstring).
_IGNORED_OPTIONS = ("linger.ms", "queue.buffering.max.ms")
_INT16 = struct.Struct(">h")
_INT32 = struct.Struct(">i")
_PRODUCE_FIXED = struct.Struct(">hi")  # acks, timeout_ms


class UnsupportedProducerConfig(WireClientError):
    """A ``kafka.*`` option or value this client does not implement."""


_OPTION_NAMES = {
    "bootstrap.servers", "client.id", "security.protocol", "acks", "enable.idempotence",
    "compression.type", "compression.codec", "batch.size", "max.request.size",
    "message.max.bytes", "request.timeout.ms", "socket.timeout.ms", "delivery.timeout.ms",
    "message.timeout.ms", "retry.backoff.ms", "max.in.flight.requests.per.connection",
    "max.in.flight", "buffer.memory", "transaction.timeout.ms", *_IGNORED_OPTIONS,
}


@dataclass(frozen=True, slots=True)
class ProduceClientConfig:
    bootstrap_servers: tuple[tuple[str, int], ...]
    client_id: str = DEFAULT_CLIENT_ID
    codec: int = NONE
    batch_bytes: int = DEFAULT_BATCH_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS
    delivery_timeout_ms: int = DEFAULT_DELIVERY_TIMEOUT_MS
    retry_backoff_ms: int = DEFAULT_RETRY_BACKOFF_MS
    max_in_flight_requests: int = DEFAULT_MAX_IN_FLIGHT_REQUESTS
    buffer_memory_bytes: int = DEFAULT_BUFFER_MEMORY_BYTES
    transaction_timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS

    @classmethod
    def from_client_options(cls, options: dict[str, str]) -> ProduceClientConfig:
        """From the sink's ``kafka.*`` options (prefix removed); UnsupportedProducerConfig
        names what this client cannot honour."""
        unknown = sorted(set(options) - _OPTION_NAMES)
        if unknown:
            raise UnsupportedProducerConfig(f"options {unknown} are not implemented")
        try:
            check_plaintext(options, "sink's produce client")
        except WireClientError as error:
            raise UnsupportedProducerConfig(str(error)) from error
        if options.get("acks", "all").strip().lower() not in _ACKS_ALL_VALUES:
            raise UnsupportedProducerConfig("only acks=all is implemented")
        if options.get("enable.idempotence", "true").strip().lower() not in _TRUE_VALUES:
            raise UnsupportedProducerConfig("only the idempotent producer is implemented")
        codec_text = options.get("compression.type", options.get("compression.codec", "none"))
        codec = codec_by_name(codec_text)
        if codec is None:
            raise UnsupportedProducerConfig(f"compression.type {codec_text!r}")
        max_in_flight = first_option(
            options, ("max.in.flight.requests.per.connection", "max.in.flight"),
            DEFAULT_MAX_IN_FLIGHT_REQUESTS)
        if not 1 <= max_in_flight <= MAX_IDEMPOTENT_IN_FLIGHT_REQUESTS:
            raise UnsupportedProducerConfig(
                f"max.in.flight.requests.per.connection {max_in_flight}: an idempotent "
                f"producer allows 1-{MAX_IDEMPOTENT_IN_FLIGHT_REQUESTS}")
        return cls(
            bootstrap_servers=parse_servers(options["bootstrap.servers"]),
            client_id=options.get("client.id", DEFAULT_CLIENT_ID),
            codec=codec,
            batch_bytes=first_option(options, ("batch.size",), DEFAULT_BATCH_BYTES),
            max_request_bytes=first_option(options, ("max.request.size", "message.max.bytes"),
                                           DEFAULT_MAX_REQUEST_BYTES),
            request_timeout_ms=first_option(options, ("request.timeout.ms",
                                                      "socket.timeout.ms"),
                                            DEFAULT_REQUEST_TIMEOUT_MS),
            delivery_timeout_ms=first_option(options, ("delivery.timeout.ms",
                                                       "message.timeout.ms"),
                                             DEFAULT_DELIVERY_TIMEOUT_MS),
            retry_backoff_ms=first_option(options, ("retry.backoff.ms",),
                                          DEFAULT_RETRY_BACKOFF_MS),
            max_in_flight_requests=max_in_flight,
            buffer_memory_bytes=first_option(options, ("buffer.memory",),
                                             DEFAULT_BUFFER_MEMORY_BYTES),
            transaction_timeout_ms=first_option(options, ("transaction.timeout.ms",),
                                                DEFAULT_TRANSACTION_TIMEOUT_MS),
        )


TopicPartition = tuple[str, int]


@dataclass(slots=True)
class _Batch:
    topic_partition: TopicPartition
    data: memoryview
    records: int
    created_ms: int


@dataclass(slots=True)
class _PartitionState:
    """A partition's unacknowledged batches in sequence order; the first ``in_flight`` of
    them are sent and unanswered."""

    next_sequence: int = 0
    batches: deque[_Batch] = field(default_factory=deque)
    in_flight: int = 0
    failed: bool = False  # a batch failed retriably: nothing new goes until all are answered
    retry_at_ms: int = 0
    last_error: Exception | None = None


@dataclass(slots=True)
class _Leader:
    connection: BrokerConnection
    produce_version: int
    requests: deque[tuple[int, list[_Batch]]] = field(default_factory=deque)  # send order


class IdempotentProducer:
    """Writes ready v2 batches to their partitions' leaders; see the module docstring."""

    transactional_id: str | None = None  # Produce requests name it (see wire_transaction)

    def __init__(self, config: ProduceClientConfig, clock: Clock | None = None) -> None:
        self.config = config
        self._clock = clock or SystemClock()
        self._partitions: dict[TopicPartition, _PartitionState] = {}
        self._leader_of: dict[TopicPartition, int] = {}
        self._partition_counts: dict[str, int] = {}
        self._brokers: dict[int, tuple[str, int]] = {}
        self._leaders: dict[int, _Leader] = {}
        self._metadata_stale = False
        self._unacknowledged_bytes = 0
        self._requests_sent = 0
        self._metadata_connection: BrokerConnection | None = None
        self.records_acknowledged = 0
        self.producer_id, self.producer_epoch = self._init_producer_id()

    # -- metadata and producer id ------------------------------------------------------

    def _bootstrap(self) -> BrokerConnection:
        return connect_any(self.config.bootstrap_servers, self.config.client_id,
                           request_timeout_ms=self.config.request_timeout_ms)

    def _init_producer_id(self) -> tuple[int, int]:
        connection = self._metadata_connection = self._bootstrap()
        try:
            version = connection.version_for(INIT_PRODUCER_ID_KEY, INIT_PRODUCER_ID_VERSIONS)
            body = wire.build(wire.request_class(INIT_PRODUCER_ID_KEY, version), {
                "transactional_id": None, "transaction_timeout_ms": NO_TRANSACTION_TIMEOUT_MS,
                "producer_id": NO_PRODUCER_ID, "producer_epoch": NO_PRODUCER_EPOCH})
            for _ in range(INIT_PRODUCER_ID_ATTEMPTS):
                response = connection.request(INIT_PRODUCER_ID_KEY, version, body)
                code = int(response.error_code)
                if code == NO_ERROR:
                    return int(response.producer_id), int(response.producer_epoch)
                error = error_for_code(code, "InitProducerId failed")
                if not error.retriable:
                    raise error
                self._sleep_ms(self.config.retry_backoff_ms)
            raise error
        except BaseException:
            self._drop_metadata_connection()
            raise

    def partition_count(self, topic: str) -> int:
        """Partitions of ``topic`` (from metadata, cached); UnknownTopicOrPartition if the
        cluster still does not know it after a few metadata requests."""
        if topic not in self._partition_counts:
            self._refresh_metadata({topic})
        return self._partition_counts[topic]

    def _refresh_metadata(self, topics: set[str]) -> None:
        for attempt in range(UNKNOWN_TOPIC_METADATA_ATTEMPTS):
            try:
                missing = self._request_metadata(topics)
            except OSError as error:  # that broker is gone: the next attempt asks another
                self._drop_metadata_connection()
                missing = [NetworkException(f"Metadata request failed: {error}")]
            if not missing:
                self._metadata_stale = False
                return
            fatal = [error for error in missing if not getattr(error, "retriable", False)]
            if fatal:  # e.g. TOPIC_AUTHORIZATION_FAILED, INVALID_TOPIC_EXCEPTION
                raise fatal[0]
            if attempt + 1 < UNKNOWN_TOPIC_METADATA_ATTEMPTS:
                self._sleep_ms(self.config.retry_backoff_ms)
        raise missing[0]

    def _request_metadata(self, topics: set[str]) -> list[Exception]:
        """Ask for ``topics``; returns the errors of those still unusable."""
        connection = self._any_connection()
        version = connection.version_for(METADATA_KEY, METADATA_VERSIONS)
        body = wire.build(wire.request_class(METADATA_KEY, version), {
            "topics": [{"name": topic} for topic in sorted(topics)],
            "allow_auto_topic_creation": True})
        response = connection.request(METADATA_KEY, version, body)
        self._brokers = {broker.node_id: (broker.host, broker.port)
                         for broker in response.brokers}
        missing: list[Exception] = []
        for topic in response.topics:
            code = int(topic.error_code)
            if code != NO_ERROR:
                missing.append(error_for_code(code, f"Metadata for topic {topic.name}"))
                continue
            self._partition_counts[topic.name] = len(topic.partitions)
            for partition in topic.partitions:
                self._leader_of[(topic.name, partition.partition_index)] = partition.leader_id
        absent = topics - {topic.name for topic in response.topics}
        missing += [UnknownTopicOrPartition(f"the cluster does not know topic {name}")
                    for name in sorted(absent)]
        return missing

    def _drop_metadata_connection(self) -> None:
        if self._metadata_connection is not None:
            self._metadata_connection.close()
            self._metadata_connection = None

    def _any_connection(self) -> BrokerConnection:
        """The connection for metadata: the bootstrap connection InitProducerId used, or a
        new one to the first reachable bootstrap server once that one failed."""
        if self._metadata_connection is None:
            self._metadata_connection = self._bootstrap()
        return self._metadata_connection

    # -- sending ---------------------------------------------------------------------

    def reserve_sequences(self, topic: str, partition: int, records: int) -> int:
        """The base sequence of the next ``records`` records to ``topic``-``partition``."""
        state = self._partition_state((topic, partition))
        base = state.next_sequence
        state.next_sequence = increment_sequence(base, records)
        return base

    def _partition_state(self, topic_partition: TopicPartition) -> _PartitionState:
        state = self._partitions.get(topic_partition)
        if state is None:
            state = self._partitions[topic_partition] = _PartitionState()
        return state

    def send(self, topic: str, partition: int, batches: list[tuple[memoryview, int]]) -> None:
        """Queue ``(batch bytes, record count)`` batches (their sequences reserved, in
        order) and send what can go; waits for acknowledgements while more than
        ``buffer.memory`` bytes are unacknowledged."""
        if partition >= self.partition_count(topic) or partition < 0:
            raise UnknownTopicOrPartition(
                f"unknown partition {topic}-{partition}: the topic has "
                f"{self._partition_counts[topic]} partitions")
        state = self._partition_state((topic, partition))
        now_ms = self._clock.monotonic_ms()
        for data, records in batches:
            state.batches.append(_Batch((topic, partition), data, records, now_ms))
            self._unacknowledged_bytes += len(data)
        self._send_ready()
        while self._unacknowledged_bytes > self.config.buffer_memory_bytes:
            self._await_progress()
            self._send_ready()

    def flush(self) -> int:
        """Wait until every batch is acknowledged; returns the records acknowledged."""
        while any(state.batches for state in self._partitions.values()):
            self._send_ready()
            self._await_progress()
        return self.records_acknowledged

    def _await_progress(self) -> None:
        """Receive the oldest response in flight, or, with none in flight, sleep until the
        earliest partition retry is due."""
        waiting = [(leader.requests[0][0], node) for node, leader in self._leaders.items()
                   if leader.requests]
        if waiting:
            self._receive_response(min(waiting)[1])
            return
        due = [state.retry_at_ms for state in self._partitions.values() if state.batches]
        if due:
            self._sleep_ms(min(due) - self._clock.monotonic_ms())

    def _sendable(self, now_ms: int) -> dict[int, list[_PartitionState]]:
        """Partitions with a batch to send now, by leader node."""
        by_leader: dict[int, list[_PartitionState]] = {}
        for topic_partition, state in self._partitions.items():
            if (state.failed or state.in_flight >= len(state.batches)
                    or state.retry_at_ms > now_ms):
                continue
            by_leader.setdefault(self._leader_of.get(topic_partition, -1), []).append(state)
        return by_leader

    def _send_ready(self) -> None:
        now_ms = self._clock.monotonic_ms()
        if self._metadata_stale:
            self._refresh_metadata({topic for (topic, _), state in self._partitions.items()
                                    if state.batches})
        for node, states in self._sendable(now_ms).items():
            leader = self._leader(node, states, now_ms)
            if leader is None:
                continue
            while leader.connection.in_flight_count < self.config.max_in_flight_requests:
                batches = self._next_request(states)
                if not batches:
                    break
                self._send_request(node, leader, batches)

    def _leader(self, node: int, states: list[_PartitionState], now_ms: int) -> _Leader | None:
        """The connection to ``node``; None (the partitions retried later) if it has no
        address or cannot be reached."""
        leader = self._leaders.get(node)
        if leader is not None:
            return leader
        try:
            if node not in self._brokers:
                raise LeaderNotAvailable(f"leader {node} is not in the cluster's metadata")
            connection = BrokerConnection(self._brokers[node], self.config.client_id,
                                          request_timeout_ms=self.config.request_timeout_ms,
                                          send_buffer_bytes=SOCKET_SEND_BUFFER_BYTES)
        except (OSError, LeaderNotAvailable) as error:
            for state in states:
                self._schedule_retry(state, error, now_ms)
            self._metadata_stale = True
            return None
        version = connection.version_for(PRODUCE_KEY, PRODUCE_VERSIONS)
        leader = self._leaders[node] = _Leader(connection, version)
        return leader

    def _next_request(self, states: list[_PartitionState]) -> list[_Batch]:
        """The next unsent batch of each partition, up to max.request.size (at least one)."""
        batches: list[_Batch] = []
        size = 0
        for state in states:
            if state.failed or state.in_flight >= len(state.batches):
                continue
            batch = state.batches[state.in_flight]
            if batches and size + len(batch.data) > self.config.max_request_bytes:
                continue
            batches.append(batch)
            size += len(batch.data)
            state.in_flight += 1
        return batches

    def _send_request(self, node: int, leader: _Leader, batches: list[_Batch]) -> None:
        version = leader.produce_version
        pieces = encode_produce_request(
            leader.connection.request_header(PRODUCE_KEY, version,
                                             version >= FLEXIBLE_PRODUCE_VERSION),
            version, self.config.request_timeout_ms, batches, self.transactional_id)
        self._requests_sent += 1
        leader.requests.append((self._requests_sent, batches))
        try:
            leader.connection.send_pieces(PRODUCE_KEY, version, pieces)
        except OSError as error:
            self._connection_lost(node, error)

    # -- responses ---------------------------------------------------------------------

    def _receive_response(self, node: int) -> None:
        leader = self._leaders[node]
        try:
            response = leader.connection.receive()
        except (OSError, WireClientError) as error:
            self._connection_lost(node, error)
            return
        _, batches = leader.requests.popleft()
        results = {(topic.name, partition.index): partition
                   for topic in response.responses for partition in topic.partition_responses}
        now_ms = self._clock.monotonic_ms()
        for batch in batches:
            result = results.get(batch.topic_partition)
            if result is None:
                raise WireClientError(f"Produce response lacks {_name(batch.topic_partition)}")
            self._batch_answered(batch, int(result.error_code),
                                 getattr(result, "error_message", None), now_ms)

    def _batch_answered(self, batch: _Batch, code: int, message: str | None,
                        now_ms: int) -> None:
        state = self._partitions[batch.topic_partition]
        state.in_flight -= 1
        if code in (NO_ERROR, DuplicateSequenceNumber.code):
            self._acknowledge(state, batch)
            if state.failed and not state.in_flight:
                state.failed = False
                state.retry_at_ms = now_ms + self.config.retry_backoff_ms
            return
        error = error_for_code(code, _failure_text(batch, code, message))
        if error.retriable or (code == OutOfOrderSequenceNumber.code and state.failed):
            self._schedule_retry(state, error, now_ms)
            self._metadata_stale = True
            return
        raise error

    def _acknowledge(self, state: _PartitionState, batch: _Batch) -> None:
        """``batch`` is written: it is the partition's first unacknowledged batch, as a
        partition's batches are answered in sequence order."""
        if not state.batches or state.batches[0] is not batch:
            raise WireClientError(
                f"{_name(batch.topic_partition)} acknowledged a batch out of sequence order")
        state.batches.popleft()
        self._unacknowledged_bytes -= len(batch.data)
        self.records_acknowledged += batch.records

    def _schedule_retry(self, state: _PartitionState, error: Exception, now_ms: int) -> None:
        """Resend from the partition's first unacknowledged batch once all its batches in
        flight are answered and the backoff has passed -- unless its delivery timed out."""
        state.failed = state.in_flight > 0
        state.last_error = error
        if state.failed:
            return
        if state.batches and now_ms - state.batches[0].created_ms > self.config.delivery_timeout_ms:
            raise type(error)(
                f"{error} (no acknowledgement within delivery.timeout.ms "
                f"{self.config.delivery_timeout_ms})")
        state.retry_at_ms = now_ms + self.config.retry_backoff_ms

    def _connection_lost(self, node: int, error: Exception) -> None:
        """Every batch in flight on ``node``'s connection is retried."""
        leader = self._leaders.pop(node)
        leader.connection.close()
        now_ms = self._clock.monotonic_ms()
        lost = [batch for _, batches in leader.requests for batch in batches]
        for batch in lost:
            self._partitions[batch.topic_partition].in_flight -= 1
        for batch in lost:
            self._schedule_retry(self._partitions[batch.topic_partition],
                                 NetworkException(f"connection to {leader.connection.address} "
                                                    f"lost: {error}"), now_ms)
        self._metadata_stale = True

    def _sleep_ms(self, duration_ms: int) -> None:
        if duration_ms > 0:
            time.sleep(duration_ms / 1000)

    def close(self) -> None:
        for leader in self._leaders.values():
            leader.connection.close()
        self._leaders.clear()
        self._drop_metadata_connection()


def _name(topic_partition: TopicPartition) -> str:
    return f"{topic_partition[0]}-{topic_partition[1]}"


def _failure_text(batch: _Batch, code: int, message: str | None) -> str:
    text = f"Produce of {batch.records} records to {_name(batch.topic_partition)} failed"
    if code == MessageTooLarge.code:
        text += (f": a batch of {len(batch.data)} bytes is larger than the broker accepts "
                 "(message.max.bytes / max.message.bytes); lower kafka.batch.size")
    return f"{text}: {message}" if message else text


def _nullable_string(text: str | None, flexible: bool) -> bytes:
    if text is None:
        return b"\x00" if flexible else _INT16.pack(-1)
    data = text.encode()
    return (encode_unsigned(len(data) + 1) if flexible else _INT16.pack(len(data))) + data


def encode_produce_request(header: bytes, version: int, timeout_ms: int,
                           batches: list[_Batch], transactional_id: str | None = None) -> list:
    """The pieces of a Produce request (v3-v12, acks=all, ``transactional_id`` or null)
    carrying one batch per partition: hand-encoded framing around the batches' own buffers."""
    flexible = version >= FLEXIBLE_PRODUCE_VERSION
    by_topic: dict[str, list[_Batch]] = {}
    for batch in batches:
        by_topic.setdefault(batch.topic_partition[0], []).append(batch)

    def count(n: int) -> bytes:
        return encode_unsigned(n + 1) if flexible else _INT32.pack(n)

    prefix = bytearray(header)
    prefix += _nullable_string(transactional_id, flexible)
    prefix += _PRODUCE_FIXED.pack(ACKS_ALL, timeout_ms) + count(len(by_topic))
    pieces: list = []
    for topic, topic_batches in by_topic.items():
        name = topic.encode()
        prefix += (encode_unsigned(len(name) + 1) if flexible else _INT16.pack(len(name))) + name
        prefix += count(len(topic_batches))
        for index, batch in enumerate(topic_batches):
            prefix += _INT32.pack(batch.topic_partition[1]) + count(len(batch.data))
            pieces += (bytes(prefix), batch.data)
            prefix = bytearray(b"\x00" if flexible else b"")  # partition tagged fields
            if index == len(topic_batches) - 1 and flexible:
                prefix += b"\x00"  # topic tagged fields
    prefix += b"\x00" if flexible else b""  # request tagged fields
    pieces.append(bytes(prefix))
    return pieces
