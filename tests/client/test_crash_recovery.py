"""At-least-once across SIGKILL and rebalances: real child processes against a real broker.

Each seeded run SIGKILLs a consuming child once it has processed a random number of records (its
lines in the processed file, fewer than half of those left: a consumer in flight, never an idle
one) while its handlers run with random durations and random failures, then lets a last child drain
the topic. After every kill, every offset below the group's committed offset must be in the
processed file (no commit skips an unprocessed record); at the end every record must have been
processed at least once. The
metadata test checks the restart skip: records done above a stuck one travel in the commit's
metadata, and after a SIGKILL the next owner processes exactly the stuck record.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.client.done_offsets import decode_done_offsets

from .conftest import (
    GROUP_SESSION_TIMEOUT_MS,
    SCRATCH_DIR,
    committed_offsets,
    consumer_config,
    create_topic,
    produce_records,
)

CHILD = Path(__file__).with_name("consumer_child.py")
CRASH_RUNS = 50
CRASH_RUNS_IN_PARALLEL = 5
PARTITIONS = 3
RECORDS_PER_RUN = 300
KILLS_PER_RUN = 2
DRAIN_TIMEOUT_S = 60.0
FILE_POLL_INTERVAL_S = 0.05
COMMIT_POLL_INTERVAL_S = 0.2


def _spawn(bootstrap: str, topic: str, group: str, processed: Path, seed: int,
           *extra_args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(CHILD), "--bootstrap", bootstrap, "--topic", topic, "--group", group,
         "--processed", str(processed), "--seed", str(seed),
         "--session-timeout-ms", str(GROUP_SESSION_TIMEOUT_MS), *extra_args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def _processed(path: Path) -> set[tuple[int, int]]:
    """(partition, offset) pairs in complete lines of the processed file."""
    if not path.exists():
        return set()
    text = path.read_text()
    lines = text.split("\n")[:-1]  # a SIGKILL may leave a partial last line
    return {(int(partition), int(offset)) for partition, offset, _ in map(str.split, lines)}


def _everything(records_per_partition: dict[int, int]) -> set[tuple[int, int]]:
    return {(p, o) for p, count in records_per_partition.items() for o in range(count)}


def _skipped_records(bootstrap, group, topic, processed_path) -> list[tuple[int, int]]:
    committed = committed_offsets(bootstrap, group, topic, PARTITIONS)
    processed = _processed(processed_path)
    return [(p, o) for p, offset in committed.items() for o in range(max(offset, 0))
            if (p, o) not in processed]


def _pids(path: Path) -> set[str]:
    return {line.split()[2] for line in path.read_text().splitlines()} if path.exists() else set()


def _wait_all_processed(path: Path, expected: set[tuple[int, int]], child) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while not expected <= _processed(path):
        assert child.poll() is None, child.stderr.read().decode()
        assert time.monotonic() < deadline, f"missing {sorted(expected - _processed(path))[:10]}"
        time.sleep(FILE_POLL_INTERVAL_S)


def _lines_of(path: Path, pid: int) -> int:
    if not path.exists():
        return 0
    return sum(line.split()[2:3] == [str(pid)] for line in path.read_text().splitlines())


def _wait_child_processed(path: Path, child: subprocess.Popen, lines: int) -> None:
    """Until ``child`` has processed ``lines`` records (its own lines in the processed file):
    the SIGKILL then lands on a consumer in the middle of the topic, never on an idle one."""
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while _lines_of(path, child.pid) < lines:
        assert child.poll() is None, child.stderr.read().decode()
        assert time.monotonic() < deadline, f"child {child.pid} processed < {lines} records"
        time.sleep(FILE_POLL_INTERVAL_S)


def _wait_committed(bootstrap, group, topic, expected: dict[int, int], child) -> None:
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while (committed := committed_offsets(bootstrap, group, topic, len(expected))) != expected:
        assert child.poll() is None, child.stderr.read().decode()
        if time.monotonic() >= deadline:
            child.kill()
            _, stderr = child.communicate()
            tail = stderr.decode(errors="replace")[-2000:]
            raise AssertionError(f"committed {committed}, expected {expected}; child: {tail}")
        time.sleep(COMMIT_POLL_INTERVAL_S)


def _stop(child: subprocess.Popen) -> None:
    """SIGTERM once the child has installed its handler ("started"); expect a clean exit."""
    assert child.stdout.readline() == b"started\n", child.stderr.read().decode()
    child.send_signal(signal.SIGTERM)
    _, stderr = child.communicate(timeout=60)
    assert child.returncode == 0, stderr.decode()


def _crash_run(bootstrap: str, seed: int) -> list[str]:
    """One seeded run; returns the violations found (empty when correct)."""
    rng = random.Random(seed)
    topic = create_topic(bootstrap, PARTITIONS, prefix=f"crash{seed}")
    group = f"{topic}-group"
    produce_records(bootstrap, topic, RECORDS_PER_RUN, PARTITIONS)
    expected = _everything({p: RECORDS_PER_RUN // PARTITIONS for p in range(PARTITIONS)})
    processed_path = SCRATCH_DIR / f"{topic}.processed"
    violations = []
    for kill in range(KILLS_PER_RUN):
        child = _spawn(bootstrap, topic, group, processed_path, seed * 100 + kill)
        unprocessed = len(expected - _processed(processed_path))
        kill_after_lines = rng.randint(1, max(1, unprocessed // 2))
        _wait_child_processed(processed_path, child, kill_after_lines)
        child.kill()
        child.communicate()
        if expected <= _processed(processed_path):
            violations.append(f"seed {seed} kill {kill}: the child had finished, not in flight")
        skipped = _skipped_records(bootstrap, group, topic, processed_path)
        if skipped:
            violations.append(f"seed {seed} kill {kill}: committed past unprocessed {skipped[:5]}")
    end_offsets = {p: RECORDS_PER_RUN // PARTITIONS for p in range(PARTITIONS)}
    last = _spawn(bootstrap, topic, group, processed_path, seed * 100 + KILLS_PER_RUN)
    _wait_committed(bootstrap, group, topic, end_offsets, last)
    _stop(last)
    lost = expected - _processed(processed_path)
    if lost:
        violations.append(f"seed {seed}: lost {sorted(lost)[:5]}")
    if not violations:
        processed_path.unlink()
    return violations


def test_sigkill_at_random_moments_loses_nothing(bootstrap):
    SCRATCH_DIR.mkdir(parents=True, exist_ok=True)
    with ThreadPoolExecutor(CRASH_RUNS_IN_PARALLEL) as pool:
        results = list(pool.map(lambda seed: _crash_run(bootstrap, seed), range(CRASH_RUNS)))
    violations = [violation for run in results for violation in run]
    assert violations == []


@pytest.mark.parametrize("assignment_strategy", ["range,roundrobin", "cooperative-sticky"])
def test_three_processes_rebalancing_lose_nothing(bootstrap, assignment_strategy):
    partitions, records = 6, 600
    topic = create_topic(bootstrap, partitions, prefix="rebalance")
    group = f"{topic}-group"
    produce_records(bootstrap, topic, records, partitions)
    processed_path = SCRATCH_DIR / f"{topic}.processed"
    expected = _everything({p: records // partitions for p in range(partitions)})
    children = [_spawn(bootstrap, topic, group, processed_path, seed, "--ordering", "partition",
                       "--max-handler-ms", "40", "--assignment-strategy", assignment_strategy)
                for seed in range(3)]
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while len(_pids(processed_path)) < 3:  # all three members own partitions and work
        assert time.monotonic() < deadline, f"only {_pids(processed_path)} ever processed"
        time.sleep(FILE_POLL_INTERVAL_S)
    children[0].kill()  # a crashed member: its partitions move when its session expires
    children[0].communicate()
    _stop(children[1])  # a member leaving cleanly mid-stream: revoke, commit, release
    _wait_committed(bootstrap, group, topic, {p: records // partitions for p in range(partitions)},
                    children[2])
    _stop(children[2])
    assert _processed(processed_path) >= expected
    assert committed_offsets(bootstrap, group, topic, partitions) == {
        p: records // partitions for p in range(partitions)}
    processed_path.unlink()


def _committed_with_metadata(bootstrap: str, group: str, topic: str) -> tuple[int, str]:
    consumer = Consumer(consumer_config(bootstrap, group))
    try:
        (committed,) = consumer.committed([TopicPartition(topic, 0)], 30)
        return committed.offset, committed.metadata or ""
    finally:
        consumer.close()


@pytest.mark.skipif(os.environ.get("HEADRACE_TEST_PEER") == "tansu",
                    reason="Tansu drops offset commit metadata")
def test_restart_skips_exactly_the_records_done_above_the_committed_offset(bootstrap):
    records, stuck_offset = 40, 7
    topic = create_topic(bootstrap, 1, prefix="metaskip")
    group = f"{topic}-group"
    produce_records(bootstrap, topic, records, 1)
    processed_path = SCRATCH_DIR / f"{topic}.processed"
    done_above = set(range(stuck_offset + 1, records))
    first = _spawn(bootstrap, topic, group, processed_path, 1, "--hang-at-offset",
                   str(stuck_offset), "--max-run-records", "1", "--failure-rate", "0")
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while True:  # everything but the stuck record done, and its commit carries the rest
        committed, metadata = _committed_with_metadata(bootstrap, group, topic)
        if committed == stuck_offset and decode_done_offsets(committed, metadata) == done_above:
            break
        assert first.poll() is None, first.stderr.read().decode()
        assert time.monotonic() < deadline, f"committed {committed}, metadata {metadata!r}"
        time.sleep(COMMIT_POLL_INTERVAL_S)
    first.kill()
    first.communicate()
    first_processed = _processed(processed_path)
    assert first_processed == {(0, offset) for offset in range(records) if offset != stuck_offset}

    second = _spawn(bootstrap, topic, group, processed_path, 2, "--failure-rate", "0")
    _wait_committed(bootstrap, group, topic, {0: records}, second)
    _stop(second)
    second_pid = str(second.pid)
    second_processed = {(int(p), int(o)) for p, o, pid in map(str.split, processed_path
                        .read_text().splitlines()) if pid == second_pid}
    assert second_processed == {(0, stuck_offset)}
    processed_path.unlink()
