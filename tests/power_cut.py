"""Power-cut simulation for a real broker process on its production write path.

Owns ``PowerCutBroker`` (a ``BrokerProcess`` run under the LD_PRELOAD shim that
``headrace/faults/power_cut.py`` builds; that module also models the data directory a power
cut leaves, its shadow directory format and its limitations) and the produce/consume/check
helpers the power-cut tests and ``bench/power_cuts.py`` share.

Why a preload shim that records at sync points: a SIGKILL leaves the page cache, so it cannot
show a missing fsync, and the fault-injecting file system (``tests/storage/faulty_fs.py``) takes
the log off its production append path (the compiled kernel's ``append_plain_batch`` writes
straight to the descriptor only under ``RealFileSystem``). The shim sits below both: every
successful fsync/fdatasync of a file or directory under the data directory makes it copy what
that call made durable (a file's content, a directory's entries) into a shadow directory. No
write is intercepted, so nothing the broker does is changed or slowed except its syncs, and
writes that bypass every Python wrapper are covered. Wrapping ``headrace/storage/fs.py``
instead would miss the kernel's writes unless the kernel reported them; a loop device needs
root and a device-mapper target (dm-log-writes) to tell what was flushed, FUSE needs root and
a binding not among the pinned dependencies; the shim needs only gcc. A sync call the shim does not know
(sync_file_range, msync, syncfs, O_SYNC writes: headrace uses none) counts as no sync, so an
unknown call can only make the model stricter, never hide a loss.

Thread-safety: none; one test drives one broker.
"""

from __future__ import annotations

import os
import random
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, Producer

from headrace.faults.power_cut import (  # noqa: F401 -- build_shim re-exported for tests
    CutOutcome,
    build_shim,
    rebuild_after_power_cut,
    record_baseline,
    shadow_dir_of,
    shim_environment,
)
from tests.broker.raw_client import RawClient
from tests.broker.test_protocol import _create, _fetch
from tests.conftest import BrokerProcess
from tests.record_reading import iter_records

TOPIC = "power-cut"
ACK_WAIT_TIMEOUT_S = 60.0
DRAIN_TIMEOUT_S = 30.0
READ_BACK_MAX_FETCHES = 10_000
MAX_UNACKNOWLEDGED_RECORDS = 20
RECORDS_PER_CUT = 300
MAX_POLLS_BEFORE_CUT = 5_000


class PowerCutBroker(BrokerProcess):
    """A broker whose ``power_cut`` SIGKILLs it and leaves only what it had synced."""

    def __init__(self, data_dir: Path, shim: Path, overrides: dict[str, str] | None = None,
                 drop_fsync_suffix: str = "") -> None:
        data_dir = data_dir.resolve()
        self.shadow_dir = shadow_dir_of(data_dir)
        env = {**os.environ, "LD_PRELOAD": str(shim),
               **shim_environment(data_dir, self.shadow_dir, drop_fsync_suffix)}
        super().__init__(data_dir, overrides, env)

    def start(self) -> None:
        record_baseline(self.data_dir, self.shadow_dir)
        super().start()

    def power_cut(self, rng: random.Random | None = None) -> CutOutcome:
        self.kill()
        return rebuild_after_power_cut(self.data_dir, self.shadow_dir, rng)


def value_of(sequence: int) -> bytes:
    return f"record-{sequence}".encode()


class AckRecorder:
    """Delivery reports of one producer: acknowledged (offset, value) pairs, reports seen."""

    def __init__(self) -> None:
        self.acknowledged: list[tuple[int, bytes]] = []
        self.reports = 0
        self._lock = threading.Lock()

    def __call__(self, error: KafkaError | None, message) -> None:
        with self._lock:
            self.reports += 1
            if error is None:
                self.acknowledged.append((message.offset(), message.value()))


@dataclass(frozen=True)
class CutMoment:
    """When to cut: once ``after_acks`` records are acknowledged, produce ``extra_records``
    more (without waiting) and poll the producer ``polls`` times (a bounded spin, no sleep),
    so the cut lands anywhere in the broker's handling of a request, not only between them."""

    after_acks: int
    extra_records: int
    polls: int

    @staticmethod
    def seeded(rng: random.Random, records: int) -> CutMoment:
        return CutMoment(rng.randint(1, records), rng.randint(0, MAX_UNACKNOWLEDGED_RECORDS),
                         rng.randint(0, MAX_POLLS_BEFORE_CUT))


def produce_until_cut(broker: PowerCutBroker, records: int, moment: CutMoment,
                      rng: random.Random | None = None) -> tuple[AckRecorder, CutOutcome]:
    """Produce up to ``records`` values (acks=all, idempotent, at most
    ``MAX_UNACKNOWLEDGED_RECORDS`` awaiting their report until the cut nears) and cut the
    power at ``moment`` (torn tails drawn from ``rng``); returns every acknowledgement the
    producer received before the cut, and the cut's outcome."""
    with RawClient(broker.bootstrap) as client:
        _create(client, TOPIC)
    recorder = AckRecorder()
    producer = Producer({"bootstrap.servers": broker.bootstrap, "acks": "all",
                         "enable.idempotence": True, "linger.ms": 0, "log_level": 0,
                         "message.timeout.ms": 60_000})
    produced = 0
    deadline = time.monotonic() + ACK_WAIT_TIMEOUT_S
    while len(recorder.acknowledged) < moment.after_acks and recorder.reports < records:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{moment.after_acks} acknowledgements took over "
                               f"{ACK_WAIT_TIMEOUT_S} s")
        if produced < records and produced - recorder.reports < MAX_UNACKNOWLEDGED_RECORDS:
            producer.produce(TOPIC, value_of(produced), key=b"k", partition=0,
                             on_delivery=recorder)
            produced += 1
            producer.poll(0)
        else:
            producer.poll(0.001)
    for sequence in range(produced, min(records, produced + moment.extra_records)):
        producer.produce(TOPIC, value_of(sequence), key=b"k", partition=0,
                         on_delivery=recorder)
        produced += 1
    for _ in range(moment.polls):
        producer.poll(0)
    outcome = broker.power_cut(rng)
    producer.purge()
    _wait_for(lambda: recorder.reports >= produced, producer, DRAIN_TIMEOUT_S)
    return recorder, outcome


def produce_after_recovery(bootstrap: str, records: int) -> list[bytes]:
    """Produce ``records`` values ``after-cut-<n>`` (acks=all) and wait for every report;
    returns the values, all acknowledged."""
    recorder = AckRecorder()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all",
                         "enable.idempotence": True, "log_level": 0})
    values = [f"after-cut-{sequence}".encode() for sequence in range(records)]
    for value in values:
        producer.produce(TOPIC, value, key=b"k", partition=0, on_delivery=recorder)
    _wait_for(lambda: recorder.reports >= records, producer, ACK_WAIT_TIMEOUT_S)
    assert len(recorder.acknowledged) == records, "a record produced after recovery failed"
    return values


def _wait_for(condition, producer: Producer, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(f"producer did not reach the awaited state in {timeout_s} s")
        producer.poll(0.05)


def read_back(bootstrap: str) -> list[tuple[int, bytes]]:
    """Every (offset, value) of the topic's partition 0, from offset 0 to the end."""
    stored: list[tuple[int, bytes]] = []
    offset = 0
    with RawClient(bootstrap) as client:
        for _ in range(READ_BACK_MAX_FETCHES):
            answer = _fetch(client, TOPIC, offset)
            assert answer.error_code == 0, answer
            fresh = [r for r in iter_records(answer.records) if r.offset >= offset]
            if not fresh:
                return stored
            stored.extend((r.offset, r.value) for r in fresh)
            offset = fresh[-1].offset + 1
    raise AssertionError(f"more than {READ_BACK_MAX_FETCHES} fetches to read the topic")


@dataclass
class CutRun:
    """One cut: what was acknowledged before it, what the partition holds after recovery and
    after ``appended`` was produced, and what the cut dropped."""

    acknowledged: list[tuple[int, bytes]]
    stored: list[tuple[int, bytes]]
    outcome: CutOutcome
    appended: list[bytes]


def cut_and_recover(work_dir: Path, shim: Path, seed: int, overrides: dict[str, str],
                    records: int = RECORDS_PER_CUT, drop_fsync_suffix: str = "",
                    torn_tails: bool = True, records_after_recovery: int = 0) -> CutRun:
    """A broker on a fresh ``work_dir/data``: produce up to ``records``, cut the power after a
    seeded number of acknowledgements (with seeded torn tails unless ``torn_tails`` is
    false), restart, produce ``records_after_recovery`` more, read the partition back."""
    rng = random.Random(seed)
    broker = PowerCutBroker(work_dir / "data", shim, overrides, drop_fsync_suffix)
    broker.data_dir.mkdir()
    broker.start()
    try:
        recorder, outcome = produce_until_cut(broker, records, CutMoment.seeded(rng, records),
                                              rng if torn_tails else None)
        broker.start()
        appended = produce_after_recovery(broker.bootstrap, records_after_recovery)
        stored = read_back(broker.bootstrap)
    finally:
        broker.stop()
    return CutRun(recorder.acknowledged, stored, outcome, appended)


def lost_acknowledged(acknowledged: list[tuple[int, bytes]],
                      stored: list[tuple[int, bytes]]) -> list[tuple[int, bytes]]:
    """The acknowledged records the stored log does not hold at their offsets."""
    by_offset = dict(stored)
    return [(offset, value) for offset, value in acknowledged if by_offset.get(offset) != value]


def log_anomalies(stored: list[tuple[int, bytes]],
                  appended_after_recovery: list[bytes] = ()) -> list[str]:
    """How ``stored`` is not a prefix of what was produced before the cut (offsets 0..
    contiguous, each offset holding the value produced in that position by the one
    idempotent producer) followed by exactly ``appended_after_recovery``."""
    before_cut = len(stored) - len(appended_after_recovery)
    expected = [value_of(position) for position in range(max(0, before_cut))]
    expected += list(appended_after_recovery)
    anomalies = [f"offset {offset} holds {value!r} at position {position}"
                 for position, (offset, value) in enumerate(stored)
                 if offset != position or value != expected[position]]
    if before_cut < 0:
        anomalies.append(f"only {len(stored)} records stored, fewer than the "
                         f"{len(appended_after_recovery)} appended after recovery")
    return anomalies
