"""Replica logs converge after double failovers (KIP-101, KIP-279), and consumers detect the
truncation an unclean election makes (KIP-320). A returning replica holding records of an old
leader epoch that the current leader never had truncates by leader epoch (OffsetForLeaderEpoch),
not to its high watermark, and follows the KIP-279 rule when the leader answers with an older
epoch than it asked for (truncate to the smaller of the leader's end offset and its own end
offset for that epoch). A librdkafka consumer positioned past the divergence goes back to it.

Every scenario needs a replica outside the ISR to be elected, so the module's cluster runs with
``unclean.leader.election.enable=true`` (Kafka's behaviour when turned on: a live replica is
elected when no ISR member is, and the records only the old leader had are lost; nothing else
may be, and the replicas must end with identical logs). Topics have two replicas on brokers
1 and 2 (broker 3 may be the controller), min.insync.replicas=1. The HW checkpoint is written
every 200 ms so a SIGKILLed broker comes back with the HW it had.
"""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition

from headrace.storage.leader_epoch_cache import (
    LEADER_EPOCH_CHECKPOINT,
    EpochEntry,
    decode_entries,
)
from tests.cluster.replication.replicated_cluster import (
    AckedProducer,
    checkpointed_high_watermark,
    consume_at_least,
    numbered,
    read_all,
    wait_until,
)

FIRST, SECOND = 1, 2
REPLICAS = (FIRST, SECOND)
TOPIC_CONFIGS = {"min.insync.replicas": "1", "unclean.leader.election.enable": "true"}


@pytest.fixture(scope="module")
def module_cluster(replicated_cluster):
    return replicated_cluster({"unclean.leader.election.enable": "true",
                               "replica.high.watermark.checkpoint.interval.ms": "200"})


@pytest.fixture
def cluster(module_cluster):
    yield module_cluster
    module_cluster.restore()


def new_topic(cluster, prefix: str) -> tuple[str, int]:
    """A topic on brokers 1 and 2, led by 1; its leader epoch."""
    topic = f"{prefix}-{uuid.uuid4().hex[:8]}"
    cluster.create_topic(topic, REPLICAS, TOPIC_CONFIGS)
    state = cluster.wait_for_isr(topic, REPLICAS)
    assert state.leader == FIRST
    return topic, state.leader_epoch


def produce(cluster, topic: str, values: list[bytes], acks: str = "all") -> None:
    """A producer of its own per phase: idempotent with acks=all, plain with acks=1."""
    settings = {} if acks == "all" else {"acks": acks, "enable.idempotence": False}
    producer = AckedProducer(cluster.bootstrap, topic, **settings)
    producer.send(values)
    producer.flush()
    assert producer.acked == values


def test_a_returning_leader_truncates_by_epoch_not_to_its_high_watermark(cluster):
    """KIP-101's divergence: broker 1, alone in the ISR, acknowledges records (its HW covers
    them) and dies; broker 2 is elected uncleanly without them and writes more at the same
    offsets. Back as a follower, broker 1 must truncate where epoch 1 ends on the leader, not
    at its HW (which would keep its records under the new leader's)."""
    topic, first_epoch = new_topic(cluster, "kip101")
    shared = numbered(b"shared", 0, 100)
    produce(cluster, topic, shared)

    cluster.kill(SECOND)
    cluster.wait_for_isr(topic, [FIRST])
    only_first = numbered(b"first", 0, 50)
    produce(cluster, topic, only_first)
    high_watermark = len(shared) + len(only_first)
    wait_until(lambda: checkpointed_high_watermark(cluster.brokers[FIRST].data_dir, topic)
               == high_watermark, "broker 1 to checkpoint the HW over its own records")
    cluster.kill(FIRST)
    cluster.wait_for_unregistered(FIRST)

    cluster.restart_after_expiry(SECOND)
    cluster.wait_for_leader(topic, [SECOND], newer_than_epoch=first_epoch)
    only_second = numbered(b"second", 0, 80)  # more than broker 1 has past the shared part
    produce(cluster, topic, only_second)

    cluster.restart_after_expiry(FIRST)
    cluster.wait_for_isr(topic, REPLICAS)
    cluster.wait_for_identical_replicas(topic, REPLICAS)
    assert read_all(cluster.bootstrap, topic, len(shared) + len(only_second)) \
        == shared + only_second


def test_a_follower_asking_for_an_epoch_the_leader_never_had_truncates_to_its_own_end(cluster):
    """KIP-279's double failover: broker 1 (epoch 1), alone in the ISR, appends records broker
    2 never fetched and dies; broker 2 is elected (epoch 2), appends as many other records at
    the same offsets and dies; broker 1 returns and is elected again (epoch 3). Broker 2, back
    as a follower, asks for the end of epoch 2: the leader never had it and answers epoch 1,
    ending where epoch 3 starts, past the divergence. Broker 2 must truncate to its own end of
    epoch 1 (the smaller offset, KIP-279's rule; KIP-101's alone would keep its epoch 2
    records) and fetch broker 1's records, ending identical."""
    topic, first_epoch = new_topic(cluster, "kip279")
    shared = numbered(b"shared", 0, 100)
    produce(cluster, topic, shared)

    cluster.kill(SECOND)
    cluster.wait_for_isr(topic, [FIRST])
    epoch_one = numbered(b"epoch1", 0, 40)
    produce(cluster, topic, epoch_one)
    cluster.kill(FIRST)
    cluster.wait_for_unregistered(FIRST)

    cluster.restart_after_expiry(SECOND)
    second_epoch = cluster.wait_for_leader(topic, [SECOND], newer_than_epoch=first_epoch)
    produce(cluster, topic, numbered(b"epoch2", 0, len(epoch_one)))
    cluster.kill(SECOND)
    cluster.wait_for_unregistered(SECOND)

    cluster.restart_after_expiry(FIRST)
    cluster.wait_for_leader(topic, [FIRST], newer_than_epoch=second_epoch.leader_epoch)
    epoch_three = numbered(b"epoch3", 0, 20)
    produce(cluster, topic, epoch_three)

    cluster.restart_after_expiry(SECOND)
    cluster.wait_for_isr(topic, REPLICAS)
    batches = cluster.wait_for_identical_replicas(topic, REPLICAS)
    assert second_epoch.leader_epoch not in {b.leader_epoch for b in batches}
    expected = shared + epoch_one + epoch_three
    assert read_all(cluster.bootstrap, topic, len(expected)) == expected


def epoch_entries(cluster, broker_id: int, topic: str) -> tuple[EpochEntry, ...]:
    path = cluster.partition_dir(broker_id, topic) / LEADER_EPOCH_CHECKPOINT
    return decode_entries(path.read_bytes(), path.name) if path.exists() else ()


def test_a_consumer_past_the_new_leaders_end_detects_the_truncation(cluster):
    """KIP-320 with librdkafka: a consumer positioned after records only broker 1 had
    (acknowledged while it was alone in the ISR; position 150 in broker 1's leader epoch)
    meets broker 2, elected uncleanly without them and since then written at the same
    offsets. Validating its position with OffsetForLeaderEpoch, it learns the log diverged at
    100 and reads every record broker 2 wrote from there; without KIP-320 it would fetch from
    150 and skip the first 50 of them silently."""
    topic, first_epoch = new_topic(cluster, "kip320")
    shared = numbered(b"shared", 0, 100)
    produce(cluster, topic, shared)
    cluster.kill(SECOND)
    cluster.wait_for_isr(topic, [FIRST])
    only_first = numbered(b"first", 0, 50)
    produce(cluster, topic, only_first)
    position_epoch = cluster.state(topic).leader_epoch

    cluster.kill(FIRST)
    cluster.wait_for_unregistered(FIRST)
    cluster.restart_after_expiry(SECOND)
    cluster.wait_for_leader(topic, [SECOND], newer_than_epoch=first_epoch)
    # Elected, before any append of its own, broker 2 records its epoch at its log end (as
    # Kafka's makeLeader): the consumer's question about position_epoch, which broker 2 never
    # saw, is answered with the divergence at 100, not with an undefined epoch that
    # librdkafka would meet with auto.offset.reset.
    new_epoch = cluster.state(topic).leader_epoch
    wait_until(lambda: EpochEntry(new_epoch, len(shared)) in epoch_entries(cluster, SECOND, topic),
               "broker 2 to record its leader epoch at election")
    only_second = numbered(b"second", 0, 80)
    produce(cluster, topic, only_second)

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": topic,
                         "enable.auto.commit": False, "auto.offset.reset": "latest"})
    consumer.assign([TopicPartition(topic, 0, len(shared) + len(only_first),
                                    leader_epoch=position_epoch)])
    try:
        values = consume_at_least(consumer, len(only_second), "the new leader's records")
    finally:
        consumer.close()
    assert values == only_second
