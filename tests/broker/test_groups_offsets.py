"""Committed offsets across broker restarts (clean and SIGKILL), commits without membership
(assign()), metadata strings, cooperative-sticky rebalancing with confluent-kafka, and the
admin calls (list, describe, delete groups, delete offsets) with Kafka's error codes."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer as KafkaConsumer
from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import _start

PARTITIONS = 4
RECORDS_PER_PARTITION = 20
TIMEOUT_S = 30
POLL_LIMIT = 400
OVERRIDES = {"group.initial.rebalance.delay.ms": "0"}


@pytest.fixture
def group_broker(tmp_path):
    process = _start(tmp_path, OVERRIDES)
    yield process
    process.stop()


def _topic_with_records(bootstrap: str) -> str:
    topic = f"offsets-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(TIMEOUT_S)
    producer = Producer({"bootstrap.servers": bootstrap})
    for partition in range(PARTITIONS):
        for i in range(RECORDS_PER_PARTITION):
            producer.produce(topic, value=f"{partition}-{i}".encode(), partition=partition)
    assert producer.flush(TIMEOUT_S) == 0
    return topic


def _consumer(bootstrap: str, group: str, **extra) -> KafkaConsumer:
    return KafkaConsumer({"bootstrap.servers": bootstrap, "group.id": group,
                          "auto.offset.reset": "earliest", "enable.auto.commit": False,
                          "session.timeout.ms": 6000, **extra})


def _committed(bootstrap: str, group: str, topic: str) -> dict[int, tuple[int, str | None]]:
    consumer = _consumer(bootstrap, group)
    try:
        found = consumer.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                   timeout=TIMEOUT_S)
    finally:
        consumer.close()
    return {tp.partition: (tp.offset, tp.metadata) for tp in found}


def _commit_assigned(bootstrap: str, group: str, topic: str, offsets: dict[int, int]) -> None:
    """A consumer that uses assign() (no group membership) commits with metadata."""
    consumer = _consumer(bootstrap, group)
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o, metadata=f"meta-{p}")
                                 for p, o in offsets.items()], asynchronous=False)
    finally:
        consumer.close()


@pytest.mark.parametrize("how", ["restart", "sigkill"])
def test_commits_survive_broker_restart(group_broker, how):
    topic = _topic_with_records(group_broker.bootstrap)
    group = f"g-{uuid.uuid4().hex[:8]}"
    wanted = {0: 5, 1: 0, 2: 17, 3: RECORDS_PER_PARTITION}
    _commit_assigned(group_broker.bootstrap, group, topic, wanted)
    assert _committed(group_broker.bootstrap, group, topic) == {
        p: (o, f"meta-{p}") for p, o in wanted.items()}

    if how == "sigkill":
        group_broker.kill()
        group_broker.start()
    else:
        group_broker.restart()

    assert _committed(group_broker.bootstrap, group, topic) == {
        p: (o, f"meta-{p}") for p, o in wanted.items()}
    consumer = _consumer(group_broker.bootstrap, group)
    consumer.subscribe([topic])
    seen: dict[int, list[int]] = {}
    try:
        remaining = sum(RECORDS_PER_PARTITION - o for o in wanted.values())
        for _ in range(POLL_LIMIT):
            if remaining == 0:
                break
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                seen.setdefault(message.partition(), []).append(message.offset())
                remaining -= 1
    finally:
        consumer.close()
    for partition, offset in wanted.items():
        assert seen.get(partition, []) == list(range(offset, RECORDS_PER_PARTITION))


def test_group_member_commit_survives_sigkill_and_resumes(group_broker):
    """A subscribed member commits half its records; after a SIGKILL of the broker a new
    member of the same group resumes exactly after the commit."""
    topic = _topic_with_records(group_broker.bootstrap)
    group = f"g-{uuid.uuid4().hex[:8]}"
    consumer = _consumer(group_broker.bootstrap, group)
    consumer.subscribe([topic])
    half = RECORDS_PER_PARTITION // 2
    consumed = 0
    try:
        for _ in range(POLL_LIMIT):
            message = consumer.poll(0.5)
            if message is None or message.error() is not None or message.offset() >= half:
                if consumed == PARTITIONS * half:
                    break
                continue
            consumed += 1
            consumer.commit(message=message, asynchronous=False)
    finally:
        consumer.close()
    assert consumed == PARTITIONS * half

    group_broker.kill()
    group_broker.start()
    assert {p: o for p, (o, _) in _committed(group_broker.bootstrap, group, topic).items()} == {
        p: half for p in range(PARTITIONS)}


def _poll_all(consumers, rounds: int) -> None:
    for _ in range(rounds):
        for consumer in consumers:
            consumer.poll(0.05)


def test_cooperative_sticky_rebalances_incrementally(group_broker):
    topic = _topic_with_records(group_broker.bootstrap)
    group = f"g-{uuid.uuid4().hex[:8]}"
    events: dict[str, list[tuple[str, set[int]]]] = {"a": [], "b": []}
    owned: dict[str, set[int]] = {"a": set(), "b": set()}

    def listeners(name):
        def on_assign(consumer, partitions):
            events[name].append(("assign", {p.partition for p in partitions}))
            owned[name] |= {p.partition for p in partitions}

        def on_revoke(consumer, partitions):
            events[name].append(("revoke", {p.partition for p in partitions}))
            owned[name] -= {p.partition for p in partitions}
        return {"on_assign": on_assign, "on_revoke": on_revoke}

    strategy = {"partition.assignment.strategy": "cooperative-sticky"}
    first = _consumer(group_broker.bootstrap, group, **strategy)
    first.subscribe([topic], **listeners("a"))
    second = _consumer(group_broker.bootstrap, group, **strategy)
    try:
        for _ in range(POLL_LIMIT):
            _poll_all([first], 1)
            if owned["a"] == set(range(PARTITIONS)):
                break
        assert owned["a"] == set(range(PARTITIONS))

        second.subscribe([topic], **listeners("b"))
        for _ in range(POLL_LIMIT):
            _poll_all([first, second], 1)
            if owned["b"] and len(owned["a"]) + len(owned["b"]) == PARTITIONS:
                break
        assert owned["a"] | owned["b"] == set(range(PARTITIONS))
        assert not owned["a"] & owned["b"]
        assert len(owned["a"]) == len(owned["b"]) == PARTITIONS // 2
        # incremental: the first member never gave up the partitions it kept
        revoked = set().union(*(ps for kind, ps in events["a"] if kind == "revoke"))
        assert revoked == set(range(PARTITIONS)) - owned["a"]
        assert first.assignment() and {tp.partition for tp in first.assignment()} == owned["a"]
    finally:
        first.close()
        second.close()


def test_admin_list_describe_delete(group_broker):
    bootstrap = group_broker.bootstrap
    topic = _topic_with_records(bootstrap)
    group = f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    member = _consumer(bootstrap, group)
    member.subscribe([topic])
    try:
        for _ in range(POLL_LIMIT):
            member.poll(0.1)
            if member.assignment():
                break
        listed = {g.group_id: g for g in admin.list_consumer_groups().result(TIMEOUT_S).valid}
        assert listed[group].state.name == "STABLE"
        description = admin.describe_consumer_groups([group])[group].result(TIMEOUT_S)
        assert len(description.members) == 1
        assert {tp.partition for tp in description.members[0].assignment.topic_partitions} == set(
            range(PARTITIONS))
        member.commit(offsets=[TopicPartition(topic, 0, 3)], asynchronous=False)
        with pytest.raises(KafkaException) as raised:
            admin.delete_consumer_groups([group])[group].result(TIMEOUT_S)
        assert raised.value.args[0].name() == "NON_EMPTY_GROUP"
    finally:
        member.close()

    done = admin.delete_consumer_groups([group])[group].result(TIMEOUT_S)
    assert done is None
    assert _committed(bootstrap, group, topic)[0][0] < 0
    with pytest.raises(KafkaException) as raised:
        admin.delete_consumer_groups([group])[group].result(TIMEOUT_S)
    assert raised.value.args[0].name() == "GROUP_ID_NOT_FOUND"


def test_alter_offsets_of_empty_group(group_broker):
    bootstrap = group_broker.bootstrap
    topic = _topic_with_records(bootstrap)
    group = f"g-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 1, 7)])
    admin.alter_consumer_group_offsets([request])[group].result(TIMEOUT_S)
    fetched = admin.list_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 1)])])[group].result(TIMEOUT_S)
    assert [(tp.partition, tp.offset) for tp in fetched.topic_partitions] == [(1, 7)]
