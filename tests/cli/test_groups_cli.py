"""``headrace groups`` against a real broker subprocess: list, describe with lag,
reset-offsets (dry run, execute, every strategy, an active group refused), delete."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import _start

PARTITIONS = 2
RECORDS_PER_PARTITION = 10
TIMEOUT_S = 30
POLL_LIMIT = 200


@pytest.fixture(scope="module")
def cli_broker(tmp_path_factory):
    process = _start(tmp_path_factory.mktemp("groups-cli"),
                     {"group.initial.rebalance.delay.ms": "0"})
    yield process
    process.stop()


def _headrace(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HEADRACE_BOOTSTRAP_SERVER": bootstrap}
    return subprocess.run([sys.executable, "-m", "headrace.cli.main", "groups", *args],
                          capture_output=True, text=True, env=env, timeout=TIMEOUT_S * 2)


def _json(bootstrap: str, *args: str) -> dict:
    result = _headrace(bootstrap, *args, "--output", "json")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _setup(bootstrap: str, committed: dict[int, int]) -> tuple[str, str]:
    topic = f"cli-{uuid.uuid4().hex[:8]}"
    group = f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(PARTITIONS):
        for _ in range(RECORDS_PER_PARTITION):
            producer.produce(topic, value=b"x", partition=partition)
    assert producer.flush(TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed.items()],
                        asynchronous=False)
    finally:
        consumer.close()
    return topic, group


def test_describe_shows_lag_and_list_shows_group(cli_broker):
    topic, group = _setup(cli_broker.bootstrap, {0: 3, 1: 10})
    described = _json(cli_broker.bootstrap, "describe", group)
    rows = {(r["topic"], r["partition"]): r for r in described["partitions"]}
    assert rows[(topic, 0)]["current_offset"] == 3
    assert rows[(topic, 0)]["log_end_offset"] == RECORDS_PER_PARTITION
    assert rows[(topic, 0)]["lag"] == 7
    assert rows[(topic, 1)]["lag"] == 0
    assert described["state"] == "EMPTY"
    listed = _json(cli_broker.bootstrap, "list")
    assert {"group": group, "state": "EMPTY", "simple": True} in listed["groups"]  # no protocol type
    table = _headrace(cli_broker.bootstrap, "describe", group)
    assert table.returncode == 0 and topic in table.stdout


def _committed_now(bootstrap: str, group: str) -> dict[int, int]:
    described = _json(bootstrap, "describe", group)
    return {r["partition"]: r["current_offset"] for r in described["partitions"]}


def test_reset_offsets_dry_run_then_execute(cli_broker):
    topic, group = _setup(cli_broker.bootstrap, {0: 3, 1: 5})
    plan = _json(cli_broker.bootstrap, "reset-offsets", group, "--topic", topic,
                 "--to-earliest", "--dry-run")
    assert [r["new_offset"] for r in plan["partitions"]] == [0, 0]
    assert plan["executed"] is False
    assert _committed_now(cli_broker.bootstrap, group) == {0: 3, 1: 5}

    done = _json(cli_broker.bootstrap, "reset-offsets", group, "--topic", topic,
                 "--shift-by", "-4", "--execute")
    assert [r["new_offset"] for r in done["partitions"]] == [0, 1]  # clamped at earliest
    assert _committed_now(cli_broker.bootstrap, group) == {0: 0, 1: 1}

    _json(cli_broker.bootstrap, "reset-offsets", group, "--topic", topic, "--to-offset", "99",
          "--execute")
    assert _committed_now(cli_broker.bootstrap, group) == {0: 10, 1: 10}  # clamped at latest
    _json(cli_broker.bootstrap, "reset-offsets", group, "--topic", topic,
          "--to-datetime", "2000-01-01T00:00:00Z", "--execute")
    assert _committed_now(cli_broker.bootstrap, group) == {0: 0, 1: 0}
    _json(cli_broker.bootstrap, "reset-offsets", group, "--topic", topic, "--to-latest",
          "--execute")
    assert _committed_now(cli_broker.bootstrap, group) == {0: 10, 1: 10}


def test_reset_offsets_refuses_an_active_group(cli_broker):
    topic, group = _setup(cli_broker.bootstrap, {0: 1})
    member = Consumer({"bootstrap.servers": cli_broker.bootstrap, "group.id": group,
                       "session.timeout.ms": 6000})
    member.subscribe([topic])
    try:
        for _ in range(POLL_LIMIT):
            member.poll(0.1)
            if member.assignment():
                break
        result = _headrace(cli_broker.bootstrap, "reset-offsets", group, "--topic", topic,
                           "--to-earliest", "--execute")
    finally:
        member.close()
    assert result.returncode == 1
    assert "inactive" in result.stderr and "STABLE" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_reset_offsets_needs_one_strategy(cli_broker):
    result = _headrace(cli_broker.bootstrap, "reset-offsets", "g", "--topic", "t",
                       "--to-earliest", "--to-latest")
    assert result.returncode == 1
    assert "exactly one" in result.stderr


def test_delete_group(cli_broker):
    _, group = _setup(cli_broker.bootstrap, {0: 2})
    deleted = _headrace(cli_broker.bootstrap, "delete", group, "--output", "json")
    assert deleted.returncode == 0 and json.loads(deleted.stdout) == {"deleted": group}
    again = _headrace(cli_broker.bootstrap, "delete", group)
    assert again.returncode == 1 and "GROUP_ID_NOT_FOUND" in again.stderr
    missing = _headrace(cli_broker.bootstrap, "describe", group)
    assert missing.returncode == 1 and "does not exist" in missing.stderr
