"""OffsetForLeaderEpoch (key 23) against a single-node broker process, with a raw client:
the node leads every partition at epoch 0 and stamps it into every batch, so epoch 0 ends at
the log end offset; the epoch checks, unknown partitions and the advertised versions. The
cluster's answers (followers, fenced leaders) are in tests/cluster/test_replica_fetcher.py."""

from __future__ import annotations

import time

import pytest

from headrace.protocol import records as record_codec
from tests.broker.raw_client import RawClient

PRODUCE, METADATA, API_VERSIONS, OFFSET_FOR_LEADER_EPOCH = 0, 3, 18, 23
UNKNOWN_TOPIC_OR_PARTITION, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 3, 74, 75
RECORDS = 7


def _create_and_fill(client: RawClient, topic: str, count: int) -> None:
    created = client.request(METADATA, 12, {"topics": [{"name": topic}],
                                            "allow_auto_topic_creation": True})
    assert created.topics[0].error_code == 0
    now_ms = int(time.time() * 1000)
    for n in range(count):
        batch = record_codec.build_batch([(b"k", b"v%d" % n, [], now_ms)])
        produced = client.request(PRODUCE, 9, {"acks": -1, "timeout": 30000, "topic_data": [
            {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
        assert produced.responses[0].partition_responses[0].error_code == 0


def _ask(client: RawClient, version: int, topic: str, partitions: list[tuple[int, int, int]],
         replica_id: int = -1) -> dict[int, tuple[int, int, int]]:
    """partition -> (error, leader_epoch, end_offset) for (partition, current, asked) rows."""
    body = {"topics": [{"topic": topic, "partitions": [
        {"partition": p, "current_leader_epoch": current, "leader_epoch": asked}
        for p, current, asked in partitions]}]}
    if version >= 3:
        body["replica_id"] = replica_id
    response = client.request(OFFSET_FOR_LEADER_EPOCH, version, body)
    [result] = response.topics
    assert result.topic == topic
    return {p.partition: (p.error_code, p.leader_epoch, p.end_offset) for p in result.partitions}


@pytest.mark.parametrize("version", [2, 3, 4])
def test_epoch_zero_ends_at_the_log_end(broker, version):
    topic = f"ofle-{version}"
    with RawClient(broker.bootstrap) as client:
        _create_and_fill(client, topic, RECORDS)
        assert _ask(client, version, topic, [(0, 0, 0)]) == {
            0: (0, 0, RECORDS)}
        assert _ask(client, version, topic, [(0, -1, 0)]) == {0: (0, 0, RECORDS)}
        # An epoch newer than any the log knows has no end: UNDEFINED, no error.
        assert _ask(client, version, topic, [(0, -1, 5)]) == {0: (0, -1, -1)}


def test_follower_replica_id_is_answered_as_a_consumer(broker):
    topic = "ofle-replica-id"
    with RawClient(broker.bootstrap) as client:
        _create_and_fill(client, topic, 3)
        for replica_id in (-1, -2, 1):
            assert _ask(client, 4, topic, [(0, 0, 0)], replica_id) == {0: (0, 0, 3)}


def test_current_leader_epoch_is_checked(broker):
    topic = "ofle-fencing"
    with RawClient(broker.bootstrap) as client:
        _create_and_fill(client, topic, 2)
        assert _ask(client, 4, topic, [(0, 1, 0)]) == {0: (UNKNOWN_LEADER_EPOCH, -1, -1)}
        assert _ask(client, 4, topic, [(0, -3, 0)]) == {0: (FENCED_LEADER_EPOCH, -1, -1)}


def test_unknown_partitions_and_topics(broker):
    topic = "ofle-unknown"
    with RawClient(broker.bootstrap) as client:
        _create_and_fill(client, topic, 1)
        assert _ask(client, 4, topic, [(0, -1, 0), (9, -1, 0)]) == {
            0: (0, 0, 1), 9: (UNKNOWN_TOPIC_OR_PARTITION, -1, -1)}
        assert _ask(client, 4, "ofle-no-such-topic", [(0, -1, 0)]) == {
            0: (UNKNOWN_TOPIC_OR_PARTITION, -1, -1)}


def test_versions_advertised_are_kafka_4s(broker):
    with RawClient(broker.bootstrap) as client:
        response = client.request(API_VERSIONS, 3, {"client_software_name": "t",
                                                    "client_software_version": "1"})
    [entry] = [k for k in response.api_keys if k.api_key == OFFSET_FOR_LEADER_EPOCH]
    assert (entry.min_version, entry.max_version) == (2, 4)
