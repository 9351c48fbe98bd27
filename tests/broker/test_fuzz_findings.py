"""Requests the wire fuzzer (tests/fuzz/) found a handler fault with, sent as raw frames to a
real broker process: each gets Kafka's error code on the wire, the connection stays open, and
the broker logs no handler traceback."""

from __future__ import annotations

import uuid

from headrace.protocol import wire
from tests.broker.raw_client import RawClient

FETCH, METADATA = 1, 3
UNKNOWN_TOPIC_ID, INVALID_REQUEST = 100, 42
ZERO_UUID = uuid.UUID(int=0)
HANDLER_TRACEBACK = "unexpected error handling a request"
# seed 33 case 764: Metadata v10 naming one topic by the zero id with a null name
METADATA_V10_NULL_NAME = bytes.fromhex(
    "000000260003000a00000001000466757a7a000200000000000000000000000000000000000001010100")


def _fetch_by_id(client: RawClient, version: int, topic_id: uuid.UUID):
    return client.request(FETCH, version, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1_000_000,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
        "forgotten_topics_data": [],
        "topics": [{"topic": "", "topic_id": topic_id, "partitions": [{
            "partition": 0, "fetch_offset": 0, "partition_max_bytes": 1_000_000,
            "current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}]}],
    })


def test_fetch_by_the_zero_topic_id_is_unknown_topic_id(broker):
    with RawClient(broker.bootstrap) as client:
        for version in (13, 16):
            response = _fetch_by_id(client, version, ZERO_UUID)
            assert response.error_code == 0
            topic = response.responses[0]
            assert (topic.topic_id or ZERO_UUID) == ZERO_UUID
            assert [p.error_code for p in topic.partitions] == [UNKNOWN_TOPIC_ID]
        unknown = uuid.uuid4()
        response = _fetch_by_id(client, 16, unknown)
        assert response.responses[0].topic_id == unknown
        assert response.responses[0].partitions[0].error_code == UNKNOWN_TOPIC_ID
    assert HANDLER_TRACEBACK not in broker.log_text()


def test_metadata_v10_with_a_null_name_is_invalid_request(broker):
    with RawClient(broker.bootstrap) as client:
        client.send_bytes(METADATA_V10_NULL_NAME)
        correlation_id, response = wire.decode_response(METADATA, 10, client.receive_frame())
        assert correlation_id == 1
        assert [(t.name, t.error_code) for t in response.topics] == [("", INVALID_REQUEST)]
        assert response.brokers == () or list(response.brokers) == []
        for version in (10, 11):  # an id is in the schema, but looked up only from v12
            response = client.request(METADATA, version, {
                "topics": [{"name": "named", "topic_id": uuid.uuid4()}],
                "allow_auto_topic_creation": False})
            assert [(t.name, t.error_code) for t in response.topics] == [
                ("named", INVALID_REQUEST)]
        for version in (12, 13):
            response = client.request(METADATA, version, {
                "topics": [{"name": None, "topic_id": ZERO_UUID}],
                "allow_auto_topic_creation": False})
            assert [(t.name, t.error_code) for t in response.topics] == [
                (None, UNKNOWN_TOPIC_ID)]
        assert client.request(METADATA, 10, {"topics": None}).brokers  # connection still open
    assert HANDLER_TRACEBACK not in broker.log_text()
