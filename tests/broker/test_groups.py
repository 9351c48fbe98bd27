"""Consumer groups end to end: real confluent-kafka, kafka-python and aiokafka consumers in
subprocesses against a real broker subprocess.

Each member runs ``MEMBER_SCRIPT`` and reports JSON lines on stdout: ``assign`` / ``revoke``
(its partitions), ``record`` (partition, offset) and ``commit`` (partition -> next offset,
after a successful synchronous commit). The tests read these reports to check that every
partition has exactly one owner once the group is stable, that a SIGKILLed member's
partitions move after the session timeout, that nothing is lost and that a record is only
consumed twice when it was not covered by a successful commit.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import _start

PARTITIONS = 6
SESSION_TIMEOUT_MS = 6000  # group.min.session.timeout.ms
WAIT_S = 60
GROUP_OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}

LOGGING_PREAMBLE = "import logging; logging.basicConfig(level=logging.INFO)\n"
MEMBER_SCRIPT = r'''
import asyncio, json, sys
library, bootstrap, group, topic = sys.argv[1:5]
SESSION_TIMEOUT_MS, HEARTBEAT_MS = 6000, 500

def report(event, **fields):
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()

def run_confluent():
    from confluent_kafka import Consumer
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": SESSION_TIMEOUT_MS,
                         "heartbeat.interval.ms": HEARTBEAT_MS,
                         "partition.assignment.strategy": "roundrobin"})
    consumer.subscribe([topic],
        on_assign=lambda c, ps: report("assign", partitions=[p.partition for p in ps]),
        on_revoke=lambda c, ps: report("revoke", partitions=[p.partition for p in ps]))
    while True:
        messages = consumer.consume(100, 0.2)
        done = {}
        for m in messages:
            if m.error() is None:
                report("record", p=m.partition(), o=m.offset())
                done[m.partition()] = m.offset() + 1
        if done:
            try:
                consumer.commit(asynchronous=False)
                report("commit", offsets=done)
            except Exception as error:
                report("commit_failed", error=str(error))

def run_kafka_python():
    from kafka import ConsumerRebalanceListener, KafkaConsumer, TopicPartition
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    from kafka.structs import OffsetAndMetadata
    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            report("revoke", partitions=[p.partition for p in revoked])
        def on_partitions_assigned(self, assigned):
            report("assign", partitions=[p.partition for p in assigned])
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                             auto_offset_reset="earliest", enable_auto_commit=False,
                             session_timeout_ms=SESSION_TIMEOUT_MS,
                             heartbeat_interval_ms=HEARTBEAT_MS,
                             partition_assignment_strategy=[RoundRobinPartitionAssignor])
    consumer.subscribe([topic], listener=Listener())
    while True:
        batches = consumer.poll(timeout_ms=200)
        done = {}
        for tp, records in batches.items():
            for r in records:
                report("record", p=r.partition, o=r.offset)
                done[r.partition] = r.offset + 1
        if done:
            try:
                consumer.commit({TopicPartition(topic, p): OffsetAndMetadata(o, "", -1)
                                 for p, o in done.items()})
                report("commit", offsets=done)
            except Exception as error:
                report("commit_failed", error=str(error))

async def run_aiokafka():
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.abc import ConsumerRebalanceListener
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor
    class Listener(ConsumerRebalanceListener):
        async def on_partitions_revoked(self, revoked):
            report("revoke", partitions=[p.partition for p in revoked])
        async def on_partitions_assigned(self, assigned):
            report("assign", partitions=[p.partition for p in assigned])
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group,
                                auto_offset_reset="earliest", enable_auto_commit=False,
                                session_timeout_ms=SESSION_TIMEOUT_MS,
                                heartbeat_interval_ms=HEARTBEAT_MS,
                                partition_assignment_strategy=(RoundRobinPartitionAssignor,))
    consumer.subscribe([topic], listener=Listener())
    await consumer.start()
    while True:
        batches = await consumer.getmany(timeout_ms=200)
        done = {}
        for tp, records in batches.items():
            for r in records:
                report("record", p=r.partition, o=r.offset)
                done[r.partition] = r.offset + 1
        if done:
            try:
                await consumer.commit({TopicPartition(topic, p): o for p, o in done.items()})
                report("commit", offsets=done)
            except Exception as error:
                report("commit_failed", error=str(error))

if library == "confluent":
    run_confluent()
elif library == "kafka-python":
    run_kafka_python()
else:
    asyncio.run(run_aiokafka())
'''


class Member:
    """One consumer subprocess and what it reported."""

    def __init__(self, library: str, group: Group) -> None:
        self.library = library
        board = group.board
        self.board = board
        self.assignment: set[int] = set()
        self.consumed: list[tuple[int, int]] = []
        self.committed: dict[int, int] = {}
        self.alive = True
        self.log_path = group.log_dir / f"member-{len(group.members)}-{library}.log"
        with open(self.log_path, "w") as log_file:
            self.process = subprocess.Popen(
                [sys.executable, "-c", LOGGING_PREAMBLE + MEMBER_SCRIPT, library,
                 group.bootstrap, group.name, group.topic],
                stdout=subprocess.PIPE, stderr=log_file, text=True)
        threading.Thread(target=self._read_reports, daemon=True).start()

    def _read_reports(self) -> None:
        for line in self.process.stdout:
            report = json.loads(line)
            with self.board:
                self._apply(report)
                self.board.notify_all()

    def _apply(self, report: dict) -> None:
        event = report["event"]
        if event == "assign":
            self.assignment |= set(report["partitions"])
        elif event == "revoke":
            self.assignment -= set(report["partitions"])
        elif event == "record":
            self.consumed.append((report["p"], report["o"]))
        elif event == "commit":
            for partition, offset in report["offsets"].items():
                self.committed[int(partition)] = offset

    def is_committed(self, partition: int, offset: int) -> bool:
        return self.committed.get(partition, 0) > offset

    def kill(self) -> None:
        self.process.kill()
        self.process.wait()
        with self.board:
            self.alive = False
            self.assignment = set()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class Group:
    def __init__(self, bootstrap: str, topic: str, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.bootstrap = bootstrap
        self.topic = topic
        self.name = f"group-{uuid.uuid4().hex[:8]}"
        self.board = threading.Condition()
        self.members: list[Member] = []

    def add(self, library: str) -> Member:
        member = Member(library, self)
        self.members.append(member)
        return member

    def live(self) -> list[Member]:
        return [m for m in self.members if m.alive]

    def wait_until(self, condition, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        with self.board:
            while not condition():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    state = [(m.library, sorted(m.assignment), len(m.consumed))
                             for m in self.members]
                    logs = "\n".join(m.log_path.read_text()[-3000:] for m in self.members)
                    pytest.fail(f"timed out waiting for {what}: {state}\n{logs}")
                self.board.wait(remaining)

    def owners_are_exclusive_and_complete(self) -> bool:
        live = self.live()
        if not live or any(not m.assignment for m in live):
            return False
        owned = [p for m in live for p in m.assignment]
        return len(owned) == len(set(owned)) and set(owned) == set(range(PARTITIONS))

    def all_committed(self, end_offsets: dict[int, int]) -> bool:
        committed: dict[int, int] = {}
        for member in self.members:
            for partition, offset in member.committed.items():
                committed[partition] = max(committed.get(partition, 0), offset)
        return all(committed.get(p, 0) >= end for p, end in end_offsets.items())

    def stop(self) -> None:
        for member in self.members:
            member.stop()


def _create_topic(bootstrap: str) -> str:
    name = f"groups-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, PARTITIONS, 1)])[name].result(WAIT_S)
    return name


def _produce(producer: Producer, topic: str, per_partition: int, ends: dict[int, int]) -> None:
    for partition in range(PARTITIONS):
        for _ in range(per_partition):
            producer.produce(topic, value=b"v", partition=partition)
        ends[partition] = ends.get(partition, 0) + per_partition
    assert producer.flush(WAIT_S) == 0


@pytest.fixture
def group_broker(tmp_path):
    process = _start(tmp_path, GROUP_OVERRIDES)
    yield process
    process.stop()


def test_mixed_client_group_survives_kill_and_join(group_broker, tmp_path):
    """confluent-kafka, kafka-python and aiokafka share one group (roundrobin) over six
    partitions; SIGKILLing one moves its partitions after the session timeout, a fourth
    member joins; nothing is lost and duplicates come only from uncommitted work."""
    topic = _create_topic(group_broker.bootstrap)
    producer = Producer({"bootstrap.servers": group_broker.bootstrap})
    ends: dict[int, int] = {}
    _produce(producer, topic, 50, ends)
    group = Group(group_broker.bootstrap, topic, tmp_path)
    try:
        for library in ("confluent", "kafka-python", "aiokafka"):
            group.add(library)
        group.wait_until(lambda: len(group.live()) == 3 and group.owners_are_exclusive_and_complete()
                         and all(len(m.assignment) == 2 for m in group.live()),
                         "three members with two partitions each")
        group.wait_until(lambda: group.all_committed(ends), "the first records committed")

        victim = group.members[1]
        victim.kill()  # no LeaveGroup: the coordinator notices after the session timeout
        _produce(producer, topic, 30, ends)
        group.wait_until(lambda: group.owners_are_exclusive_and_complete()
                         and group.all_committed(ends), "the victim's partitions to move")

        group.add("confluent")
        group.wait_until(lambda: len([m for m in group.live() if m.assignment]) == 3
                         and group.owners_are_exclusive_and_complete()
                         and group.members[-1].assignment, "the new member to get partitions")
        _produce(producer, topic, 30, ends)
        group.wait_until(lambda: group.all_committed(ends), "every record committed")
    finally:
        group.stop()

    consumed_by: dict[tuple[int, int], list[Member]] = {}
    for member in group.members:
        for record in member.consumed:
            consumed_by.setdefault(record, []).append(member)
    expected = {(p, o) for p, end in ends.items() for o in range(end)}
    assert expected - set(consumed_by) == set()
    for (partition, offset), members in consumed_by.items():
        if len(members) > 1:  # a duplicate: some consumer of it never committed past it
            assert any(not m.is_committed(partition, offset) for m in members), (partition, offset)
