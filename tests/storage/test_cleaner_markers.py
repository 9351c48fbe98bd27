"""The cleaner and transaction markers, against an oracle: seeded workloads of plain writes and
committed and aborted transactions of several producers. A marker stays while data of its
transaction remains; once none does, a cleaning stamps its delete horizon (clean time +
delete.retention.ms, KIP-534) and a cleaning at or after the horizon removes it -- except a
producer's last record at its epoch, kept for fencing (Kafka 3.x's LogCleaner). Throughout,
the latest committed value of every key is the oracle's and no aborted value is readable."""

from __future__ import annotations

import random

import pytest

from headrace.protocol.batch import DELETE_HORIZON_BIT, parse_header
from headrace.protocol.control_records import marker_of_batch
from headrace.protocol.records import build_batch, decode_batch
from headrace.storage.cleaner import Cleaner
from headrace.storage.offset_map import OffsetMap

from .cleaner_workload import NOW_MS, compact_config, latest_values, open_log, read_records
from .helpers import read_all, reopen

PRODUCER_IDS = (5_000, 5_001, 5_002)
EPOCH = 2
COORDINATOR_EPOCH = 4
KEYS = 12
RETENTION_MS = 1_000


class Workload:
    """Appends to the log and keeps the oracle: key -> latest committed value."""

    def __init__(self, log, seed: int) -> None:
        self.log = log
        self.rng = random.Random(seed)
        self.oracle: dict[bytes, bytes] = {}
        self.sequences = dict.fromkeys(PRODUCER_IDS, 0)
        self.writes = 0

    def _records(self, tag: bytes) -> list[tuple]:
        self.writes += 1
        return [(b"k%d" % self.rng.randrange(KEYS), b"%s-%d-%d" % (tag, self.writes, i), (),
                 NOW_MS) for i in range(self.rng.randint(1, 3))]

    def plain(self) -> None:
        records = self._records(b"plain")
        self.log.append(build_batch(records), NOW_MS, from_client=True)
        self.oracle.update((key, value) for key, value, _, _ in records)

    def transaction(self, producer_id: int, commit: bool) -> None:
        written = []
        for _ in range(self.rng.randint(1, 2)):
            records = self._records(b"committed" if commit else b"aborted")
            self.log.append(build_batch(records, producer_id=producer_id, producer_epoch=EPOCH,
                                        base_sequence=self.sequences[producer_id],
                                        transactional=True), NOW_MS, from_client=True)
            self.sequences[producer_id] += len(records)
            written += records
        self.log.append_transaction_marker(producer_id, EPOCH, commit, COORDINATOR_EPOCH, NOW_MS)
        if commit:
            self.oracle.update((key, value) for key, value, _, _ in written)

    def run(self, steps: int) -> None:
        for _ in range(steps):
            if self.rng.random() < 0.4:
                self.plain()
            else:
                self.transaction(self.rng.choice(PRODUCER_IDS), self.rng.random() < 0.6)


def _batches(log) -> list:
    return [parse_header(raw) for _, raw in read_all(log)]


def _markers(log) -> dict[int, tuple[int, bool, bool, int]]:
    """marker offset -> (producer id, commit, has a delete horizon, base timestamp)."""
    markers = {}
    for _, raw in read_all(log):
        header = parse_header(raw)
        if header.is_control:
            marker = marker_of_batch(raw, 0)
            markers[header.base_offset] = (
                header.producer_id, marker.commit,
                bool(header.attributes & DELETE_HORIZON_BIT), header.base_timestamp)
    return markers


def _ending_markers(batches) -> dict[int, int]:
    """data batch offset -> offset of the marker of its producer that ends it."""
    ending, open_batches = {}, {}
    for header in batches:
        if header.is_control:
            for offset in open_batches.pop(header.producer_id, []):
                ending[offset] = header.base_offset
        elif header.is_transactional:
            open_batches.setdefault(header.producer_id, []).append(header.base_offset)
    return ending


def _markers_with_data(log) -> set[int]:
    return set(_ending_markers(_batches(log)).values())


def _read_committed(log) -> dict[bytes, bytes]:
    """The latest value per key a read_committed consumer reading from the log start sees,
    as Kafka's consumers filter: the aborted transactions the log announces for the range
    (``collect_aborted_transactions``) put their producer in the aborted set from their first
    offset on, its transactional data is skipped until its abort marker."""
    announced = sorted(log.collect_aborted_transactions(log.log_start_offset, log.log_end_offset),
                       key=lambda txn: txn.first_offset)
    aborted_producers: set[int] = set()
    latest: dict[bytes, bytes] = {}
    for _, raw in read_all(log):
        header = parse_header(raw)
        while announced and announced[0].first_offset <= header.last_offset:
            aborted_producers.add(announced.pop(0).producer_id)
        if header.is_control:
            if not marker_of_batch(raw, 0).commit:
                aborted_producers.discard(header.producer_id)
        elif not (header.is_transactional and header.producer_id in aborted_producers):
            latest.update((record.key, record.value) for record in decode_batch(raw).records)
    return latest


def _clean_at(log, first_dirty: int, now_ms: int, workload: Workload) -> int:
    """Append a plain batch (a dirty section for the cleaning), roll, clean at ``now_ms``;
    check the oracle and that no remaining transaction lost its marker. Returns the new
    first dirty offset."""
    before = _ending_markers(_batches(log))
    workload.plain()
    log.roll(now_ms)
    stats = Cleaner(OffsetMap(1 << 20)).clean(log, first_dirty, now_ms)
    records = read_records(log)
    assert latest_values(records) == workload.oracle
    assert _read_committed(log) == workload.oracle
    assert not [value for _, _, value in records if value.startswith(b"aborted")]
    after = _ending_markers(_batches(log))
    assert {offset: after.get(offset) for offset in after} == \
        {offset: before[offset] for offset in after}, "a transaction's data lost its marker"
    return stats.end_offset


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_markers_go_after_their_data_and_their_delete_horizon(scratch, seed):
    log = open_log(scratch / "t-0", compact_config(delete_retention_ms=RETENTION_MS))
    workload = Workload(log, seed)
    workload.run(150)
    fenced = PRODUCER_IDS[0]  # a coordinator's fencing abort: the producer's last record
    log.append_transaction_marker(fenced, EPOCH + 1, False, COORDINATOR_EPOCH, NOW_MS)
    fencing_marker = log.log_end_offset - 1
    markers = _markers(log)

    dirty = _clean_at(log, 0, NOW_MS, workload)  # removes aborted data: their markers stay
    assert _markers(log).keys() == markers.keys()
    assert not [offset for offset, marker in _markers(log).items() if marker[2]]
    without_data = markers.keys() - _markers_with_data(log)
    # A cleaning that meets a transaction's data (even removing it) keeps its marker as it
    # is; one that meets none of it stamps the marker's horizon.
    dirty = _clean_at(log, dirty, NOW_MS, workload)
    stamped = {offset for offset, (_, _, horizon, _) in _markers(log).items() if horizon}
    assert _markers(log).keys() == markers.keys()
    assert stamped == without_data - {fencing_marker}
    assert {_markers(log)[offset][3] for offset in stamped} == {NOW_MS + RETENTION_MS}
    assert stamped, "the workload left no marker without data"

    _clean_at(log, dirty, NOW_MS + RETENTION_MS - 1, workload)  # before the horizon: kept
    assert _markers(log).keys() == markers.keys()
    _clean_at(log, dirty, NOW_MS + RETENTION_MS, workload)  # at the horizon: removed
    assert _markers(log).keys() == markers.keys() - stamped
    assert fencing_marker in _markers(log)

    log = reopen(log)  # recovery replays what is left: no transaction reopens
    assert log.producer_state.first_unstable_offset() is None
    assert log.last_stable_offset == log.log_end_offset
    assert log.producer_state.producers[fenced].epoch == EPOCH + 1
    assert latest_values(read_records(log)) == workload.oracle
    log.close()
