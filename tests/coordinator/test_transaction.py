"""The transaction coordinator's state machine: transitions, fencing, errors, recovery."""

from __future__ import annotations

import pytest

from headrace import errors
from headrace.coordinator.records import OFFSETS_TOPIC_NAME, partition_for_group
from headrace.coordinator.transaction import (
    VALID_PREVIOUS_STATES,
    IllegalTransition,
    TransactionMetadata,
    Transit,
    TxnState,
    produce_verification_error_code,
)
from headrace.coordinator.transaction_config import TransactionConfig
from headrace.coordinator.transaction_messages import (
    AddOffsetsToTxnRequest,
    AddPartitionsToTxnRequest,
    DescribeTransactionsRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ListTransactionsRequest,
)
from headrace.coordinator.transaction_records import (
    decode_transaction_log_key,
    decode_transaction_log_value,
)
from tests.coordinator.transaction_driver import FIRST_PRODUCER_ID, TxnDriver

TXN = "payments-txn"
TIMEOUT_MS = 60_000
T0 = ("orders", 0)
T1 = ("orders", 1)


def init(driver: TxnDriver, transactional_id: str = TXN, timeout_ms: int = TIMEOUT_MS, **kw):
    return driver.call(InitProducerIdRequest(transactional_id, timeout_ms, **kw))


def add(driver: TxnDriver, pid: int, epoch: int, *partitions, transactional_id: str = TXN):
    return driver.call(AddPartitionsToTxnRequest(transactional_id, pid, epoch, partitions))


def end(driver: TxnDriver, pid: int, epoch: int, commit: bool):
    return driver.call(EndTxnRequest(TXN, pid, epoch, commit)).error_code


def stored_states(driver: TxnDriver, transactional_id: str = TXN) -> list[str]:
    partition = driver.coordinator.partition_for(transactional_id)
    return [TxnState(decode_transaction_log_value(value).transaction_status).kafka_name
            for key, value in driver.log.get(partition, [])
            if value is not None and decode_transaction_log_key(key) == transactional_id]


def describe(driver: TxnDriver, transactional_id: str = TXN):
    return driver.call(DescribeTransactionsRequest((transactional_id,))).transactions[0]


def test_commit_goes_through_every_state_and_marks_every_partition():
    driver = TxnDriver()
    first = init(driver)
    assert (first.error_code, first.producer_id, first.producer_epoch) == (
        0, FIRST_PRODUCER_ID, 0)
    assert add(driver, first.producer_id, 0, T0, T1).partition_errors == {T0: 0, T1: 0}
    assert end(driver, first.producer_id, 0, commit=True) == 0
    assert stored_states(driver) == ["Empty", "Ongoing", "PrepareCommit", "CompleteCommit"]
    assert sorted(driver.markers) == [(T0, FIRST_PRODUCER_ID, 0, True),
                                      (T1, FIRST_PRODUCER_ID, 0, True)]
    assert describe(driver).transaction_state == "CompleteCommit"
    assert describe(driver).partitions == ()


def test_abort_writes_abort_markers():
    driver = TxnDriver()
    pid = init(driver).producer_id
    add(driver, pid, 0, T0)
    assert end(driver, pid, 0, commit=False) == 0
    assert stored_states(driver)[-2:] == ["PrepareAbort", "CompleteAbort"]
    assert driver.markers == [(T0, pid, 0, False)]


def test_init_on_an_ongoing_transaction_aborts_it_with_a_fenced_epoch():
    driver = TxnDriver()
    pid = init(driver).producer_id
    add(driver, pid, 0, T0)
    retry = init(driver)
    assert retry.error_code == errors.ConcurrentTransactions.code
    # the aborting markers carry the bumped epoch, fencing the old producer on the partition
    assert driver.markers == [(T0, pid, 1, False)]
    assert stored_states(driver)[-2:] == ["PrepareAbort", "CompleteAbort"]
    again = init(driver)
    assert (again.error_code, again.producer_id, again.producer_epoch) == (0, pid, 2)
    # the zombie with epoch 0 is fenced everywhere
    assert add(driver, pid, 0, T1).partition_errors == {T1: errors.ProducerFenced.code}
    assert end(driver, pid, 0, commit=True) == errors.ProducerFenced.code


def test_init_waits_while_markers_are_pending():
    driver = TxnDriver()
    pid = init(driver).producer_id
    add(driver, pid, 0, T0, T1)
    driver.failing_marker_partitions = {T1}
    assert end(driver, pid, 0, commit=True) == 0  # answered once PrepareCommit is stored
    assert init(driver).error_code == errors.ConcurrentTransactions.code
    assert add(driver, pid, 0, T0).partition_errors == {T0: errors.ConcurrentTransactions.code}
    driver.advance(1_000)  # still failing: retried, never completed
    assert describe(driver).transaction_state == "PrepareCommit"
    driver.failing_marker_partitions = set()
    driver.advance(1_000)
    assert describe(driver).transaction_state == "CompleteCommit"
    assert [m for m in driver.markers if m[0] == T1] == [(T1, pid, 0, True)]
    assert init(driver).producer_epoch == 1


def test_transaction_timeout_above_the_maximum_is_refused():
    driver = TxnDriver(TransactionConfig(transaction_max_timeout_ms=10_000))
    assert init(driver, timeout_ms=10_001).error_code == errors.InvalidTransactionTimeout.code
    assert init(driver, timeout_ms=0).error_code == errors.InvalidTransactionTimeout.code
    assert init(driver, timeout_ms=10_000).error_code == 0


@pytest.mark.parametrize("request_", [
    InitProducerIdRequest("", TIMEOUT_MS),
    EndTxnRequest("", 1, 0, True),
])
def test_empty_transactional_id_is_invalid_request(request_):
    assert TxnDriver().call(request_).error_code == errors.InvalidRequest.code


def test_misuse_gets_kafkas_errors():
    driver = TxnDriver()
    pid = init(driver).producer_id
    assert add(driver, pid + 1, 0, T0).partition_errors == {
        T0: errors.InvalidProducerIdMapping.code}
    assert add(driver, pid, 0, T0, transactional_id="unknown").partition_errors == {
        T0: errors.InvalidProducerIdMapping.code}
    assert end(driver, pid, 0, commit=True) == errors.InvalidTxnState.code  # Empty
    add(driver, pid, 0, T0)
    assert end(driver, pid, 0, commit=False) == 0
    assert end(driver, pid, 0, commit=False) == 0  # a retried abort: NONE
    assert end(driver, pid, 0, commit=True) == errors.InvalidTxnState.code
    assert end(driver, pid, 1, commit=False) == errors.ProducerFenced.code


def test_init_with_a_stale_producer_id_is_fenced():
    driver = TxnDriver()
    pid = init(driver).producer_id
    assert init(driver, producer_id=pid + 7, producer_epoch=0).error_code == (
        errors.ProducerFenced.code)
    bumped = init(driver, producer_id=pid, producer_epoch=0)
    assert (bumped.error_code, bumped.producer_epoch) == (0, 1)
    # a retry of that bump (the response was lost) gets the same epoch again
    assert init(driver, producer_id=pid, producer_epoch=0).producer_epoch == 1
    assert init(driver, producer_id=pid, producer_epoch=5).error_code == (
        errors.ProducerFenced.code)


def test_add_offsets_adds_the_groups_offsets_partition():
    driver = TxnDriver()
    pid = init(driver).producer_id
    response = driver.call(AddOffsetsToTxnRequest(TXN, pid, 0, "group-a"))
    assert response.error_code == 0
    assert describe(driver).partitions == ((OFFSETS_TOPIC_NAME, partition_for_group("group-a")),)


def test_failed_append_leaves_the_state_unchanged_and_maps_the_error():
    driver = TxnDriver()
    pid = init(driver).producer_id
    driver.append_error_code = errors.NotLeaderOrFollower.code
    assert add(driver, pid, 0, T0).partition_errors == {T0: errors.NotCoordinator.code}
    driver.append_error_code = errors.RequestTimedOut.code
    assert add(driver, pid, 0, T0).partition_errors == {
        T0: errors.CoordinatorNotAvailable.code}
    assert describe(driver).transaction_state == "Empty"
    driver.append_error_code = 0
    assert add(driver, pid, 0, T0).partition_errors == {T0: 0}


def test_hanging_transaction_is_aborted_after_its_timeout():
    driver = TxnDriver()
    pid = init(driver, timeout_ms=5_000).producer_id
    add(driver, pid, 0, T0)
    interval_ms = driver.coordinator.config.transaction_abort_timed_out_transaction_cleanup_interval_ms
    driver.advance(interval_ms)
    assert describe(driver).transaction_state == "CompleteAbort"
    assert driver.markers == [(T0, pid, 1, False)]
    assert end(driver, pid, 0, commit=True) == errors.ProducerFenced.code


def test_transaction_within_its_timeout_is_not_aborted():
    driver = TxnDriver()
    pid = init(driver, timeout_ms=TIMEOUT_MS).producer_id
    add(driver, pid, 0, T0)
    driver.advance(TIMEOUT_MS - 1)
    assert describe(driver).transaction_state == "Ongoing"


def test_idle_transactional_id_expires_with_a_tombstone():
    config = TransactionConfig(transactional_id_expiration_ms=1_000,
                               transaction_remove_expired_transaction_cleanup_interval_ms=500)
    driver = TxnDriver(config)
    init(driver)
    driver.advance(2_000)
    assert describe(driver).error_code == errors.TransactionalIdNotFound.code
    partition = driver.coordinator.partition_for(TXN)
    assert driver.log[partition][-1][1] is None


def test_reload_restores_state_and_resends_markers_of_a_prepared_transaction():
    driver = TxnDriver()
    pid = init(driver).producer_id
    add(driver, pid, 0, T0, T1)
    driver.failing_marker_partitions = {T0, T1}
    assert end(driver, pid, 0, commit=True) == 0
    assert driver.markers == []
    restarted = TxnDriver(log=driver.log, coordinator_epoch=1)
    assert sorted(restarted.markers) == [(T0, pid, 0, True), (T1, pid, 0, True)]
    assert describe(restarted).transaction_state == "CompleteCommit"
    assert init(restarted).producer_epoch == 1


def test_reload_keeps_an_ongoing_transaction():
    driver = TxnDriver()
    pid = init(driver).producer_id
    add(driver, pid, 0, T0)
    restarted = TxnDriver(log=driver.log)
    described = describe(restarted)
    assert (described.transaction_state, described.partitions) == ("Ongoing", (T0,))
    assert end(restarted, pid, 0, commit=False) == 0
    assert restarted.markers == [(T0, pid, 0, False)]


def test_loading_and_unowned_partitions_answer_coordinator_errors():
    driver = TxnDriver()
    partition = driver.coordinator.partition_for(TXN)
    driver.coordinator.begin_loading(partition, 1)
    assert init(driver).error_code == errors.CoordinatorLoadInProgress.code
    assert driver.call(ListTransactionsRequest()).error_code == (
        errors.CoordinatorLoadInProgress.code)
    driver.coordinator.unload(partition)
    assert init(driver).error_code == errors.NotCoordinator.code
    assert describe(driver).error_code == errors.NotCoordinator.code


def test_list_transactions_filters():
    driver = TxnDriver()
    a = init(driver, "a").producer_id
    b = init(driver, "b").producer_id
    add(driver, a, 0, T0, transactional_id="a")
    listed = driver.call(ListTransactionsRequest(state_filters=("Ongoing", "Bogus")))
    assert listed.unknown_state_filters == ("Bogus",)
    assert [(t.transactional_id, t.producer_id, t.transaction_state)
            for t in listed.transactions] == [("a", a, "Ongoing")]
    by_pid = driver.call(ListTransactionsRequest(producer_id_filters=(b,))).transactions
    assert [t.transactional_id for t in by_pid] == ["b"]


def test_epoch_exhaustion_rotates_the_producer_id():
    driver = TxnDriver()
    pid = init(driver).producer_id
    metadata = driver.coordinator._partitions[driver.coordinator.partition_for(TXN)] \
        .transactions[TXN]
    metadata.current = Transit(pid, -1, 32766, -1, TIMEOUT_MS, TxnState.EMPTY, frozenset(), -1, 0)
    rotated = init(driver)
    assert (rotated.producer_id, rotated.producer_epoch) == (pid + 1, 0)


def test_transitions_outside_the_table_raise():
    current = Transit(1, -1, 0, -1, TIMEOUT_MS, TxnState.EMPTY, frozenset(), -1, 0)
    metadata = TransactionMetadata(TXN, current)
    assert TxnState.EMPTY not in VALID_PREVIOUS_STATES[TxnState.PREPARE_COMMIT]
    with pytest.raises(IllegalTransition):
        metadata.prepare(Transit(1, -1, 0, -1, TIMEOUT_MS, TxnState.PREPARE_COMMIT,
                                 frozenset(), -1, 0))


def test_verify_accepts_only_partitions_added_to_the_ongoing_transaction():
    driver = TxnDriver()
    pid = init(driver).producer_id
    verify = driver.coordinator.verify
    assert verify(TXN, pid, 0, [T0]) == {T0: errors.TransactionAbortable.code}  # Empty
    add(driver, pid, 0, T0)
    assert verify(TXN, pid, 0, [T0, T1]) == {T0: 0, T1: errors.TransactionAbortable.code}
    assert verify(TXN, pid, 1, [T0]) == {T0: errors.ProducerFenced.code}
    assert verify(TXN, pid + 1, 0, [T0]) == {T0: errors.InvalidProducerIdMapping.code}
    assert verify("", pid, 0, [T0]) == {T0: errors.InvalidRequest.code}
    driver.failing_marker_partitions = {T0}
    end(driver, pid, 0, commit=True)
    assert verify(TXN, pid, 0, [T0]) == {T0: errors.ConcurrentTransactions.code}
    driver.failing_marker_partitions = set()
    driver.advance(1_000)
    assert verify(TXN, pid, 0, [T0]) == {T0: errors.TransactionAbortable.code}  # committed


@pytest.mark.parametrize(("verify_code", "produce_version", "expected"), [
    (errors.ProducerFenced.code, 9, errors.InvalidProducerEpoch.code),
    (errors.TransactionAbortable.code, 10, errors.InvalidTxnState.code),
    (errors.TransactionAbortable.code, 11, errors.TransactionAbortable.code),
    (errors.ConcurrentTransactions.code, 9, errors.NotEnoughReplicas.code),
    (errors.NotCoordinator.code, 9, errors.NotEnoughReplicas.code),
    (errors.InvalidProducerIdMapping.code, 9, errors.InvalidProducerIdMapping.code),
])
def test_verification_errors_as_produce_answers_them(verify_code, produce_version, expected):
    assert produce_verification_error_code(verify_code, produce_version) == expected


def test_a_failed_complete_append_is_retried_after_the_backoff():
    driver = TxnDriver()
    pid = init(driver).producer_id
    add(driver, pid, 0, T0)
    driver.failing_marker_partitions = {T0}
    assert end(driver, pid, 0, commit=True) == 0  # PrepareCommit stored, marker failing
    driver.append_error_code = errors.NotEnoughReplicas.code
    driver.failing_marker_partitions = set()
    backoff_ms = driver.coordinator.config.marker_retry_backoff_ms
    driver.advance(backoff_ms)  # marker written; CompleteCommit's append fails
    assert driver.coordinator.next_deadline_ms() == driver.now_ms + backoff_ms
    assert describe(driver).transaction_state == "PrepareCommit"
    driver.append_error_code = 0
    driver.advance(backoff_ms)
    assert describe(driver).transaction_state == "CompleteCommit"
