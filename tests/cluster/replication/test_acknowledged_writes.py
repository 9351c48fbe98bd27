"""Acknowledged writes survive the loss of brokers (issue #19, items 2, 4 and 6): an RF=3 topic
with min.insync.replicas=2 whose leader is SIGKILLed while an idempotent acks=all producer
writes, a follower that was down for 64 MB of writes catching up and rejoining the ISR, and the
last replica standing (KIP-966's case) losing its unflushed writes to a power cut.

One three-broker cluster (each broker under the power-cut shim) serves the module; each test
has topics of its own, chooses the replicas, and leaves every broker running. Records are
named by a sequence number, so "in order" is their sort order.
"""

from __future__ import annotations

import uuid

import pytest

from tests.cluster.replication.replicated_cluster import (
    BROKER_IDS,
    AckedProducer,
    assert_acked_consumed_once_in_order,
    consume_at_least,
    consumer_of,
    numbered,
    read_all,
    wait_until,
)

CATCH_UP_BYTES = 64 * 1024 * 1024
CATCH_UP_RECORD_BYTES = 16 * 1024


@pytest.fixture(scope="module")
def module_cluster(replicated_cluster):
    return replicated_cluster()


@pytest.fixture
def cluster(module_cluster):
    yield module_cluster
    module_cluster.restore()


def new_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def test_a_leader_killed_during_an_acks_all_produce_loses_no_acknowledged_record(cluster):
    topic = new_topic("failover")
    cluster.create_topic(topic, BROKER_IDS, {"min.insync.replicas": "2"})
    before = cluster.wait_for_isr(topic, BROKER_IDS)
    leader = before.leader
    followers = [b for b in BROKER_IDS if b != leader]
    producer = AckedProducer(cluster.bootstrap, topic)
    consumer = consumer_of(cluster.bootstrap, topic)
    try:
        first = numbered(b"r", 0, 200)
        producer.send(first)
        producer.flush()
        assert consume_at_least(consumer, len(first), "the first records") == first

        # The next records reach only the leader (its followers are paused): acks=all must
        # not acknowledge them, and the SIGKILL comes while they wait.
        cluster.pause(followers)
        try:
            second = numbered(b"r", 200, 400)
            producer.send(second)
            wait_until(lambda: producer.producer.poll(0.05) is not None
                       and cluster.log_end_offset(leader, topic) >= 400,
                       "the leader to append the records its paused followers lack")
            acked_while_alone = len(producer.acked)
            cluster.kill(leader)
        finally:
            cluster.resume(followers)
        assert acked_while_alone == len(first)

        cluster.wait_for_leader(topic, followers, newer_than_epoch=before.leader_epoch)
        third = numbered(b"r", 400, 600)
        producer.send(third)
        producer.flush()
        assert producer.failed == []
        assert producer.acked == first + second + third

        carried_on = consume_at_least(consumer, len(second) + len(third),
                                      "the records after the kill")
        assert_acked_consumed_once_in_order(producer.acked, first + carried_on)
    finally:
        consumer.close()
    assert_acked_consumed_once_in_order(
        producer.acked, read_all(cluster.bootstrap, topic, len(producer.acked)))

    cluster.restart_after_expiry(leader)
    cluster.wait_for_isr(topic, BROKER_IDS)
    batches = cluster.wait_for_identical_replicas(topic, BROKER_IDS)
    assert batches[-1].last_offset + 1 == len(producer.acked)


def test_a_follower_down_for_64_mb_of_writes_catches_up_and_rejoins_the_isr(cluster):
    topic = new_topic("catch-up")
    cluster.create_topic(topic, BROKER_IDS, {"min.insync.replicas": "2"})
    leader = cluster.wait_for_isr(topic, BROKER_IDS).leader
    follower = next(b for b in BROKER_IDS if b != leader)
    cluster.kill(follower)
    cluster.wait_for_isr(topic, [b for b in BROKER_IDS if b != follower])

    count = CATCH_UP_BYTES // CATCH_UP_RECORD_BYTES
    producer = AckedProducer(cluster.bootstrap, topic, **{"linger.ms": 20})
    producer.send(numbered(b"c", 0, count, CATCH_UP_RECORD_BYTES))
    producer.flush()
    assert len(producer.acked) == count

    cluster.restart_after_expiry(follower)
    cluster.wait_for_isr(topic, BROKER_IDS)
    batches = cluster.wait_for_identical_replicas(topic, BROKER_IDS)
    assert batches[-1].last_offset + 1 == count


def test_the_last_replica_standing_keeps_what_it_acknowledged_through_a_power_cut(cluster):
    """KIP-966's case: the leader, alone in the ISR, acknowledges acks=all writes and loses
    power. It is the only replica that may be elected, so what it acknowledged must be on its
    disk (design decision 6: a sole ISR member advances the HW over fsynced records only, and
    flushes when it becomes one), or the returning leader would make its followers truncate
    acknowledged records."""
    topic = new_topic("last-standing")
    cluster.create_topic(topic, BROKER_IDS, {"min.insync.replicas": "1"})
    before = cluster.wait_for_isr(topic, BROKER_IDS)
    last = before.leader
    others = [b for b in BROKER_IDS if b != last]
    producer = AckedProducer(cluster.bootstrap, topic)
    producer.send(numbered(b"s", 0, 100))
    producer.flush()

    for broker_id in others:
        cluster.kill(broker_id)
    cluster.wait_for_isr(topic, [last])
    producer.send(numbered(b"s", 100, 300))
    producer.flush()
    assert len(producer.acked) == 300
    producer.producer.purge()

    cluster.power_cut(last)
    cluster.wait_for_unregistered(last)
    for broker_id in others:  # not in the ISR: they may not lead (unclean election is off)
        cluster.restart_after_expiry(broker_id)
    offline = cluster.state(topic)
    assert list(offline.isr) == [last] and offline.leader in (last, -1)
    cluster.restart_after_expiry(last)
    cluster.wait_for_leader(topic, [last], newer_than_epoch=before.leader_epoch)
    cluster.wait_for_isr(topic, BROKER_IDS)

    assert_acked_consumed_once_in_order(
        producer.acked, read_all(cluster.bootstrap, topic, len(producer.acked)))
    batches = cluster.wait_for_identical_replicas(topic, BROKER_IDS)
    assert batches[-1].last_offset + 1 == len(producer.acked)
