"""``headrace transactions``: list, describe, describe-producers, abort and find-hanging, after
Kafka's ``kafka-transactions.sh`` (``TransactionsCommand``): same subcommands, options,
columns and rules, with ``--output json`` beside the table.

confluent-kafka's AdminClient has none of these calls, so they go over headrace's blocking
wire client (``headrace.client.broker_connection``), one connection per broker named by the
cluster's metadata (read with the AdminClient, as the other commands do):

* ``list``: ListTransactions to every broker (each coordinator lists its own ids), filtered
  by ``--state``, ``--producer-id`` (repeatable) and ``--duration-filter`` ms (v1);
* ``describe --transactional-id``: FindCoordinator (key type 1), then DescribeTransactions
  to the coordinator. Its answer is read by ``_read_descriptions`` rather than kio, which
  refuses the start time -1 of an id with no transaction;
* ``describe-producers --topic --partition [--broker-id]``: DescribeProducers to the
  partition's leader (or the broker named);
* ``abort --topic --partition`` with ``--start-offset`` (the producer whose ongoing
  transaction starts there, found with DescribeProducers; its coordinator epoch, 0 when it
  has none) or ``--producer-id --producer-epoch --coordinator-epoch`` (a negative epoch taken
  as 0, as Kafka's): WriteTxnMarkers with an abort marker to the partition's leader;
* ``find-hanging --broker-id | --topic [--partition] [--max-transaction-timeout MIN]``: the
  open transactions whose producer's last write is older than the maximum transaction
  timeout (15 minutes by default) and that their coordinator does not know about (no
  transactional id lists the producer id, or the id's description lacks the partition).

A mistake (missing option, unknown topic, no transaction at the offset, an error code
answered) is one line on stderr and exit status 1. Durations are measured against the time
read once when the command starts. Stateless; runs on the main thread.
"""

from __future__ import annotations

import struct
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import typer

from headrace.cli.common import (
    DEFAULT_CONNECTION,
    Connection,
    OutputFormat,
    OutputOption,
    UserError,
    connection_options,
    emit,
    make_table,
    report,
    topic_partitions,
    user_errors,
)
from headrace.cli.raw_requests import broker_failures, connect_broker
from headrace.client.broker_connection import BrokerConnection
from headrace.errors import ERRORS_BY_CODE, TransactionalIdNotFound, UnknownServerError
from headrace.protocol.wire import skip_tagged_fields

FIND_COORDINATOR_KEY = 10
FIND_COORDINATOR_VERSIONS = (1, 3)  # one key per request
TRANSACTION_KEY_TYPE = 1
WRITE_TXN_MARKERS_KEY = 27
WRITE_TXN_MARKERS_VERSIONS = (1, 1)
DESCRIBE_PRODUCERS_KEY = 61
DESCRIBE_PRODUCERS_VERSIONS = (0, 0)
DESCRIBE_TRANSACTIONS_KEY = 65
DESCRIBE_TRANSACTIONS_VERSIONS = (0, 0)
LIST_TRANSACTIONS_KEY = 66
LIST_TRANSACTIONS_VERSIONS = (0, 1)
DURATION_FILTER_VERSION = 1
DEFAULT_MAX_TRANSACTION_TIMEOUT_MINUTES = 15  # Kafka's find-hanging default
MS_PER_MINUTE = 60_000
NO_VALUE = -1

app = typer.Typer(no_args_is_help=True, help=(
    "Analyze the transactional state of producers and recover from hanging transactions."))

TopicOption = Annotated[str, typer.Option("--topic", help="topic name")]
PartitionOption = Annotated[int, typer.Option("--partition", min=0, help="partition number")]


def _error_name(code: int) -> str:
    return ERRORS_BY_CODE.get(code, UnknownServerError).__name__


def _check(code: int, what: str, message: str | None = None) -> None:
    if code:
        detail = f": {message}" if message else ""
        raise UserError(f"{what}: {_error_name(code)}{detail}")


class _Cluster:
    """The cluster's metadata and one wire connection per broker, opened on first use."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.admin, self.metadata = connection.admin()
        self._open: dict[int, BrokerConnection] = {}

    def broker(self, broker_id: int) -> BrokerConnection:
        if broker_id not in self._open:
            broker = self.metadata.brokers.get(broker_id)
            if broker is None:
                raise UserError(f"no broker with id {broker_id} in the cluster")
            self._open[broker_id] = connect_broker(broker.host, broker.port,
                                                   self.connection.request_timeout_ms)
        return self._open[broker_id]

    def request(self, broker_id: int, api_key: int, versions: tuple[int, int],
                values: dict[str, Any]) -> Any:
        wire_connection = self.broker(broker_id)
        with broker_failures(wire_connection):
            version = wire_connection.version_for(api_key, versions)
            return wire_connection.request_values(api_key, version, values)

    def leader(self, topic: str, partition: int) -> int:
        if partition not in topic_partitions(self.metadata, topic):
            raise UserError(f"topic {topic!r} has no partition {partition}")
        leader = self.metadata.topics[topic].partitions[partition].leader
        if leader < 0:
            raise UserError(f"{topic}-{partition} has no leader")
        return leader

    def close(self) -> None:
        for wire_connection in self._open.values():
            wire_connection.close()


@contextmanager
def _cluster(connection: Connection) -> Iterator[_Cluster]:
    cluster = _Cluster(connection)
    try:
        yield cluster
    finally:
        cluster.close()


# --- DescribeProducers ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ProducerState:
    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int
    last_sequence: int
    last_timestamp_ms: int
    current_transaction_start_offset: int

    def as_json(self) -> dict[str, Any]:
        start = self.current_transaction_start_offset
        return {"topic": self.topic, "partition": self.partition,
                "producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
                "coordinator_epoch": self.coordinator_epoch,
                "last_sequence": self.last_sequence, "last_timestamp_ms": self.last_timestamp_ms,
                "current_transaction_start_offset": None if start < 0 else start}


def describe_producers(cluster: _Cluster, partitions: list[tuple[str, int]],
                       broker_id: int | None = None) -> list[ProducerState]:
    """The producers of ``partitions`` as their leaders (or ``broker_id``) describe them."""
    by_broker: dict[int, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for topic, partition in partitions:
        target = cluster.leader(topic, partition) if broker_id is None else broker_id
        by_broker[target][topic].append(partition)
    states = []
    for target, topics in by_broker.items():
        response = cluster.request(target, DESCRIBE_PRODUCERS_KEY, DESCRIBE_PRODUCERS_VERSIONS, {
            "topics": [{"name": t, "partition_indexes": p} for t, p in topics.items()]})
        for topic in response.topics:
            for answer in topic.partitions:
                _check(answer.error_code, f"failed to describe producers for partition "
                       f"{topic.name}-{answer.partition_index} on broker {target}",
                       answer.error_message)
                states += [ProducerState(
                    topic.name, answer.partition_index, p.producer_id, p.producer_epoch,
                    p.coordinator_epoch, p.last_sequence, p.last_timestamp,
                    p.current_txn_start_offset) for p in answer.active_producers]
    return states


# --- ListTransactions and DescribeTransactions ---------------------------------------------


def list_transactions(cluster: _Cluster, states: list[str], producer_ids: list[int],
                      duration_ms: int | None = None) -> list[dict[str, Any]]:
    """Every coordinator's transactional ids that pass the filters."""
    listed = []
    for broker_id in sorted(cluster.metadata.brokers):
        versions = LIST_TRANSACTIONS_VERSIONS
        if duration_ms is not None:
            versions = (DURATION_FILTER_VERSION, versions[1])
        response = cluster.request(broker_id, LIST_TRANSACTIONS_KEY, versions, {
            "state_filters": states, "producer_id_filters": producer_ids,
            "duration_filter": NO_VALUE if duration_ms is None else duration_ms})
        _check(response.error_code, f"failed to list transactions on broker {broker_id}")
        if response.unknown_state_filters:
            raise UserError("unknown transaction states: "
                            + ", ".join(response.unknown_state_filters))
        listed += [{"transactional_id": t.transactional_id, "coordinator_id": broker_id,
                    "producer_id": t.producer_id, "state": t.transaction_state}
                   for t in response.transaction_states]
    return listed


class _FrameReader:
    """Reads a flexible response body field by field."""

    def __init__(self, frame: bytes, position: int) -> None:
        self.frame = frame
        self.position = position

    def unpack(self, layout: str) -> int:
        (value,) = struct.unpack_from(layout, self.frame, self.position)
        self.position += struct.calcsize(layout)
        return value

    def uvarint(self) -> int:
        value = shift = 0
        while True:
            byte = self.frame[self.position]
            self.position += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value

    def string(self) -> str:
        length = self.uvarint() - 1
        text = self.frame[self.position:self.position + length].decode()
        self.position += length
        return text

    def skip_tags(self) -> None:
        self.position = skip_tagged_fields(self.frame, self.position)


def _read_descriptions(frame: bytes) -> list[dict[str, Any]]:
    """DescribeTransactions v0's answer: (response header, then) throttle, and per id its
    error, id, state, timeout, start time, producer id and epoch, topics and partitions."""
    reader = _FrameReader(frame, 4)
    reader.skip_tags()
    reader.unpack(">i")
    described = []
    for _ in range(reader.uvarint() - 1):
        item = {"error_code": reader.unpack(">h"), "transactional_id": reader.string(),
                "state": reader.string(), "transaction_timeout_ms": reader.unpack(">i"),
                "transaction_start_time_ms": reader.unpack(">q"),
                "producer_id": reader.unpack(">q"), "producer_epoch": reader.unpack(">h"),
                "topic_partitions": []}
        for _ in range(reader.uvarint() - 1):
            topic = reader.string()
            item["topic_partitions"] += [(topic, reader.unpack(">i"))
                                         for _ in range(reader.uvarint() - 1)]
            reader.skip_tags()
        reader.skip_tags()
        described.append(item)
    return described


def find_coordinator(cluster: _Cluster, transactional_id: str) -> int:
    any_broker = min(cluster.metadata.brokers)
    response = cluster.request(any_broker, FIND_COORDINATOR_KEY, FIND_COORDINATOR_VERSIONS,
                               {"key": transactional_id, "key_type": TRANSACTION_KEY_TYPE})
    _check(response.error_code, f"no coordinator for transactional id {transactional_id!r}",
           response.error_message)
    return response.node_id


def describe_transactions(cluster: _Cluster, coordinator: int, transactional_ids: list[str]
                          ) -> list[dict[str, Any]]:
    wire_connection = cluster.broker(coordinator)
    with broker_failures(wire_connection):
        version = wire_connection.version_for(DESCRIBE_TRANSACTIONS_KEY,
                                              DESCRIBE_TRANSACTIONS_VERSIONS)
        wire_connection.send_values(DESCRIBE_TRANSACTIONS_KEY, version,
                                    {"transactional_ids": transactional_ids})
        _, _, frame = wire_connection.receive_frame()
    try:
        return _read_descriptions(bytes(frame))
    except (IndexError, struct.error, UnicodeDecodeError) as error:
        raise UserError(f"undecodable DescribeTransactions answer from broker "
                        f"{coordinator}: {error}") from None


# --- the commands --------------------------------------------------------------------------


@app.command("list")
@connection_options
def list_command(
    state: Annotated[list[str] | None, typer.Option(
        "--state", help="only ids in this state, e.g. Ongoing (repeatable)")] = None,
    producer_id: Annotated[list[int] | None, typer.Option(
        "--producer-id", help="only ids of this producer id (repeatable)")] = None,
    duration_filter: Annotated[int | None, typer.Option(
        "--duration-filter", help="only transactions running longer than this many ms")] = None,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """List the transactional ids of every coordinator."""
    with user_errors(), _cluster(connection) as cluster:
        duration_ms = None if duration_filter is None or duration_filter < 0 else duration_filter
        rows = list_transactions(cluster, list(state or []), list(producer_id or []),
                                 duration_ms)
        columns = ["transactional_id", "coordinator_id", "producer_id", "state"]
        table = make_table(None, ["TransactionalId", "Coordinator", "ProducerId",
                                  "TransactionState"],
                           [[row[c] for c in columns] for row in rows])
        emit(output, {"transactions": rows}, table)


@app.command()
@connection_options
def describe(
    transactional_id: Annotated[str, typer.Option("--transactional-id", help="transactional id")],
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Describe the state of a transactional id."""
    now_ms = int(time.time() * 1000)
    with user_errors(), _cluster(connection) as cluster:
        coordinator = find_coordinator(cluster, transactional_id)
        (item,) = describe_transactions(cluster, coordinator, [transactional_id])
        _check(item.pop("error_code"),
               f"failed to describe transaction state of transactional-id `{transactional_id}`")
        start_ms = item["transaction_start_time_ms"]
        item.update(coordinator_id=coordinator,
                    transaction_start_time_ms=None if start_ms < 0 else start_ms,
                    transaction_duration_ms=None if start_ms < 0 else now_ms - start_ms,
                    topic_partitions=[f"{t}-{p}" for t, p in item["topic_partitions"]])
        columns = ["coordinator_id", "transactional_id", "producer_id", "producer_epoch",
                   "state", "transaction_timeout_ms", "transaction_start_time_ms",
                   "transaction_duration_ms"]
        row = ["None" if item[c] is None else item[c] for c in columns]
        table = make_table(None, [
            "CoordinatorId", "TransactionalId", "ProducerId", "ProducerEpoch",
            "TransactionState", "TransactionTimeoutMs", "CurrentTransactionStartTimeMs",
            "TransactionDurationMs", "TopicPartitions"],
            [row + [",".join(item["topic_partitions"])]])
        emit(output, item, table)


@app.command("describe-producers")
@connection_options
def describe_producers_command(
    topic: TopicOption,
    partition: PartitionOption,
    broker_id: Annotated[int | None, typer.Option(
        "--broker-id", help="describe the producer state on this replica, not the leader")
    ] = None,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Describe the states of the active producers of a partition."""
    with user_errors(), _cluster(connection) as cluster:
        states = describe_producers(cluster, [(topic, partition)], broker_id)
        rows = [[s.producer_id, s.producer_epoch, s.coordinator_epoch, s.last_sequence,
                 s.last_timestamp_ms, "None" if s.current_transaction_start_offset < 0
                 else s.current_transaction_start_offset] for s in states]
        table = make_table(None, ["ProducerId", "ProducerEpoch", "LatestCoordinatorEpoch",
                                  "LastSequence", "LastTimestamp",
                                  "CurrentTransactionStartOffset"], rows)
        emit(output, {"topic": topic, "partition": partition,
                      "producers": [s.as_json() for s in states]}, table)


@dataclass(frozen=True, slots=True)
class AbortSpec:
    """Kafka's ``AbortTransactionSpec``: which producer's transaction a marker ends."""

    topic: str
    partition: int
    producer_id: int
    producer_epoch: int
    coordinator_epoch: int


def _abort_spec_at(cluster: _Cluster, topic: str, partition: int, start_offset: int
                   ) -> AbortSpec:
    for state in describe_producers(cluster, [(topic, partition)]):
        if state.current_transaction_start_offset == start_offset:
            return AbortSpec(topic, partition, state.producer_id, state.producer_epoch,
                             max(state.coordinator_epoch, 0))
    raise UserError(f"could not find any open transactions starting at offset "
                    f"{start_offset} on partition {topic}-{partition}")


def _abort_spec(cluster: _Cluster, topic: str, partition: int, start_offset: int | None,
                producer_id: int | None, producer_epoch: int | None,
                coordinator_epoch: int | None) -> AbortSpec:
    if start_offset is not None:
        return _abort_spec_at(cluster, topic, partition, start_offset)
    if producer_id is None:
        raise UserError("the transaction to abort must be identified either with "
                        "--start-offset or with --producer-id, --producer-epoch and "
                        "--coordinator-epoch")
    if producer_epoch is None:
        raise UserError("missing required argument --producer-epoch")
    if coordinator_epoch is None:
        raise UserError("missing required argument --coordinator-epoch")
    return AbortSpec(topic, partition, producer_id, producer_epoch, max(coordinator_epoch, 0))


def abort_transaction(cluster: _Cluster, spec: AbortSpec) -> None:
    """Write an abort marker for ``spec`` on its partition's leader (Kafka's
    ``Admin.abortTransaction``)."""
    response = cluster.request(
        cluster.leader(spec.topic, spec.partition), WRITE_TXN_MARKERS_KEY,
        WRITE_TXN_MARKERS_VERSIONS, {"markers": [{
            "producer_id": spec.producer_id, "producer_epoch": spec.producer_epoch,
            "transaction_result": False, "coordinator_epoch": spec.coordinator_epoch,
            "topics": [{"name": spec.topic, "partition_indexes": [spec.partition]}]}]})
    for topic in response.markers[0].topics:
        for answer in topic.partitions:
            _check(answer.error_code, f"failed to abort the transaction of producer "
                   f"{spec.producer_id} on {topic.name}-{answer.partition_index}")


@app.command()
@connection_options
def abort(
    topic: TopicOption,
    partition: PartitionOption,
    start_offset: Annotated[int | None, typer.Option(
        "--start-offset", min=0, help="start offset of the transaction to abort")] = None,
    producer_id: Annotated[int | None, typer.Option("--producer-id", min=0)] = None,
    producer_epoch: Annotated[int | None, typer.Option("--producer-epoch", min=0)] = None,
    coordinator_epoch: Annotated[int | None, typer.Option("--coordinator-epoch")] = None,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Abort a hanging transaction: an abort marker written to the partition."""
    with user_errors(), _cluster(connection) as cluster:
        spec = _abort_spec(cluster, topic, partition, start_offset, producer_id,
                           producer_epoch, coordinator_epoch)
        abort_transaction(cluster, spec)
        report(output, f"aborted the transaction of producer {spec.producer_id} (epoch "
               f"{spec.producer_epoch}) on {topic}-{partition}", {
                   "aborted": {"topic": topic, "partition": partition,
                               "producer_id": spec.producer_id,
                               "producer_epoch": spec.producer_epoch,
                               "coordinator_epoch": spec.coordinator_epoch}})


def _partitions_to_search(cluster: _Cluster, topic: str | None, partition: int | None,
                          broker_id: int | None) -> list[tuple[str, int]]:
    if topic is not None and partition is not None:
        return [(topic, partition)]
    topics = [topic] if topic is not None else sorted(cluster.metadata.topics)
    found = []
    for name in topics:
        for index in topic_partitions(cluster.metadata, name):
            replicas = cluster.metadata.topics[name].partitions[index].replicas
            if broker_id is None or broker_id in replicas:
                found.append((name, index))
    return found


def _hanging(cluster: _Cluster, candidates: list[ProducerState]) -> list[ProducerState]:
    """The candidates their coordinators do not expect to end (Kafka's
    ``filterHangingTransactions``)."""
    listed = list_transactions(cluster, [], sorted({c.producer_id for c in candidates}))
    ids = {row["producer_id"]: row for row in listed}
    hanging = []
    for candidate in candidates:
        row = ids.get(candidate.producer_id)
        if row is None:
            hanging.append(candidate)
            continue
        (described,) = describe_transactions(cluster, row["coordinator_id"],
                                             [row["transactional_id"]])
        if described["error_code"] != TransactionalIdNotFound.code:
            _check(described["error_code"], f"failed to describe transactional id "
                   f"{row['transactional_id']!r}")
        if (candidate.topic, candidate.partition) not in described["topic_partitions"]:
            hanging.append(candidate)
    return hanging


def find_hanging(cluster: _Cluster, partitions: list[tuple[str, int]], broker_id: int | None,
                 max_transaction_timeout_ms: int, now_ms: int) -> list[ProducerState]:
    candidates = [state for state in describe_producers(cluster, partitions, broker_id)
                  if state.current_transaction_start_offset >= 0
                  and now_ms - state.last_timestamp_ms > max_transaction_timeout_ms]
    return _hanging(cluster, candidates) if candidates else []


@app.command("find-hanging")
@connection_options
def find_hanging_command(
    broker_id: Annotated[int | None, typer.Option(
        "--broker-id", help="broker id to search for hanging transactions")] = None,
    topic: Annotated[str | None, typer.Option(
        "--topic", help="topic name to limit the search to (needed by --partition)")] = None,
    partition: Annotated[int | None, typer.Option("--partition", min=0)] = None,
    max_transaction_timeout: Annotated[int, typer.Option(
        "--max-transaction-timeout", min=0,
        help="maximum transaction timeout in minutes to limit the scope of the search")
    ] = DEFAULT_MAX_TRANSACTION_TIMEOUT_MINUTES,
    connection: Connection = DEFAULT_CONNECTION,
    output: OutputOption = OutputFormat.table,
) -> None:
    """Find the open transactions no coordinator will end."""
    now_ms = int(time.time() * 1000)
    with user_errors():
        if topic is None and broker_id is None:
            raise UserError("find-hanging needs --topic or --broker-id to limit the scope of "
                            "the search")
        if partition is not None and topic is None:
            raise UserError("--partition needs --topic")
        with _cluster(connection) as cluster:
            partitions = _partitions_to_search(cluster, topic, partition, broker_id)
            hanging = find_hanging(cluster, partitions, broker_id,
                                   max_transaction_timeout * MS_PER_MINUTE, now_ms)
        rows = [[s.topic, s.partition, s.producer_id, s.producer_epoch, s.coordinator_epoch,
                 s.current_transaction_start_offset, s.last_timestamp_ms,
                 (now_ms - s.last_timestamp_ms) // MS_PER_MINUTE] for s in hanging]
        table = make_table(None, ["Topic", "Partition", "ProducerId", "ProducerEpoch",
                                  "CoordinatorEpoch", "StartOffset", "LastTimestamp",
                                  "Duration(min)"], rows)
        emit(output, {"hanging": [s.as_json() | {
            "duration_minutes": (now_ms - s.last_timestamp_ms) // MS_PER_MINUTE}
            for s in hanging]}, table)
