"""The transaction coordinator as a socket-free state machine.

Owns every transactional id whose ``__transaction_state`` partition this broker leads: its
producer id and epoch, timeout, state and partitions (Kafka's TransactionMetadata), and the
transitions between the states, which are data: ``VALID_PREVIOUS_STATES`` (an illegal move
raises ``IllegalTransition``, a bug, never a client's mistake). Requests: InitProducerId with
a transactional id (epoch bump; an Ongoing transaction is first aborted with a fenced epoch
and the client told CONCURRENT_TRANSACTIONS), AddPartitionsToTxn, AddOffsetsToTxn, EndTxn,
ListTransactions, DescribeTransactions, with Kafka's TransactionCoordinator error codes
(transaction version 1 semantics: the client's epoch stays the same across transactions).

Every call takes ``now_ms`` and returns an ``Outcome`` (``headrace.coordinator.messages``):
a response or ``Pending(token)``, plus effects (``transaction_messages``). A transition is
durable before it is visible: the metadata records it as pending, the record goes to
``__transaction_state`` (``AppendToTransactionLog``), and only ``AppendResult`` applies it
(or drops it, answering Kafka's mapped error). EndTxn is answered once PrepareCommit or
PrepareAbort is appended; markers (``WriteTxnMarkers``) then go to every partition, retried
until each is acknowledged, and then CompleteCommit / CompleteAbort is appended.

Load and unload by ``__transaction_state`` partition (``begin_loading``, ``load_records``,
``finish_loading(partition, coordinator_epoch, now_ms)``, ``unload``), so leadership changes
slot in: ids of a partition being loaded answer COORDINATOR_LOAD_IN_PROGRESS, of a partition
not led here NOT_COORDINATOR. Transactions loaded in PrepareCommit/PrepareAbort get their
markers sent again. ``tick(now_ms)`` aborts transactions past their timeout (epoch fenced,
as Kafka's abortTimedOutTransactions) every
``transaction.abort.timed.out.transaction.cleanup.interval.ms``, expires ids idle past
``transactional.id.expiration.ms`` (a tombstone), and retries markers.

Not thread-safe: call from one thread (the broker's event loop).
"""

from __future__ import annotations

import enum
import itertools
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace

from headrace import errors
from headrace.coordinator.messages import (
    AppendResult,
    Completed,
    Outcome,
    Pending,
    TopicPartition,
)
from headrace.coordinator.records import (
    OFFSETS_TOPIC_NAME,
    OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT,
    partition_for_group,
)
from headrace.coordinator.transaction_config import TransactionConfig
from headrace.coordinator.transaction_messages import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    AddOffsetsToTxnRequest,
    AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    AppendToTransactionLog,
    DescribedTransaction,
    DescribeTransactionsRequest,
    DescribeTransactionsResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    InitProducerIdResponse,
    ListedTransaction,
    ListTransactionsRequest,
    ListTransactionsResponse,
    TxnMarkersResult,
    WriteTxnMarkers,
)
from headrace.coordinator.transaction_records import (
    TransactionLogValue,
    decode_transaction_log_key,
    decode_transaction_log_value,
    encode_transaction_log_key,
    encode_transaction_log_value,
    partition_for_transactional_id,
)

JAVA_SHORT_MAX = 32767
NO_TIMESTAMP = -1


class TxnState(enum.IntEnum):
    """Kafka's TransactionState, with its stored ids."""

    EMPTY = 0
    ONGOING = 1
    PREPARE_COMMIT = 2
    PREPARE_ABORT = 3
    COMPLETE_COMMIT = 4
    COMPLETE_ABORT = 5
    DEAD = 6
    PREPARE_EPOCH_FENCE = 7

    @property
    def kafka_name(self) -> str:
        return "".join(word.capitalize() for word in self.name.split("_"))


S = TxnState
VALID_PREVIOUS_STATES: dict[TxnState, frozenset[TxnState]] = {
    S.EMPTY: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.ONGOING: frozenset({S.ONGOING, S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_COMMIT: frozenset({S.ONGOING}),
    S.PREPARE_ABORT: frozenset({S.ONGOING, S.PREPARE_EPOCH_FENCE}),
    S.COMPLETE_COMMIT: frozenset({S.PREPARE_COMMIT}),
    S.COMPLETE_ABORT: frozenset({S.PREPARE_ABORT}),
    S.DEAD: frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT}),
    S.PREPARE_EPOCH_FENCE: frozenset({S.ONGOING}),
}
_EXPIRATION_ALLOWED = frozenset({S.EMPTY, S.COMPLETE_COMMIT, S.COMPLETE_ABORT})
_TXN_NAMES = {state.kafka_name: state for state in TxnState}

_UNAVAILABLE_APPEND_CODES = frozenset({
    errors.UnknownTopicOrPartition.code, errors.NotEnoughReplicas.code,
    20,  # NOT_ENOUGH_REPLICAS_AFTER_APPEND
    errors.RequestTimedOut.code})
_NOT_LEADER_APPEND_CODES = frozenset({errors.NotLeaderOrFollower.code,
                                      errors.KafkaStorageError.code})


class IllegalTransition(Exception):
    """A transition outside ``VALID_PREVIOUS_STATES``: a coordinator bug."""


def transaction_append_error_code(append_error_code: int) -> int:
    """What a client sees when a ``__transaction_state`` append failed (Kafka's
    TransactionStateManager.appendTransactionToLog mapping)."""
    if append_error_code in _UNAVAILABLE_APPEND_CODES:
        return errors.CoordinatorNotAvailable.code
    if append_error_code in _NOT_LEADER_APPEND_CODES:
        return errors.NotCoordinator.code
    return errors.UnknownServerError.code


_RETRY_PRODUCE_CODES = frozenset({
    errors.ConcurrentTransactions.code, errors.NetworkException.code,
    errors.CoordinatorLoadInProgress.code, errors.CoordinatorNotAvailable.code,
    errors.NotCoordinator.code})
FIRST_PRODUCE_VERSION_WITH_ABORTABLE = 11


def produce_verification_error_code(verify_code: int, produce_version: int) -> int:
    """What a Produce partition answers for a failed ``verify`` (Kafka's
    AddPartitionsToTxnManager and ReplicaManager translations): PRODUCER_FENCED becomes
    INVALID_PRODUCER_EPOCH, TRANSACTION_ABORTABLE becomes INVALID_TXN_STATE before Produce
    v11, and coordinator errors NOT_ENOUGH_REPLICAS, which older clients retry."""
    if verify_code == errors.ProducerFenced.code:
        return errors.InvalidProducerEpoch.code
    if (verify_code == errors.TransactionAbortable.code
            and produce_version < FIRST_PRODUCE_VERSION_WITH_ABORTABLE):
        return errors.InvalidTxnState.code
    if verify_code in _RETRY_PRODUCE_CODES:
        return errors.NotEnoughReplicas.code
    return verify_code


def is_epoch_exhausted(producer_epoch: int) -> bool:
    return producer_epoch >= JAVA_SHORT_MAX - 1


@dataclass(frozen=True, slots=True)
class Transit:
    """A target state of one transactional id (Kafka's TxnTransitMetadata)."""

    producer_id: int
    last_producer_id: int
    producer_epoch: int
    last_producer_epoch: int
    timeout_ms: int
    state: TxnState
    partitions: frozenset[TopicPartition]
    start_ms: int
    last_update_ms: int

    def log_value(self) -> TransactionLogValue:
        topics: dict[str, list[int]] = {}
        for topic, partition in sorted(self.partitions):
            topics.setdefault(topic, []).append(partition)
        return TransactionLogValue(
            self.producer_id, self.producer_epoch, self.timeout_ms, int(self.state),
            tuple((topic, tuple(ids)) for topic, ids in topics.items()),
            self.last_update_ms, self.start_ms)


@dataclass(slots=True)
class TransactionMetadata:
    transactional_id: str
    current: Transit
    pending: Transit | None = None
    failed_epoch_fence: bool = False

    @property
    def state(self) -> TxnState:
        return self.current.state

    def prepare(self, target: Transit) -> Transit:
        """Record ``target`` as the pending transition; raises IllegalTransition."""
        if self.pending is not None:
            raise IllegalTransition(f"{self.transactional_id}: a transition is pending")
        if self.current.state not in VALID_PREVIOUS_STATES[target.state]:
            raise IllegalTransition(
                f"{self.transactional_id}: {self.current.state.kafka_name} -> "
                f"{target.state.kafka_name}")
        self.pending = target
        return target

    def complete(self, target: Transit) -> None:
        if self.pending != target:
            raise IllegalTransition(f"{self.transactional_id}: completing a transition "
                                    "that is not the pending one")
        self.current, self.pending = target, None


@dataclass(slots=True)
class _Partition:
    coordinator_epoch: int
    loading: dict[bytes, bytes | None] | None = None  # latest value per key while loading
    transactions: dict[str, TransactionMetadata] = field(default_factory=dict)


@dataclass(slots=True)
class _AwaitingAppend:
    metadata: TransactionMetadata
    target: Transit
    coordinator_epoch: int
    on_success: Callable[[int], list]  # now_ms -> effects
    on_failure: Callable[[int], list]  # error code seen by the client -> effects


@dataclass(slots=True)
class _MarkersInFlight:
    metadata: TransactionMetadata
    commit: bool
    coordinator_epoch: int
    remaining: set[TopicPartition]
    retry_at_ms: int | None = None  # set while waiting to resend; None while a send is out


class TransactionCoordinator:
    def __init__(
        self,
        config: TransactionConfig,
        producer_id_factory: Callable[[], int],
        offsets_topic_num_partitions: int = OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT,
    ) -> None:
        """``producer_id_factory``: a new producer id never handed out before (the broker's
        persisted allocator)."""
        self._config = config
        self._new_producer_id = producer_id_factory
        self._offsets_partitions = offsets_topic_num_partitions
        self._partitions: dict[int, _Partition] = {}
        self._tokens = itertools.count(1)
        self._append_ids = itertools.count(1)
        self._marker_ids = itertools.count(1)
        self._awaiting_append: dict[int, _AwaitingAppend] = {}
        self._markers: dict[int, _MarkersInFlight] = {}
        self._next_timeout_check_ms: int | None = None
        self._next_expiration_check_ms: int | None = None
        # Complete* appends that failed, retried from this time on (marker_retry_backoff_ms)
        self._retry_complete: list[tuple[int, TransactionMetadata]] = []

    @property
    def config(self) -> TransactionConfig:
        return self._config

    def partition_for(self, transactional_id: str) -> int:
        return partition_for_transactional_id(
            transactional_id, self._config.transaction_state_log_num_partitions)

    # --- loading and unloading --------------------------------------------------------------

    def begin_loading(self, partition: int, coordinator_epoch: int) -> None:
        self.unload(partition)
        self._partitions[partition] = _Partition(coordinator_epoch, loading={})

    def load_records(self, partition: int, records: Iterable[tuple[bytes, bytes | None]]) -> None:
        loading = self._partitions[partition].loading
        assert loading is not None, f"{partition} is not loading"
        loading.update(records)

    def finish_loading(self, partition: int, now_ms: int) -> list:
        """Build the partition's transactions from the records replayed; raises CorruptMessage
        for one it cannot decode. Returns the effects: markers for transactions that were
        between Prepare* and Complete*."""
        owned = self._partitions[partition]
        latest, owned.loading = owned.loading or {}, None
        effects: list = []
        for key, value in latest.items():
            if value is None:
                continue
            transactional_id = decode_transaction_log_key(key)
            metadata = TransactionMetadata(transactional_id, _transit_from(
                decode_transaction_log_value(value)))
            owned.transactions[transactional_id] = metadata
            if metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                effects.append(self._send_markers(metadata, owned.coordinator_epoch))
        self._schedule_checks(now_ms)
        return effects

    def abandon_loading(self, partition: int) -> None:
        """Loading failed: the partition is not served (NOT_COORDINATOR)."""
        self._partitions.pop(partition, None)

    def unload(self, partition: int) -> None:
        """Forget the partition's transactions (leadership moved away)."""
        owned = self._partitions.pop(partition, None)
        if owned is None:
            return
        for marker_id, markers in list(self._markers.items()):
            if markers.metadata in owned.transactions.values():
                del self._markers[marker_id]

    def owned_partitions(self) -> list[int]:
        return sorted(p for p, owned in self._partitions.items() if owned.loading is None)

    def transactional_ids(self) -> list[str]:
        return sorted(t for owned in self._partitions.values() for t in owned.transactions)

    def _lookup(self, transactional_id: str) -> tuple[_Partition | None, int]:
        """The partition state serving ``transactional_id``, or the error code why none."""
        owned = self._partitions.get(self.partition_for(transactional_id))
        if owned is None:
            return None, errors.NotCoordinator.code
        if owned.loading is not None:
            return None, errors.CoordinatorLoadInProgress.code
        return owned, 0

    # --- requests ---------------------------------------------------------------------------

    def handle(self, request, now_ms: int) -> Outcome:
        if isinstance(request, AppendResult):
            return Outcome(None, tuple(self._append_completed(request, now_ms)))
        if isinstance(request, TxnMarkersResult):
            return Outcome(None, tuple(self._markers_written(request, now_ms)))
        handler = {
            InitProducerIdRequest: self._init_producer_id,
            AddPartitionsToTxnRequest: self._add_partitions,
            AddOffsetsToTxnRequest: self._add_offsets,
            EndTxnRequest: self._end_txn,
            ListTransactionsRequest: self._list_transactions,
            DescribeTransactionsRequest: self._describe_transactions,
        }[type(request)]
        return handler(request, now_ms)

    def _append(self, owned: _Partition, metadata: TransactionMetadata, target: Transit,
                on_success, on_failure) -> AppendToTransactionLog:
        metadata.prepare(target)
        append_id = next(self._append_ids)
        self._awaiting_append[append_id] = _AwaitingAppend(
            metadata, target, owned.coordinator_epoch, on_success, on_failure)
        record = (encode_transaction_log_key(metadata.transactional_id),
                  encode_transaction_log_value(target.log_value()))
        return AppendToTransactionLog(
            self.partition_for(metadata.transactional_id), (record,), append_id)

    def _parked(self, respond_ok, respond_error):
        """A token and the two continuations answering it."""
        token = next(self._tokens)
        return (token,
                lambda now_ms: [Completed(token, respond_ok(now_ms))],
                lambda code: [Completed(token, respond_error(code))])

    def _append_completed(self, result: AppendResult, now_ms: int) -> list:
        awaiting = self._awaiting_append.pop(result.append_id, None)
        if awaiting is None:
            return []
        metadata = awaiting.metadata
        owned = self._partitions.get(self.partition_for(metadata.transactional_id))
        still_owner = (owned is not None and owned.coordinator_epoch == awaiting.coordinator_epoch
                       and owned.transactions.get(metadata.transactional_id) is metadata)
        if result.error_code == 0 and still_owner:
            metadata.complete(awaiting.target)
            if metadata.state == S.DEAD:
                del owned.transactions[metadata.transactional_id]
            return awaiting.on_success(now_ms)
        if metadata.pending == awaiting.target:
            metadata.pending = None
        if not still_owner:
            return awaiting.on_failure(errors.NotCoordinator.code)
        return awaiting.on_failure(transaction_append_error_code(result.error_code))

    # --- InitProducerId ---------------------------------------------------------------------

    def _init_producer_id(self, request: InitProducerIdRequest, now_ms: int) -> Outcome:
        def error(code: int) -> Outcome:
            return Outcome(InitProducerIdResponse(code))

        if not request.transactional_id:
            return error(errors.InvalidRequest.code)
        timeout_ms = request.transaction_timeout_ms
        if not 0 < timeout_ms <= self._config.transaction_max_timeout_ms:
            return error(errors.InvalidTransactionTimeout.code)
        owned, code = self._lookup(request.transactional_id)
        if owned is None:
            return error(code)
        metadata = owned.transactions.get(request.transactional_id)
        if metadata is None:
            metadata = TransactionMetadata(request.transactional_id, Transit(
                self._new_producer_id(), NO_PRODUCER_ID, NO_PRODUCER_EPOCH, NO_PRODUCER_EPOCH,
                timeout_ms, S.EMPTY, frozenset(), NO_TIMESTAMP, now_ms))
            owned.transactions[request.transactional_id] = metadata
        current = metadata.current
        expected = request.producer_id != NO_PRODUCER_ID
        if metadata.pending is not None:
            return error(errors.ConcurrentTransactions.code)
        if expected and not (
                current.producer_epoch == NO_PRODUCER_EPOCH
                or request.producer_id == current.producer_id
                or (request.producer_id == current.last_producer_id
                    and is_epoch_exhausted(request.producer_epoch))):
            return error(errors.ProducerFenced.code)
        if current.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return error(errors.ConcurrentTransactions.code)
        if current.state == S.ONGOING:
            token = next(self._tokens)
            effects = self._fence_and_abort(owned, metadata, now_ms, on_done=lambda code: [
                Completed(token, InitProducerIdResponse(
                    code or errors.ConcurrentTransactions.code))])
            return Outcome(Pending(token), tuple(effects))
        target = self._next_epoch(metadata, request, timeout_ms, now_ms)
        if isinstance(target, int):
            return error(target)
        token, on_success, on_failure = self._parked(
            lambda _now: InitProducerIdResponse(0, target.producer_id, target.producer_epoch),
            InitProducerIdResponse)
        effect = self._append(owned, metadata, target, on_success, on_failure)
        return Outcome(Pending(token), (effect,))

    def _next_epoch(self, metadata: TransactionMetadata, request: InitProducerIdRequest,
                    timeout_ms: int, now_ms: int) -> Transit | int:
        """The Empty transit of a new epoch, or the error code (Kafka's
        prepareIncrementProducerEpoch / prepareProducerIdRotation)."""
        current = metadata.current
        expected = request.producer_id != NO_PRODUCER_ID
        base = replace(current, state=S.EMPTY, timeout_ms=timeout_ms, partitions=frozenset(),
                       start_ms=NO_TIMESTAMP, last_update_ms=now_ms)
        if is_epoch_exhausted(current.producer_epoch) and (
                not expected or request.producer_epoch == current.producer_epoch):
            return replace(base, producer_id=self._new_producer_id(),
                           last_producer_id=current.producer_id, producer_epoch=0,
                           last_producer_epoch=NO_PRODUCER_EPOCH if not expected
                           else current.producer_epoch)
        bumped = current.producer_epoch + 1
        if not expected:
            return replace(base, producer_epoch=bumped, last_producer_epoch=NO_PRODUCER_EPOCH)
        if current.producer_epoch in (NO_PRODUCER_EPOCH, request.producer_epoch):
            return replace(base, producer_epoch=bumped, last_producer_epoch=current.producer_epoch)
        if request.producer_epoch == current.last_producer_epoch:  # a retry of a bump
            return base
        return errors.ProducerFenced.code

    # --- AddPartitionsToTxn / AddOffsetsToTxn ------------------------------------------------

    def _check_producer(self, request) -> tuple[_Partition | None, TransactionMetadata | None, int]:
        """The id's partition and metadata when ``request``'s producer may add to its
        transaction, else the error code (Kafka's handleAddPartitionsToTransaction checks)."""
        if not request.transactional_id:
            return None, None, errors.InvalidRequest.code
        owned, code = self._lookup(request.transactional_id)
        if owned is None:
            return None, None, code
        metadata = owned.transactions.get(request.transactional_id)
        if metadata is None or metadata.current.producer_id != request.producer_id:
            return None, None, errors.InvalidProducerIdMapping.code
        if metadata.current.producer_epoch != request.producer_epoch:
            return None, None, errors.ProducerFenced.code
        if metadata.pending is not None or metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
            return None, None, errors.ConcurrentTransactions.code
        return owned, metadata, 0

    def _add(self, request, partitions: frozenset[TopicPartition], now_ms: int, respond):
        owned, metadata, code = self._check_producer(request)
        if metadata is None:
            return Outcome(respond(code))
        current = metadata.current
        if current.state == S.ONGOING and partitions <= current.partitions:
            return Outcome(respond(0))
        start_ms = current.start_ms if current.state == S.ONGOING else now_ms
        target = replace(current, state=S.ONGOING, partitions=current.partitions | partitions,
                         start_ms=start_ms, last_update_ms=now_ms)
        token, on_success, on_failure = self._parked(lambda _now: respond(0), respond)
        return Outcome(Pending(token), (self._append(owned, metadata, target, on_success,
                                                     on_failure),))

    def _add_partitions(self, request: AddPartitionsToTxnRequest, now_ms: int) -> Outcome:
        partitions = frozenset(request.partitions)

        def respond(code: int) -> AddPartitionsToTxnResponse:
            return AddPartitionsToTxnResponse({tp: code for tp in partitions})

        return self._add(request, partitions, now_ms, respond)

    def _add_offsets(self, request: AddOffsetsToTxnRequest, now_ms: int) -> Outcome:
        offsets_partition = (OFFSETS_TOPIC_NAME,
                             partition_for_group(request.group_id, self._offsets_partitions))
        return self._add(request, frozenset({offsets_partition}), now_ms,
                         AddOffsetsToTxnResponse)

    # --- EndTxn and markers -----------------------------------------------------------------

    def _end_txn(self, request: EndTxnRequest, now_ms: int) -> Outcome:
        def error(code: int) -> Outcome:
            return Outcome(EndTxnResponse(code))

        if not request.transactional_id:
            return error(errors.InvalidRequest.code)
        owned, code = self._lookup(request.transactional_id)
        if owned is None:
            return error(code)
        metadata = owned.transactions.get(request.transactional_id)
        if metadata is None or metadata.current.producer_id != request.producer_id:
            return error(errors.InvalidProducerIdMapping.code)
        if request.producer_epoch != metadata.current.producer_epoch:
            return error(errors.ProducerFenced.code)
        if metadata.pending is not None:
            return error(errors.ConcurrentTransactions.code)
        state, commit = metadata.state, request.commit
        if state == S.ONGOING:
            token, on_success, on_failure = self._parked(
                lambda _now: EndTxnResponse(0), EndTxnResponse)
            effects = self._prepare_end(owned, metadata, commit, now_ms, on_success, on_failure)
            return Outcome(Pending(token), tuple(effects))
        if (state, commit) in ((S.COMPLETE_COMMIT, True), (S.COMPLETE_ABORT, False)):
            return error(0)  # a retry of an EndTxn that completed
        if (state, commit) in ((S.PREPARE_COMMIT, True), (S.PREPARE_ABORT, False)):
            return error(errors.ConcurrentTransactions.code)
        return error(errors.InvalidTxnState.code)

    def _prepare_end(self, owned: _Partition, metadata: TransactionMetadata, commit: bool,
                     now_ms: int, on_success, on_failure, producer_epoch: int | None = None):
        """Append PrepareCommit/PrepareAbort; once appended, answer and send the markers."""
        current = metadata.current
        target = replace(current, state=S.PREPARE_COMMIT if commit else S.PREPARE_ABORT,
                         last_update_ms=now_ms)
        if producer_epoch is not None:  # an epoch fence: the aborting epoch is bumped
            target = replace(target, producer_epoch=producer_epoch,
                             last_producer_epoch=NO_PRODUCER_EPOCH)

        def appended(now: int) -> list:
            return [*on_success(now), self._send_markers(metadata, owned.coordinator_epoch)]

        return [self._append(owned, metadata, target, appended, on_failure)]

    def _fence_and_abort(self, owned: _Partition, metadata: TransactionMetadata, now_ms: int,
                         on_done: Callable[[int], list]) -> list:
        """Abort an Ongoing transaction with a bumped epoch, fencing its producer (Kafka's
        prepareFenceProducerEpoch + endTransaction(ABORT, isFromClient=false))."""
        epoch = metadata.current.producer_epoch
        if epoch >= JAVA_SHORT_MAX:
            raise IllegalTransition(f"{metadata.transactional_id}: epoch {epoch} cannot be fenced")
        bumped = epoch if metadata.failed_epoch_fence else epoch + 1

        def failed(code: int) -> list:
            metadata.failed_epoch_fence = True
            return on_done(code)

        def succeeded(_now: int) -> list:
            metadata.failed_epoch_fence = False
            return on_done(0)

        return self._prepare_end(owned, metadata, False, now_ms, succeeded, failed,
                                 producer_epoch=bumped)

    def _send_markers(self, metadata: TransactionMetadata, coordinator_epoch: int):
        current = metadata.current
        marker_id = next(self._marker_ids)
        partitions = set(current.partitions)
        self._markers[marker_id] = _MarkersInFlight(
            metadata, current.state == S.PREPARE_COMMIT, coordinator_epoch, partitions)
        return self._markers_effect(marker_id)

    def _markers_effect(self, marker_id: int) -> WriteTxnMarkers:
        markers = self._markers[marker_id]
        markers.retry_at_ms = None
        current = markers.metadata.current
        return WriteTxnMarkers(marker_id, current.producer_id, current.producer_epoch,
                               markers.commit, markers.coordinator_epoch,
                               tuple(sorted(markers.remaining)))

    def _markers_written(self, result: TxnMarkersResult, now_ms: int) -> list:
        markers = self._markers.get(result.marker_id)
        if markers is None:
            return []
        for tp, code in result.partition_errors.items():
            if code in (0, errors.UnknownTopicOrPartition.code):
                markers.remaining.discard(tp)
        if markers.remaining:
            markers.retry_at_ms = now_ms + self._config.marker_retry_backoff_ms
            return []
        del self._markers[result.marker_id]
        return self._complete(markers.metadata, now_ms)

    def _complete(self, metadata: TransactionMetadata, now_ms: int) -> list:
        """Append CompleteCommit/CompleteAbort; a failed append is retried by ``tick`` after
        ``marker_retry_backoff_ms``."""
        owned = self._partitions.get(self.partition_for(metadata.transactional_id))
        if owned is None or owned.transactions.get(metadata.transactional_id) is not metadata:
            return []
        current = metadata.current
        state = S.COMPLETE_COMMIT if current.state == S.PREPARE_COMMIT else S.COMPLETE_ABORT
        target = replace(current, state=state, partitions=frozenset(), last_update_ms=now_ms)

        def retry(_code: int) -> list:
            retry_at_ms = now_ms + self._config.marker_retry_backoff_ms
            self._retry_complete.append((retry_at_ms, metadata))
            return []

        return [self._append(owned, metadata, target, lambda _now: [], retry)]

    # --- KIP-890 part 1: verifying a transactional produce ---------------------------------

    def verify(self, transactional_id: str, producer_id: int, producer_epoch: int,
               partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Whether each partition is in the producer's ongoing transaction (Kafka's
        handleVerifyPartitionsInTransaction): 0, or TRANSACTION_ABORTABLE for a partition
        not added, or one error for all (INVALID_REQUEST, NOT_COORDINATOR,
        COORDINATOR_LOAD_IN_PROGRESS, INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED,
        CONCURRENT_TRANSACTIONS while the transaction ends). A pending transition is not
        waited for: partitions count once their addition is stored. The produce path maps
        the codes with ``produce_verification_error_code``."""
        partitions = list(partitions)
        code = 0
        if not transactional_id:
            code = errors.InvalidRequest.code
        else:
            owned, code = self._lookup(transactional_id)
            metadata = owned.transactions.get(transactional_id) if owned is not None else None
            if owned is None:
                pass
            elif metadata is None or metadata.current.producer_id != producer_id:
                code = errors.InvalidProducerIdMapping.code
            elif metadata.current.producer_epoch != producer_epoch:
                code = errors.ProducerFenced.code
            elif metadata.state in (S.PREPARE_COMMIT, S.PREPARE_ABORT):
                code = errors.ConcurrentTransactions.code
            else:
                added = metadata.current.partitions if metadata.state == S.ONGOING else ()
                return {tp: 0 if tp in added else errors.TransactionAbortable.code
                        for tp in partitions}
        return {tp: code for tp in partitions}

    # --- ListTransactions / DescribeTransactions --------------------------------------------

    def _list_transactions(self, request: ListTransactionsRequest, now_ms: int) -> Outcome:
        if any(owned.loading is not None for owned in self._partitions.values()):
            return Outcome(ListTransactionsResponse(errors.CoordinatorLoadInProgress.code))
        unknown = tuple(name for name in request.state_filters if name not in _TXN_NAMES)
        states = {_TXN_NAMES[name] for name in request.state_filters if name in _TXN_NAMES}
        producer_ids = set(request.producer_id_filters)
        listed = []
        for owned in self._partitions.values():
            for metadata in owned.transactions.values():
                current = metadata.current
                if states and current.state not in states:
                    continue
                if producer_ids and current.producer_id not in producer_ids:
                    continue
                if request.duration_filter_ms >= 0 and (
                        now_ms - current.start_ms <= request.duration_filter_ms):
                    continue
                listed.append(ListedTransaction(metadata.transactional_id, current.producer_id,
                                                current.state.kafka_name))
        return Outcome(ListTransactionsResponse(0, unknown, tuple(listed)))

    def _describe_transactions(self, request: DescribeTransactionsRequest, now_ms: int) -> Outcome:
        return Outcome(DescribeTransactionsResponse(tuple(
            self._describe(transactional_id) for transactional_id in request.transactional_ids)))

    def _describe(self, transactional_id: str) -> DescribedTransaction:
        if not transactional_id:
            return DescribedTransaction(transactional_id, errors.InvalidRequest.code)
        owned, code = self._lookup(transactional_id)
        if owned is None:
            return DescribedTransaction(transactional_id, code)
        metadata = owned.transactions.get(transactional_id)
        if metadata is None or metadata.state == S.DEAD:
            return DescribedTransaction(transactional_id, errors.TransactionalIdNotFound.code)
        current = metadata.current
        return DescribedTransaction(
            transactional_id, 0, current.state.kafka_name, current.timeout_ms, current.start_ms,
            current.producer_id, current.producer_epoch, tuple(sorted(current.partitions)))

    # --- timers -----------------------------------------------------------------------------

    def _schedule_checks(self, now_ms: int) -> None:
        if self._next_timeout_check_ms is None:
            self._next_timeout_check_ms = (
                now_ms + self._config.transaction_abort_timed_out_transaction_cleanup_interval_ms)
        if self._next_expiration_check_ms is None:
            self._next_expiration_check_ms = (
                now_ms + self._config.transaction_remove_expired_transaction_cleanup_interval_ms)

    def next_deadline_ms(self) -> int | None:
        deadlines = [d for d in (self._next_timeout_check_ms, self._next_expiration_check_ms)
                     if d is not None]
        deadlines += [m.retry_at_ms for m in self._markers.values() if m.retry_at_ms is not None]
        deadlines += [retry_at_ms for retry_at_ms, _ in self._retry_complete]
        return min(deadlines, default=None)

    def tick(self, now_ms: int) -> list:
        effects: list = []
        due = [metadata for retry_at_ms, metadata in self._retry_complete if retry_at_ms <= now_ms]
        self._retry_complete = [(at, m) for at, m in self._retry_complete if at > now_ms]
        for metadata in due:
            effects += self._complete(metadata, now_ms)
        for marker_id, markers in list(self._markers.items()):
            if markers.retry_at_ms is not None and markers.retry_at_ms <= now_ms:
                effects.append(self._markers_effect(marker_id))
        if self._next_timeout_check_ms is not None and self._next_timeout_check_ms <= now_ms:
            self._next_timeout_check_ms = None
            effects += self._abort_timed_out(now_ms)
        if self._next_expiration_check_ms is not None and self._next_expiration_check_ms <= now_ms:
            self._next_expiration_check_ms = None
            effects += self._expire_transactional_ids(now_ms)
        if self._partitions:
            self._schedule_checks(now_ms)
        return effects

    def _abort_timed_out(self, now_ms: int) -> list:
        effects: list = []
        for owned in self._partitions.values():
            for metadata in list(owned.transactions.values()):
                current = metadata.current
                if (metadata.state == S.ONGOING and metadata.pending is None
                        and current.start_ms + current.timeout_ms < now_ms):
                    effects += self._fence_and_abort(owned, metadata, now_ms,
                                                     on_done=lambda _code: [])
        return effects

    def _expire_transactional_ids(self, now_ms: int) -> list:
        effects: list = []
        expiration_ms = self._config.transactional_id_expiration_ms
        for partition, owned in self._partitions.items():
            for metadata in list(owned.transactions.values()):
                if (metadata.state in _EXPIRATION_ALLOWED and metadata.pending is None
                        and metadata.current.last_update_ms <= now_ms - expiration_ms):
                    target = replace(metadata.current, state=S.DEAD, last_update_ms=now_ms)
                    metadata.prepare(target)
                    append_id = next(self._append_ids)
                    self._awaiting_append[append_id] = _AwaitingAppend(
                        metadata, target, owned.coordinator_epoch, lambda _now: [],
                        lambda _code: [])
                    tombstone = (encode_transaction_log_key(metadata.transactional_id), None)
                    effects.append(AppendToTransactionLog(partition, (tombstone,), append_id))
        return effects


def _transit_from(value: TransactionLogValue) -> Transit:
    partitions = frozenset((topic, p) for topic, ids in value.transaction_partitions for p in ids)
    return Transit(
        value.producer_id, NO_PRODUCER_ID, value.producer_epoch, NO_PRODUCER_EPOCH,
        value.transaction_timeout_ms, TxnState(value.transaction_status), partitions,
        value.transaction_start_timestamp_ms, value.transaction_last_update_timestamp_ms)
