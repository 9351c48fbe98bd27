"""Transactions on the log: transactional batches, end-transaction markers written by the
coordinator (``Log.append_transaction_marker``), producer and coordinator epoch fencing."""

from __future__ import annotations

import os
import struct
import threading

import pytest

from headrace.errors import (
    InvalidProducerEpoch,
    InvalidRecord,
    InvalidTxnState,
    TransactionCoordinatorFenced,
)
from headrace.protocol.batch import parse_header
from headrace.protocol.control_records import build_end_txn_marker_batch, marker_of_batch
from headrace.protocol.records import build_batch, decode_batch
from headrace.storage.cleaner import Cleaner, cleanable_end_offset
from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log
from headrace.storage.offset_map import OffsetMap
from headrace.storage.txn_index import AbortedTxn, TransactionIndex
from tests.storage.cleaner_workload import compact_config, read_records
from tests.storage.cleaner_workload import open_log as compact_open_log
from tests.storage.helpers import NOW_MS, open_log, read_all, reopen

PRODUCER_ID = 4_000
EPOCH = 3
COORDINATOR_EPOCH = 7
TIMEOUT_S = 30


def txn_batch(sequence: int, count: int = 2, epoch: int = EPOCH,
              producer_id: int = PRODUCER_ID, transactional: bool = True) -> bytes:
    records = [(b"k%d" % i, b"v%d" % i, (), NOW_MS) for i in range(count)]
    return build_batch(records, producer_id=producer_id, producer_epoch=epoch,
                       base_sequence=sequence, transactional=transactional)


def test_marker_is_kafkas_control_batch(scratch):
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    result = log.append_transaction_marker(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)
    assert (result.base_offset, result.last_offset) == (2, 2)
    offset, raw = read_all(log)[-1]
    batch = decode_batch(raw)
    header = batch.header
    assert offset == 2 and header.is_control and header.is_transactional
    assert (header.producer_id, header.producer_epoch, header.base_sequence) == \
        (PRODUCER_ID, EPOCH, -1)
    [record] = batch.records
    assert record.key == struct.pack(">hh", 0, 1)  # version 0, type 1 = commit
    assert record.value == struct.pack(">hi", 0, COORDINATOR_EPOCH)
    log.close()


def test_transactional_batch_begins_a_transaction_that_a_marker_ends(scratch):
    log = open_log(scratch)
    log.append(build_batch([(b"a", b"b", (), NOW_MS)]), NOW_MS, from_client=True)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    log.append(txn_batch(2), NOW_MS, from_client=True)
    assert log.producer_state.first_unstable_offset() == 1
    log.append_transaction_marker(PRODUCER_ID, EPOCH, False, COORDINATOR_EPOCH, NOW_MS)
    assert log.producer_state.first_unstable_offset() is None
    log.close()


def test_a_marker_without_an_ongoing_transaction_is_written_and_completes_nothing(scratch):
    """A retried WriteTxnMarkers: Kafka appends the marker again."""
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    log.append_transaction_marker(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)
    retried = log.append_transaction_marker(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)
    assert retried.base_offset == 3 and log.log_end_offset == 4
    assert log.producer_state.first_unstable_offset() is None
    assert marker_of_batch(read_all(log)[-1][1]).commit
    log.close()


def test_a_marker_with_an_older_producer_epoch_is_refused(scratch):
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    with pytest.raises(InvalidProducerEpoch):
        log.append_transaction_marker(PRODUCER_ID, EPOCH - 1, False, COORDINATOR_EPOCH, NOW_MS)
    assert log.log_end_offset == 2
    assert log.producer_state.first_unstable_offset() == 0
    log.close()


def test_a_marker_from_an_older_coordinator_epoch_is_refused(scratch):
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    log.append_transaction_marker(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)
    log.append(txn_batch(2), NOW_MS, from_client=True)
    with pytest.raises(TransactionCoordinatorFenced):
        log.append_transaction_marker(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH - 1, NOW_MS)
    assert log.log_end_offset == 5
    log.close()


def test_the_bumped_epoch_of_an_abort_marker_fences_the_zombie_producer(scratch):
    """InitProducerId bumps the epoch and aborts with markers at the new epoch: the old
    producer's next batch gets INVALID_PRODUCER_EPOCH; the new one starts at sequence 0."""
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    log.append_transaction_marker(PRODUCER_ID, EPOCH + 1, False, COORDINATOR_EPOCH, NOW_MS)
    with pytest.raises(InvalidProducerEpoch):
        log.append(txn_batch(2), NOW_MS, from_client=True)
    log.append(txn_batch(0, epoch=EPOCH + 1), NOW_MS, from_client=True)
    assert log.producer_state.first_unstable_offset() == 3
    log.close()


def test_a_plain_batch_during_the_producers_transaction_is_invalid_txn_state(scratch):
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    with pytest.raises(InvalidTxnState):
        log.append(txn_batch(2, transactional=False), NOW_MS, from_client=True)
    assert log.log_end_offset == 2
    log.close()


def test_clients_may_not_write_markers(scratch):
    log = open_log(scratch)
    marker = build_end_txn_marker_batch(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)
    with pytest.raises(InvalidRecord):
        log.append(marker, NOW_MS, from_client=True)
    log.close()


def test_ongoing_transaction_and_coordinator_epoch_survive_a_restart(scratch):
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    log.append_transaction_marker(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)
    log.append(txn_batch(2), NOW_MS, from_client=True)
    log = reopen(log)
    assert log.producer_state.first_unstable_offset() == 3
    with pytest.raises(TransactionCoordinatorFenced):
        log.append_transaction_marker(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH - 1, NOW_MS)
    log.close()


def test_marker_batch_header_matches_parse(scratch):
    raw = build_end_txn_marker_batch(PRODUCER_ID, EPOCH, False, COORDINATOR_EPOCH, NOW_MS)
    header = parse_header(raw)
    assert header.records_count == 1 and header.max_timestamp == NOW_MS
    assert not marker_of_batch(raw).commit


# ---- last stable offset, read_committed reads, the aborted-transaction index ----------------


def test_last_stable_offset_is_the_first_offset_of_the_earliest_ongoing_transaction(scratch):
    log = open_log(scratch)
    log.append(build_batch([(b"a", b"b", (), NOW_MS)]), NOW_MS, from_client=True)
    assert log.last_stable_offset == 1
    log.append(txn_batch(0), NOW_MS, from_client=True)                        # 1-2
    log.append(txn_batch(0, producer_id=PRODUCER_ID + 1), NOW_MS, from_client=True)  # 3-4
    assert log.last_stable_offset == 1
    log.append_transaction_marker(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)  # 5
    assert log.last_stable_offset == 3
    log.append_transaction_marker(PRODUCER_ID + 1, EPOCH, False, COORDINATOR_EPOCH, NOW_MS)
    assert log.last_stable_offset == log.log_end_offset == 7
    log.close()


def test_a_read_up_to_the_last_stable_offset_stops_before_the_open_transaction(scratch):
    log = open_log(scratch)
    log.append(build_batch([(b"a", b"b", (), NOW_MS)]), NOW_MS, from_client=True)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    log.append(build_batch([(b"c", b"d", (), NOW_MS)]), NOW_MS, from_client=True)
    result = log.read(0, 1 << 20, max_offset=log.last_stable_offset)
    data = b"".join(piece.read_bytes() for piece in result.slices)
    assert parse_header(data).next_offset == 1 and len(data) == parse_header(data).size_bytes
    assert log.read(1, 1 << 20, max_offset=log.last_stable_offset).size_bytes == 0
    log.close()


def test_an_abort_is_indexed_in_kafkas_34_byte_txnindex_entry(scratch):
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)                        # 0-1
    log.append(txn_batch(0, producer_id=PRODUCER_ID + 1), NOW_MS, from_client=True)  # 2-3
    log.append_transaction_marker(PRODUCER_ID, EPOCH, False, COORDINATOR_EPOCH, NOW_MS)  # 4
    log.append_transaction_marker(PRODUCER_ID + 1, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)
    path = log.dir / "00000000000000000000.txnindex"
    # version, producer id, first offset, last (marker) offset, LSO then: producer 4001's 2
    assert path.read_bytes() == struct.pack(">hqqqq", 0, PRODUCER_ID, 0, 4, 2)
    assert [(t.producer_id, t.first_offset) for t in log.collect_aborted_transactions(0, 6)] \
        == [(PRODUCER_ID, 0)]
    assert log.collect_aborted_transactions(5, 6) == []
    log.close()


def _abort_in_three_segments(scratch):
    """Transactions aborted in segments 0 and 1 and one still open in the active segment."""
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)
    log.append_transaction_marker(PRODUCER_ID, EPOCH, False, COORDINATOR_EPOCH, NOW_MS)  # 0-2
    log.roll(NOW_MS)
    log.append(txn_batch(2), NOW_MS, from_client=True)
    log.append_transaction_marker(PRODUCER_ID, EPOCH, False, COORDINATOR_EPOCH, NOW_MS)  # 3-5
    log.roll(NOW_MS)
    log.append(txn_batch(4), NOW_MS, from_client=True)
    log.append_transaction_marker(PRODUCER_ID, EPOCH, False, COORDINATOR_EPOCH, NOW_MS)  # 6-8
    log.append(txn_batch(6), NOW_MS, from_client=True)                                  # 9-10
    return log


def _aborted(log):
    return [(t.first_offset, t.last_offset, t.last_stable_offset)
            for t in log.collect_aborted_transactions(0, log.log_end_offset)]


def test_aborted_transactions_and_the_open_one_survive_a_crash(scratch):
    """Unclean shutdown with the recovery point (and the snapshot) at 0: the producer state
    and every segment's .txnindex are rebuilt by the replay, the deleted files included."""
    log = _abort_in_three_segments(scratch)
    expected = [(0, 2, 3), (3, 5, 6), (6, 8, 9)]
    assert _aborted(log) == expected
    for name in log.dir.iterdir():
        if name.suffix in (".txnindex", ".snapshot"):
            name.unlink()
    log = reopen(log, clean=False, recovery_point=0)
    assert _aborted(log) == expected
    assert log.last_stable_offset == 9
    log.close()


def test_a_crash_truncating_an_abort_marker_drops_its_index_entry(scratch):
    """The marker at 8 is lost in a torn tail: its entry goes, the transaction is open."""
    log = _abort_in_three_segments(scratch)
    active = log.segments[-1]
    marker_position = [p for p, h in active.iter_batches() if h.base_offset == 8][0]
    log.close_without_flush()
    with open(active.log_path, "r+b") as torn:
        torn.truncate(marker_position + 5)
    for name in log.dir.iterdir():
        if name.suffix == ".snapshot" and int(name.stem) > 6:
            name.unlink()
    log = Log("t", 0, log.dir, LogConfig(), RealFileSystem(), NOW_MS, recovery_point=6)
    assert log.log_end_offset == 8
    assert _aborted(log) == [(0, 2, 3), (3, 5, 6)]
    assert log.last_stable_offset == 6
    log.close()


# ---- compaction ------------------------------------------------------------------------------


def test_the_cleaner_never_cleans_past_the_last_stable_offset(scratch):
    """An open transaction's record may yet be aborted: mapping it would remove the committed
    value it shadows. Its segment and everything after stay uncleaned until it ends."""
    log = compact_open_log(scratch / "c-0", compact_config())
    log.append(build_batch([(b"key", b"committed", (), NOW_MS)]), NOW_MS, from_client=True)
    log.roll(NOW_MS)
    log.append(build_batch([(b"key", b"pending", (), NOW_MS)], producer_id=PRODUCER_ID,
                           producer_epoch=EPOCH, base_sequence=0, transactional=True),
               NOW_MS, from_client=True)
    log.roll(NOW_MS)
    log.append(build_batch([(b"other", b"v", (), NOW_MS)]), NOW_MS, from_client=True)
    log.roll(NOW_MS)
    assert cleanable_end_offset(log, NOW_MS, 0) == log.segments[1].base_offset
    Cleaner(OffsetMap(1 << 20)).clean(log, 0, NOW_MS)
    assert (0, b"key", b"committed") in read_records(log)
    log.append_transaction_marker(PRODUCER_ID, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)
    log.roll(NOW_MS)
    assert cleanable_end_offset(log, NOW_MS, 0) == log.segments[-1].base_offset
    log.close()


class _PausingReadFileSystem(RealFileSystem):
    """Holds the first close of a read-only ``.txnindex`` descriptor -- after its bytes were
    read -- until ``resume`` is set or ``PAUSE_BOUND_S`` passes."""

    PAUSE_BOUND_S = 2.0

    def __init__(self) -> None:
        self.read_done, self.resume = threading.Event(), threading.Event()
        self._read_fds: set[int] = set()

    def open(self, path, flags):
        fd = super().open(path, flags)
        if str(path).endswith(".txnindex") and flags == os.O_RDONLY:
            self._read_fds.add(fd)
        return fd

    def close(self, fd):
        super().close(fd)
        if fd in self._read_fds and not self.read_done.is_set():
            self.read_done.set()
            self.resume.wait(self.PAUSE_BOUND_S)
        self._read_fds.discard(fd)


def test_a_readers_first_load_of_a_txnindex_never_loses_an_entry_appended_meanwhile(scratch):
    fs = _PausingReadFileSystem()
    first = AbortedTxn(PRODUCER_ID, 0, 4, 5)
    index = TransactionIndex(fs, scratch / "00000000000000000000.txnindex")
    index.append(first)
    reloaded = TransactionIndex(fs, index.path)
    reader = threading.Thread(target=lambda: reloaded.entries)
    reader.start()
    assert fs.read_done.wait(TIMEOUT_S)
    second = AbortedTxn(PRODUCER_ID, 6, 8, 9)
    appender = threading.Thread(target=reloaded.append, args=(second,))
    appender.start()
    # the append waits for the reader's load (which ends when its bounded pause does);
    # without that lock it completes here, and the reader then stores what it read before
    appender.join(TIMEOUT_S)
    fs.resume.set()
    reader.join(TIMEOUT_S)
    assert reloaded.entries == (first, second)


def _keyed(key: bytes, value: bytes, producer_id: int = -1, sequence: int = -1) -> bytes:
    return build_batch([(key, value, (), NOW_MS)], producer_id=producer_id,
                       producer_epoch=EPOCH if producer_id >= 0 else -1, base_sequence=sequence,
                       transactional=producer_id >= 0)


def test_the_cleaner_removes_aborted_records_and_they_never_shadow_committed_ones(scratch):
    """Kafka's cleaner skips aborted data when mapping keys and removes it: the committed
    value of a key survives a later aborted write of it; committed transactional data and
    every marker stay; the aborting producer's last batch stays, empty."""
    log = compact_open_log(scratch / "c-0", compact_config())
    other = PRODUCER_ID + 1
    log.append(_keyed(b"key", b"committed"), NOW_MS, from_client=True)            # 0
    log.append(_keyed(b"key", b"aborted", PRODUCER_ID, 0), NOW_MS, from_client=True)  # 1
    log.append(_keyed(b"gone", b"aborted", PRODUCER_ID, 1), NOW_MS, from_client=True)  # 2
    log.append(_keyed(b"kept", b"txn", other, 0), NOW_MS, from_client=True)       # 3
    log.append_transaction_marker(PRODUCER_ID, EPOCH, False, COORDINATOR_EPOCH, NOW_MS)  # 4
    log.append_transaction_marker(other, EPOCH, True, COORDINATOR_EPOCH, NOW_MS)  # 5
    log.append(_keyed(b"key", b"aborted-again", PRODUCER_ID, 2), NOW_MS, from_client=True)
    log.append_transaction_marker(PRODUCER_ID, EPOCH, False, COORDINATOR_EPOCH, NOW_MS)  # 7
    log.roll(NOW_MS)
    Cleaner(OffsetMap(1 << 20)).clean(log, 0, NOW_MS)
    assert read_records(log) == [(0, b"key", b"committed"), (3, b"kept", b"txn")]
    batches = [parse_header(raw) for _, raw in read_all(log)]
    assert [(h.base_offset, h.is_control, h.records_count) for h in batches] == [
        (0, False, 1), (3, False, 1), (4, True, 1), (5, True, 1), (6, False, 0), (7, True, 1)]
    log.close()


def test_the_last_stable_offset_never_lies_below_the_log_start(scratch):
    """DeleteRecords past an open transaction's first offset: Kafka's first unstable offset
    moves up to the log start offset."""
    log = open_log(scratch)
    log.append(txn_batch(0), NOW_MS, from_client=True)                       # 0-1, open
    log.append(build_batch([(b"a", b"b", (), NOW_MS)]), NOW_MS, from_client=True)  # 2
    log.delete_records_before(2)
    assert log.last_stable_offset == 2
    assert log.read(2, 1 << 20, max_offset=log.last_stable_offset).size_bytes == 0
    log.close()
