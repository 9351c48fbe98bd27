"""The sink's transactional producer: one Kafka transaction per Spark task, over the wire.

Owns: ``CoordinatorClient`` (requests to a group's or transactional id's coordinator, with
their retries), ``end_transactions`` (EndTxn for transactions other processes wrote: the
sink's driver commits its tasks' transactions) and ``TransactionalProducer``, the ``IdempotentProducer`` (``headrace.spark.wire_produce``)
with a ``transactional.id``, speaking the transaction coordinator's part of KIP-98 over
blocking PLAINTEXT sockets (``headrace.client.broker_connection``):

- FindCoordinator (key_type 1 for the transactional id, 0 for a consumer group), asked again
  after NOT_COORDINATOR or a lost connection.
- InitProducerId with the transactional id and ``transaction.timeout.ms``: the coordinator
  aborts (or finishes) the id's earlier transaction and bumps the epoch, so any earlier
  producer of that id -- a killed or still running attempt of the same task -- is fenced.
- AddPartitionsToTxn (v0-v3) before a partition's first batch; batches carry the
  transactional attribute bit (``ProducerFields.transactional``) and Produce names the id.
- ``committed_offset``: OffsetFetch v7 with ``require_stable``, so an offset of a
  transaction still completing is waited for (UNSTABLE_OFFSET_COMMIT) rather than missed.
- ``send_offsets_to_transaction``: AddOffsetsToTxn, then TxnOffsetCommit to the group's
  coordinator (generation -1, no member: the group is only an offset store here).
- ``prepare_transaction``: every batch acknowledged; the ``TransactionHandle`` (id, producer
  id, epoch) then lets any process end it (``end_transactions``); ``commit_transaction``
  ends it here.

Retriable answers (COORDINATOR_LOAD_IN_PROGRESS, CONCURRENT_TRANSACTIONS, ...) are asked
again after ``retry.backoff.ms``, at most ``COORDINATOR_REQUEST_ATTEMPTS`` times; any other
error (PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, ...) raises its ``headrace.errors`` exception.
Each producer runs one transaction (the sink's task); it is not reused for another.

Not thread-safe: one producer per Spark task.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headrace.client.broker_connection import (
    NO_ERROR,
    BrokerConnection,
    WireClientError,
    connect_any,
)
from headrace.errors import CoordinatorNotAvailable, NotCoordinator, error_for_code
from headrace.spark.wire_produce import (
    INIT_PRODUCER_ID_KEY,
    INIT_PRODUCER_ID_VERSIONS,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    IdempotentProducer,
    ProduceClientConfig,
    TopicPartition,
)
from headrace.storage.clock import Clock

FIND_COORDINATOR_KEY = 10
OFFSET_FETCH_KEY = 9
ADD_PARTITIONS_TO_TXN_KEY = 24
ADD_OFFSETS_TO_TXN_KEY = 25
END_TXN_KEY = 26
TXN_OFFSET_COMMIT_KEY = 28
FIND_COORDINATOR_VERSIONS = (1, 3)  # v4+ batch keys; one key at a time is all we ask
OFFSET_FETCH_VERSIONS = (7, 7)  # require_stable arrived in v7; v8+ batch groups
ADD_PARTITIONS_TO_TXN_VERSIONS = (0, 3)  # v4+ is the brokers' own verification call
ADD_OFFSETS_TO_TXN_VERSIONS = (0, 3)
END_TXN_VERSIONS = (0, 3)
TXN_OFFSET_COMMIT_VERSIONS = (0, 3)
GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
NO_GENERATION_ID = -1
NO_COMMITTED_OFFSET = -1
COORDINATOR_REQUEST_ATTEMPTS = 50


@dataclass(frozen=True, slots=True)
class TransactionHandle:
    """What ending a transaction takes: its id and its producer's id and epoch."""

    transactional_id: str
    producer_id: int
    producer_epoch: int


class CoordinatorClient:
    """Requests to the coordinator of a consumer group or a transactional id, found with
    FindCoordinator and found again after NOT_COORDINATOR or a lost connection."""

    def __init__(self, config: ProduceClientConfig,
                 bootstrap: Callable[[], BrokerConnection],
                 sleep_ms: Callable[[int], None]) -> None:
        self._config = config
        self._bootstrap = bootstrap
        self._sleep_ms = sleep_ms
        self._coordinators: dict[tuple[int, str], BrokerConnection] = {}

    def _coordinator(self, key_type: int, key: str) -> BrokerConnection:
        connection = self._coordinators.get((key_type, key))
        if connection is not None:
            return connection
        bootstrap = self._bootstrap()
        version = bootstrap.version_for(FIND_COORDINATOR_KEY, FIND_COORDINATOR_VERSIONS)
        response = bootstrap.request_values(FIND_COORDINATOR_KEY, version,
                                            {"key": key, "key_type": key_type})
        code = int(response.error_code)
        if code != NO_ERROR:
            raise error_for_code(code, f"FindCoordinator for {key!r}")
        connection = BrokerConnection((response.host, int(response.port)),
                                      self._config.client_id,
                                      request_timeout_ms=self._config.request_timeout_ms)
        self._coordinators[(key_type, key)] = connection
        return connection

    def _forget(self, key_type: int, key: str) -> None:
        connection = self._coordinators.pop((key_type, key), None)
        if connection is not None:
            connection.close()

    def call(self, key_type: int, key: str, api_key: int, versions: tuple[int, int],
             values: dict[str, Any], error_code_of: Callable[[Any], int], what: str) -> Any:
        """Send a request to ``key``'s coordinator until it answers without a retriable
        error; returns the response, raises the first non-retriable error."""
        error: Exception = CoordinatorNotAvailable(f"{what}: no attempt made")
        for _ in range(COORDINATOR_REQUEST_ATTEMPTS):
            try:
                connection = self._coordinator(key_type, key)
                version = connection.version_for(api_key, versions)
                response = connection.request_values(api_key, version, values)
            except (OSError, WireClientError) as lost:
                self._forget(key_type, key)
                error = CoordinatorNotAvailable(f"{what}: {lost}")
            else:
                code = error_code_of(response)
                if code == NO_ERROR:
                    return response
                error = error_for_code(code, f"{what} failed")
                if not error.retriable:
                    raise error
                if isinstance(error, NotCoordinator | CoordinatorNotAvailable):
                    self._forget(key_type, key)
            self._sleep_ms(self._config.retry_backoff_ms)
        raise error

    def end_transaction(self, transaction: TransactionHandle, commit: bool) -> None:
        """EndTxn for ``transaction``: any process may end a transaction it knows the
        producer id and epoch of (the sink's driver ends those its tasks wrote)."""
        self.call(TRANSACTION_KEY_TYPE, transaction.transactional_id, END_TXN_KEY,
                  END_TXN_VERSIONS,
                  {"transactional_id": transaction.transactional_id,
                   "producer_id": transaction.producer_id,
                   "producer_epoch": transaction.producer_epoch, "committed": commit},
                  _top_level_error, f"EndTxn({'commit' if commit else 'abort'}) of "
                                    f"{transaction.transactional_id!r}")

    def close(self) -> None:
        for connection in self._coordinators.values():
            connection.close()
        self._coordinators.clear()


def end_transactions(config: ProduceClientConfig, transactions: list[TransactionHandle],
                     commit: bool) -> None:
    """Commit (or abort) ``transactions``, in order, over one set of connections."""
    bootstrap: BrokerConnection | None = None

    def connect() -> BrokerConnection:
        nonlocal bootstrap
        if bootstrap is None or not bootstrap.is_reusable():
            bootstrap = connect_any(config.bootstrap_servers, config.client_id,
                                    request_timeout_ms=config.request_timeout_ms)
        return bootstrap

    client = CoordinatorClient(config, connect, _sleep_ms)
    try:
        for transaction in transactions:
            client.end_transaction(transaction, commit)
    finally:
        client.close()
        if bootstrap is not None:
            bootstrap.close()


class TransactionalProducer(IdempotentProducer):
    """An ``IdempotentProducer`` whose batches form one transaction of ``transactional_id``."""

    def __init__(self, config: ProduceClientConfig, transactional_id: str,
                 clock: Clock | None = None) -> None:
        self.transactional_id = transactional_id
        self._partitions_in_transaction: set[TopicPartition] = set()
        self._coordinator_client = CoordinatorClient(config, self._usable_bootstrap,
                                                     self._sleep_ms)
        super().__init__(config, clock)

    @property
    def transaction(self) -> TransactionHandle:
        return TransactionHandle(self.transactional_id, self.producer_id, self.producer_epoch)

    def _usable_bootstrap(self) -> BrokerConnection:
        """The metadata connection, made again if the broker closed it."""
        if self._metadata_connection is not None and \
                not self._metadata_connection.is_reusable():
            self._drop_metadata_connection()
        return self._any_connection()

    def _coordinator_call(self, *arguments: Any) -> Any:
        return self._coordinator_client.call(*arguments)

    def _transaction_call(self, api_key: int, versions: tuple[int, int],
                          values: dict[str, Any], error_code_of: Callable[[Any], int],
                          what: str) -> Any:
        return self._coordinator_call(TRANSACTION_KEY_TYPE, self.transactional_id, api_key,
                                      versions, values, error_code_of, what)

    # -- the transaction -------------------------------------------------------------

    def _init_producer_id(self) -> tuple[int, int]:
        """InitProducerId for the transactional id: fences every earlier producer of it."""
        response = self._transaction_call(
            INIT_PRODUCER_ID_KEY, INIT_PRODUCER_ID_VERSIONS,
            {"transactional_id": self.transactional_id,
             "transaction_timeout": self.config.transaction_timeout_ms,
             "producer_id": NO_PRODUCER_ID, "producer_epoch": NO_PRODUCER_EPOCH},
            _top_level_error, f"InitProducerId for {self.transactional_id!r}")
        return int(response.producer_id), int(response.producer_epoch)

    def send(self, topic: str, partition: int, batches: list) -> None:
        if (topic, partition) not in self._partitions_in_transaction:
            self._add_partition(topic, partition)
        super().send(topic, partition, batches)

    def _add_partition(self, topic: str, partition: int) -> None:
        self._transaction_call(
            ADD_PARTITIONS_TO_TXN_KEY, ADD_PARTITIONS_TO_TXN_VERSIONS,
            {"v3_and_below_transactional_id": self.transactional_id,
             "v3_and_below_producer_id": self.producer_id,
             "v3_and_below_producer_epoch": self.producer_epoch,
             "v3_and_below_topics": [{"name": topic, "partitions": [partition]}]},
            _first_partition_error, f"AddPartitionsToTxn {topic}-{partition}")
        self._partitions_in_transaction.add((topic, partition))

    def committed_offset(self, group_id: str, topic: str, partition: int) -> int:
        """The offset ``group_id`` committed for ``topic``-``partition`` (-1: none); an
        offset of a transaction not yet completed is waited for (require_stable)."""
        response = self._coordinator_call(
            GROUP_KEY_TYPE, group_id, OFFSET_FETCH_KEY, OFFSET_FETCH_VERSIONS,
            {"group_id": group_id, "require_stable": True,
             "topics": [{"name": topic, "partition_indexes": [partition]}]},
            _offset_fetch_error, f"OffsetFetch of group {group_id!r}")
        for fetched_topic in response.topics:
            for fetched in fetched_topic.partitions:
                if (fetched_topic.name, fetched.partition_index) == (topic, partition):
                    return int(fetched.committed_offset)
        return NO_COMMITTED_OFFSET

    def send_offsets_to_transaction(self, group_id: str,
                                    offsets: dict[TopicPartition, tuple[int, str]]) -> None:
        """Commit ``{(topic, partition): (offset, metadata)}`` for ``group_id`` with the
        transaction (visible once it commits, dropped if it aborts)."""
        self._transaction_call(
            ADD_OFFSETS_TO_TXN_KEY, ADD_OFFSETS_TO_TXN_VERSIONS,
            {"transactional_id": self.transactional_id, "producer_id": self.producer_id,
             "producer_epoch": self.producer_epoch, "group_id": group_id},
            _top_level_error, f"AddOffsetsToTxn for group {group_id!r}")
        by_topic: dict[str, list[dict]] = {}
        for (topic, partition), (offset, metadata) in sorted(offsets.items()):
            by_topic.setdefault(topic, []).append({
                "partition_index": partition, "committed_offset": offset,
                "committed_leader_epoch": -1, "committed_metadata": metadata})
        self._coordinator_call(
            GROUP_KEY_TYPE, group_id, TXN_OFFSET_COMMIT_KEY, TXN_OFFSET_COMMIT_VERSIONS,
            {"transactional_id": self.transactional_id, "group_id": group_id,
             "producer_id": self.producer_id, "producer_epoch": self.producer_epoch,
             "generation_id": NO_GENERATION_ID, "member_id": "", "group_instance_id": None,
             "topics": [{"name": topic, "partitions": partitions}
                        for topic, partitions in by_topic.items()]},
            _txn_offset_commit_error, f"TxnOffsetCommit for group {group_id!r}")

    def prepare_transaction(self) -> TransactionHandle:
        """Wait for every batch; the transaction stays open for whoever commits it."""
        self.flush()
        return self.transaction

    def commit_transaction(self) -> int:
        """Wait for every batch, then commit; returns the records written."""
        self._coordinator_client.end_transaction(self.prepare_transaction(), commit=True)
        return self.records_acknowledged

    def abort_transaction(self) -> None:
        self._coordinator_client.end_transaction(self.transaction, commit=False)

    def close(self) -> None:
        self._coordinator_client.close()
        super().close()


def _sleep_ms(duration_ms: int) -> None:
    if duration_ms > 0:
        time.sleep(duration_ms / 1000)


def _top_level_error(response: Any) -> int:
    return int(response.error_code)


def _first_partition_error(response: Any) -> int:
    codes = [int(partition.partition_error_code)
             for topic in response.results_by_topic_v3_and_below
             for partition in topic.results_by_partition]
    return next((code for code in codes if code != NO_ERROR), NO_ERROR)


def _offset_fetch_error(response: Any) -> int:
    codes = [int(response.error_code)] + [
        int(partition.error_code) for topic in response.topics for partition in topic.partitions]
    return next((code for code in codes if code != NO_ERROR), NO_ERROR)


def _txn_offset_commit_error(response: Any) -> int:
    codes = [int(partition.error_code) for topic in response.topics
             for partition in topic.partitions]
    return next((code for code in codes if code != NO_ERROR), NO_ERROR)
