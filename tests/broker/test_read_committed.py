"""read_committed Fetch and ListOffsets, the handlers called over a real LogManager on real
files: transactional batches appended to the log as a producer's, markers written through
``Log.append_transaction_marker`` as the transaction coordinator writes them."""

from __future__ import annotations

import pytest

from headrace.broker.handlers import fetch, list_offsets
from headrace.protocol.records import build_batch
from tests.broker.test_admin_handlers import Admin
from tests.broker.test_storage_errors import _call, _request
from tests.record_reading import iter_headers

TOPIC = "txn"
ABORTED_PID, OPEN_PID = 4_000, 4_001
EPOCH, COORDINATOR_EPOCH = 0, 0
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
LATEST = -1


@pytest.fixture
def admin(tmp_path):
    admin = Admin(tmp_path / "data")
    assert admin.create(TOPIC, 1).topics[0].error_code == 0
    yield admin
    admin.close()


def _batch(now_ms: int, producer_id: int = -1, transactional: bool = False) -> bytes:
    sequence = 0 if producer_id >= 0 else -1
    return build_batch([(b"k", b"v", (), now_ms), (b"k", b"w", (), now_ms)],
                       producer_id=producer_id, producer_epoch=EPOCH if producer_id >= 0 else -1,
                       base_sequence=sequence, transactional=transactional)


def _one_aborted_one_open(admin):
    """0-1 plain, 2-3 aborted (marker 6), 4-5 open, 7-8 plain: LSO 4, high watermark 9."""
    log = admin.state.log_manager.get_log(TOPIC, 0)
    now_ms = admin.clock.now_ms()
    log.append(_batch(now_ms), now_ms, from_client=True)
    log.append(_batch(now_ms, ABORTED_PID, True), now_ms, from_client=True)
    log.append(_batch(now_ms, OPEN_PID, True), now_ms, from_client=True)
    log.append_transaction_marker(ABORTED_PID, EPOCH, False, COORDINATOR_EPOCH, now_ms)
    log.append(_batch(now_ms), now_ms, from_client=True)
    return log


def _fetch(admin, version: int, isolation_level: int, fetch_offset: int = 0):
    request = _request(fetch.API_KEY, version, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
        "isolation_level": isolation_level, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": TOPIC, "topic_id": _topic_id(admin), "partitions": [
            {"partition": 0, "fetch_offset": fetch_offset, "partition_max_bytes": 1 << 20,
             "current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    answer = admin.loop.run_until_complete(_call(admin.state, fetch, request))
    [partition] = answer.responses[0].partitions
    return partition


def _topic_id(admin):
    return admin.state.log_manager.topic(TOPIC).topic_id


def _base_offsets(records) -> list[int]:
    return [header.base_offset for _, header in iter_headers(records or b"")]


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_read_committed_fetch_stops_at_the_lso_and_lists_the_aborted_transaction(admin, version):
    _one_aborted_one_open(admin)
    partition = _fetch(admin, version, READ_COMMITTED)
    assert partition.error_code == 0
    assert (partition.high_watermark, partition.last_stable_offset) == (9, 4)
    assert _base_offsets(partition.records) == [0, 2]
    assert [(t.producer_id, t.first_offset) for t in partition.aborted_transactions] == \
        [(ABORTED_PID, 2)]


def test_read_uncommitted_fetch_reads_to_the_high_watermark_and_reports_the_lso(admin):
    _one_aborted_one_open(admin)
    partition = _fetch(admin, 12, READ_UNCOMMITTED)
    assert (partition.high_watermark, partition.last_stable_offset) == (9, 4)
    assert _base_offsets(partition.records) == [0, 2, 4, 6, 7]
    assert not partition.aborted_transactions


def test_once_the_open_transaction_commits_read_committed_reads_on(admin):
    log = _one_aborted_one_open(admin)
    assert not _fetch(admin, 12, READ_COMMITTED, fetch_offset=4).records
    log.append_transaction_marker(OPEN_PID, EPOCH, True, COORDINATOR_EPOCH,
                                  admin.clock.now_ms())
    partition = _fetch(admin, 12, READ_COMMITTED, fetch_offset=4)
    assert partition.last_stable_offset == partition.high_watermark == 10
    assert _base_offsets(partition.records) == [4, 6, 7, 9]
    # the aborted transaction's marker (6) lies in the fetched range: it is still announced
    assert [t.producer_id for t in partition.aborted_transactions] == [ABORTED_PID]


def _list_offsets(admin, isolation_level: int, timestamp: int, version: int = 7):
    body = {"replica_id": -1, "isolation_level": isolation_level, "topics": [
        {"name": TOPIC, "partitions": [
            {"partition_index": 0, "timestamp": timestamp, "current_leader_epoch": -1}]}]}
    [partition] = admin.call(list_offsets.API_KEY, version, body).topics[0].partitions
    assert partition.error_code == 0
    return partition.offset


def test_list_offsets_latest_is_the_lso_under_read_committed(admin):
    _one_aborted_one_open(admin)
    assert _list_offsets(admin, READ_COMMITTED, LATEST) == 4
    assert _list_offsets(admin, READ_COMMITTED, LATEST, version=2) == 4
    assert _list_offsets(admin, READ_UNCOMMITTED, LATEST) == 9


def test_list_offsets_by_time_under_read_committed_finds_nothing_past_the_lso(admin):
    log = admin.state.log_manager.get_log(TOPIC, 0)
    now_ms = admin.clock.now_ms()
    log.append(_batch(now_ms - 1_000), now_ms, from_client=True)
    log.append(_batch(now_ms, OPEN_PID, True), now_ms, from_client=True)
    assert _list_offsets(admin, READ_UNCOMMITTED, now_ms) == 2
    assert _list_offsets(admin, READ_COMMITTED, now_ms) == -1
    assert _list_offsets(admin, READ_COMMITTED, now_ms - 1_000) == 0
