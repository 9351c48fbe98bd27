"""Log.append's single-batch path (one kernel call writes to the segment) against the general
path.

A log on the real file system takes the single-batch path for single batches; the same log
on a wrapping file system (any ``RealFileSystem`` subclass) always takes the general path.
Driven through the same operations -- plain, producer, multi-batch, compressed, damaged,
oversized and badly timestamped requests, clock jumps past segment.ms, small segments and
indexes that fill -- both must answer alike (results, or the same error) and leave
byte-identical directories.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.errors import KafkaError
from headrace.protocol.compression import GZIP
from headrace.protocol.records import build_batch as records_build_batch
from headrace.storage.config import LogConfig
from headrace.storage.fs import RealFileSystem
from headrace.storage.log import Log

from .batches import build_batch
from .helpers import assert_indexes_match_scan, read_all

NOW_MS = 1_700_000_000_000


class WrappingFileSystem(RealFileSystem):
    """The real file system behind a wrapper type: the log must route writes through it."""


def _request(rng: random.Random, now_ms: int, producer: dict[str, int]) -> bytearray:
    kind = rng.choice(["plain"] * 6 + ["producer", "two", "gzip", "damaged", "large",
                                       "late", "empty"])
    values = [b"v" * rng.randint(1, 120) for _ in range(rng.randint(1, 4))]
    if kind == "producer":
        if rng.random() < 0.2:  # a retry of the last batch, or a gap in the sequence
            producer["sequence"] -= rng.choice([len(values), -3])
        batch = build_batch(values, now_ms, producer_id=9, producer_epoch=0,
                            base_sequence=producer["sequence"])
        producer["sequence"] += len(values)
        return batch
    if kind == "two":
        return build_batch(values, now_ms) + build_batch([b"second"], now_ms)
    if kind == "gzip":
        return bytearray(records_build_batch([(None, v, [], now_ms) for v in values],
                                             compression=GZIP))
    if kind == "damaged":
        batch = build_batch(values, now_ms)
        batch[rng.randrange(len(batch))] ^= 0x10
        return batch
    if kind == "large":
        return build_batch([b"x" * 700], now_ms)
    if kind == "late":
        return build_batch(values, now_ms - 10 * 86_400_000)
    if kind == "empty":
        return bytearray()
    return build_batch(values, now_ms)


def _outcome(log: Log, request: bytearray, now_ms: int) -> object:
    try:
        return tuple(log.append(request, now_ms))
    except KafkaError as error:
        return type(error), str(error)


def _files(log: Log) -> dict[str, bytes]:
    return {path.name: path.read_bytes() for path in sorted(log.dir.iterdir())}


CONFIGS = st.fixed_dictionaries({
    "segment_bytes": st.sampled_from([1_500, 4_000, 1 << 20]),
    "segment_index_bytes": st.sampled_from([40, 10 << 20]),
    "index_interval_bytes": st.sampled_from([0, 150, 4096]),
    "segment_ms": st.sampled_from([1_000, 7 * 86_400_000]),
    "flush_messages": st.sampled_from([5, 2**63 - 1]),
    "max_message_bytes": st.just(600),
    "message_timestamp_before_max_ms": st.sampled_from([86_400_000, 2**63 - 1]),
    "compression_type": st.sampled_from(["producer", "producer", "gzip"]),
})


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(CONFIGS, st.integers(0, 2**32))
def test_plain_and_general_paths_answer_and_write_alike(scratch, config, seed):
    rng = random.Random(seed)
    case = scratch / str(seed)
    logs = [Log("t", 0, case / name / "t-0", LogConfig(**config), fs, NOW_MS, clean_shutdown=True)
            for name, fs in (("plain", RealFileSystem()), ("general", WrappingFileSystem()))]
    try:
        _drive_alike(logs, rng)
    finally:
        for log in logs:
            log.close()
    assert _files(logs[0]) == _files(logs[1])


def _drive_alike(logs: list[Log], rng: random.Random) -> None:
    producer, now_ms = {"sequence": 0}, NOW_MS
    for _ in range(40):
        if rng.random() < 0.1:
            now_ms += rng.choice([10, 600, 2_000])
            if rng.random() < 0.5:
                for log in logs:
                    log.maybe_roll_by_time(now_ms)
        request = _request(rng, now_ms, producer)
        outcomes = [_outcome(log, bytearray(request), now_ms) for log in logs]
        assert outcomes[0] == outcomes[1]
    plain, general = logs
    assert [s.base_offset for s in plain.segments] == [s.base_offset for s in general.segments]
    assert plain.recovery_point == general.recovery_point
    assert read_all(plain) == read_all(general)
    assert_indexes_match_scan(plain)


def test_the_kernel_writes_plain_batches_and_the_wrapper_sees_every_other_write(scratch):
    fs = RealFileSystem()
    writes: list[int] = []
    real_write = fs.write
    fs.write = lambda fd, data: writes.append(len(data)) or real_write(fd, data)
    log = Log("t", 0, scratch / "t-0", LogConfig(), fs, NOW_MS, clean_shutdown=True)
    log.append(build_batch([b"plain"]), NOW_MS)
    assert len(writes) == 2  # the leader-epoch checkpoint for epoch 0, then the batch
    writes.clear()
    for _ in range(4):
        log.append(build_batch([b"plain"]), NOW_MS)
    assert writes == []  # the first append opened the single-batch path; the kernel writes
    idempotent = build_batch([b"a"], producer_id=3, producer_epoch=0, base_sequence=0)
    log.append(bytearray(idempotent), NOW_MS)
    assert log.append(bytearray(idempotent), NOW_MS).duplicate  # a retry: nothing written
    assert writes == []
    log.append(build_batch([b"a"]) + build_batch([b"b"]), NOW_MS)
    assert len(writes) == 1
    assert [offset for offset, _ in read_all(log)] == [0, 1, 2, 3, 4, 5, 6, 7]


@pytest.mark.parametrize("setting", [{"message_timestamp_type": "LogAppendTime"}])
def test_log_append_time_topics_never_take_the_plain_path(scratch, setting):
    log = Log("t", 0, scratch / "t-0", LogConfig(**setting), RealFileSystem(), NOW_MS,
              clean_shutdown=True)
    for _ in range(3):
        assert log.append(build_batch([b"a"]), NOW_MS + 5).log_append_time_ms == NOW_MS + 5
    assert log._single_batch_window is None
