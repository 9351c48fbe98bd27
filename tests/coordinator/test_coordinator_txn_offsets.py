"""Transactional offsets (TxnOffsetCommit) in the group coordinator: pending until the marker,
KIP-447's member checks, require_stable, failed appends, reloading from the offsets topic."""

from __future__ import annotations

from coordinator_driver import GROUP, Driver, form_group

from headrace import errors
from headrace.coordinator.messages import (
    OffsetAndMetadata,
    OffsetFetchRequest,
    TxnOffsetCommitRequest,
    TxnOffsetsCompleted,
)

ORDERS_0 = ("orders", 0)
PRODUCER_ID, EPOCH = 42, 3


def txn_commit(driver: Driver, offset: int, **kw):
    return driver.result(driver.call(TxnOffsetCommitRequest(
        GROUP, PRODUCER_ID, EPOCH, {ORDERS_0: OffsetAndMetadata(offset)}, **kw)))


def fetched(driver: Driver, require_stable: bool = True):
    response = driver.call(OffsetFetchRequest(GROUP, (ORDERS_0,), require_stable))
    found = response.offsets[ORDERS_0]
    return found.offset, found.error_code


def complete(driver: Driver, commit: bool, producer_id: int = PRODUCER_ID) -> None:
    driver.call(TxnOffsetsCompleted(driver.coordinator.partition_for(GROUP), producer_id,
                                    commit))


def test_offsets_are_pending_until_the_marker_commits_them(driver):
    assert txn_commit(driver, 10).partition_errors == {ORDERS_0: 0}
    assert fetched(driver) == (-1, errors.UnstableOffsetCommit.code)
    assert fetched(driver, require_stable=False) == (-1, 0)
    complete(driver, commit=False, producer_id=PRODUCER_ID + 1)  # another producer's marker
    assert fetched(driver) == (-1, errors.UnstableOffsetCommit.code)
    complete(driver, commit=True)
    assert fetched(driver) == (10, 0)


def test_an_aborted_transaction_drops_its_offsets(driver):
    txn_commit(driver, 10)
    complete(driver, commit=False)
    assert fetched(driver) == (-1, 0)


def test_the_batch_is_the_producers_transactional_batch(driver):
    (effect,) = driver.coordinator.handle(TxnOffsetCommitRequest(
        GROUP, PRODUCER_ID, EPOCH, {ORDERS_0: OffsetAndMetadata(11)}), 0).effects
    assert (effect.producer_id, effect.producer_epoch) == (PRODUCER_ID, EPOCH)


def test_kip_447_member_and_generation_checks(driver):
    members, leader, generation = form_group(driver, 1)
    driver.sync(leader, generation, {leader: b""})
    assert txn_commit(driver, 1, generation_id=generation + 1, member_id=leader) \
        .partition_errors == {ORDERS_0: errors.IllegalGeneration.code}
    assert txn_commit(driver, 1, generation_id=generation, member_id="stranger") \
        .partition_errors == {ORDERS_0: errors.UnknownMemberId.code}
    assert txn_commit(driver, 1, generation_id=generation, member_id=leader) \
        .partition_errors == {ORDERS_0: 0}


def test_a_fenced_append_answers_the_logs_error_and_leaves_nothing_pending(driver):
    driver.hold_appends = True
    response = driver.call(TxnOffsetCommitRequest(
        GROUP, PRODUCER_ID, EPOCH, {ORDERS_0: OffsetAndMetadata(5)}))
    driver.finish_appends(errors.InvalidProducerEpoch.code)
    assert driver.result(response).partition_errors == {ORDERS_0: errors.InvalidProducerEpoch.code}
    assert fetched(driver) == (-1, 0)


def test_reloading_applies_committed_and_keeps_open_transactions_pending(driver):
    txn_commit(driver, 10)
    complete(driver, commit=True)
    partition = driver.coordinator.partition_for(GROUP)
    records = driver.appended[partition]
    reloaded = Driver()
    reloaded.coordinator.load_transactional(partition, PRODUCER_ID, records)
    reloaded.coordinator.load_marker(partition, PRODUCER_ID, commit=True)
    reloaded.coordinator.load_transactional(partition, PRODUCER_ID + 1, records)  # still open
    reloaded.coordinator.finish_loading(partition, 0)
    assert fetched(reloaded, require_stable=False) == (10, 0)
    assert fetched(reloaded) == (-1, errors.UnstableOffsetCommit.code)
    complete(reloaded, commit=False, producer_id=PRODUCER_ID + 1)
    assert fetched(reloaded) == (10, 0)
