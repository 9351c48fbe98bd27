"""Requests, responses and effects of the transaction coordinator: frozen dataclasses.

Owns the transaction coordinator's interface to the broker, in the shape of the group
coordinator's (``headrace.coordinator.messages``, whose ``Outcome``, ``Pending``,
``Completed`` and ``AppendResult`` it shares). ``error_code`` fields hold Kafka wire codes
from ``headrace.errors`` (0 = NONE).

Effects the broker carries out, in order, after each call:

* ``AppendToTransactionLog(partition, records, append_id)``: append (key, value) records to
  that ``__transaction_state`` partition; report back ``AppendResult(append_id, error_code)``.
  A state change becomes visible only once its record is appended (Kafka's
  ``TransactionStateManager.appendTransactionToLog``).
* ``WriteTxnMarkers(marker_id, producer_id, producer_epoch, commit, coordinator_epoch,
  partitions)``: write a commit or abort marker to each partition (on this node through
  ``Log.append_transaction_marker``); report back ``TxnMarkersResult(marker_id,
  partition_errors)``. Partitions that answered an error other than UNKNOWN_TOPIC_OR_PARTITION
  (a deleted topic: skipped, as Kafka's marker channel does) are retried after
  ``marker_retry_backoff_ms`` until acknowledged.
* ``Completed(token, response)``: answer a request parked earlier (``Pending(token)``).

Immutable values; thread-safe.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from headrace.coordinator.messages import TopicPartition

NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1


@dataclass(frozen=True, slots=True)
class AppendToTransactionLog:
    partition: int
    records: tuple[tuple[bytes, bytes | None], ...]
    append_id: int


@dataclass(frozen=True, slots=True)
class WriteTxnMarkers:
    marker_id: int
    producer_id: int
    producer_epoch: int
    commit: bool
    coordinator_epoch: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class TxnMarkersResult:
    """Input: how writing ``WriteTxnMarkers(marker_id=...)`` ended, per partition (0: written)."""

    marker_id: int
    partition_errors: Mapping[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class InitProducerIdRequest:
    transactional_id: str
    transaction_timeout_ms: int
    producer_id: int = NO_PRODUCER_ID  # v3+: the producer's current id and epoch, or -1
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class InitProducerIdResponse:
    error_code: int
    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    partitions: tuple[TopicPartition, ...]


@dataclass(frozen=True, slots=True)
class AddPartitionsToTxnResponse:
    partition_errors: Mapping[TopicPartition, int]


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    group_id: str


@dataclass(frozen=True, slots=True)
class AddOffsetsToTxnResponse:
    error_code: int


@dataclass(frozen=True, slots=True)
class EndTxnRequest:
    transactional_id: str
    producer_id: int
    producer_epoch: int
    commit: bool


@dataclass(frozen=True, slots=True)
class EndTxnResponse:
    error_code: int


@dataclass(frozen=True, slots=True)
class ListTransactionsRequest:
    state_filters: tuple[str, ...] = ()
    producer_id_filters: tuple[int, ...] = ()
    duration_filter_ms: int = -1  # v1+: only transactions running longer than this


@dataclass(frozen=True, slots=True)
class ListedTransaction:
    transactional_id: str
    producer_id: int
    transaction_state: str


@dataclass(frozen=True, slots=True)
class ListTransactionsResponse:
    error_code: int
    unknown_state_filters: tuple[str, ...] = ()
    transactions: tuple[ListedTransaction, ...] = ()


@dataclass(frozen=True, slots=True)
class DescribeTransactionsRequest:
    transactional_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class DescribedTransaction:
    """An error answers Kafka's field defaults (zeros) beside its code."""

    transactional_id: str
    error_code: int
    transaction_state: str = ""
    transaction_timeout_ms: int = 0
    transaction_start_time_ms: int = 0  # -1 from an id with no transaction running
    producer_id: int = 0
    producer_epoch: int = 0
    partitions: tuple[TopicPartition, ...] = field(default=())


@dataclass(frozen=True, slots=True)
class DescribeTransactionsResponse:
    transactions: tuple[DescribedTransaction, ...]
