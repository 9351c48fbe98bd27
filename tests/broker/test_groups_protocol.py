"""OffsetCommit / OffsetFetch over raw wire requests against a broker process: the newest
versions (v10, topics by id), ApiVersions advertising them, and commits the broker refuses
for real: metadata over offset.metadata.max.bytes (OFFSET_METADATA_TOO_LARGE) and a commit
whose batch exceeds the offsets topic's max.message.bytes (INVALID_COMMIT_OFFSET_SIZE, the
cache left unchanged)."""

from __future__ import annotations

import uuid

from headrace import errors
from tests.broker.raw_client import RawClient

METADATA, OFFSET_COMMIT, OFFSET_FETCH, API_VERSIONS, CREATE_TOPICS = 3, 8, 9, 18, 19
OFFSET_METADATA_MAX_BYTES = 4096  # Kafka's default offset.metadata.max.bytes
OFFSETS_TOPIC_MAX_MESSAGE_BYTES = 1048588  # Kafka's default max.message.bytes


def _new_topic(client: RawClient, partitions: int = 2) -> tuple[str, uuid.UUID]:
    """A topic with ``partitions`` partitions: a commit to a partition it lacks is refused."""
    topic = f"commits-{uuid.uuid4().hex[:8]}"
    created = client.request(CREATE_TOPICS, 7, {"topics": [{
        "name": topic, "num_partitions": partitions, "replication_factor": 1,
        "assignments": [], "configs": []}], "timeout_ms": 10_000})
    assert created.topics[0].error_code == 0, created
    return topic, created.topics[0].topic_id


def _commit(client: RawClient, version: int, group: str, topics: list[dict]):
    return client.request(OFFSET_COMMIT, version, {
        "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
        "topics": topics})


def _fetch_v10(client: RawClient, group: str, topics: list[dict] | None):
    body = client.request(OFFSET_FETCH, 10, {"groups": [{"group_id": group, "topics": topics}]})
    assert len(body.groups) == 1 and body.groups[0].error_code == 0, body
    return body.groups[0].topics


def _fetch_by_name(client: RawClient, group: str, topic: str, partitions: list[int]):
    body = client.request(OFFSET_FETCH, 9, {"groups": [{
        "group_id": group, "topics": [{"name": topic, "partition_indexes": partitions}]}]})
    assert body.groups[0].error_code == 0, body
    return {p.partition_index: (p.committed_offset, p.metadata, p.error_code)
            for p in body.groups[0].topics[0].partitions}


def test_api_versions_advertises_offset_commit_and_fetch_v10(broker):
    with RawClient(broker.bootstrap) as client:
        body = client.request(API_VERSIONS, 3, {"client_software_name": "t",
                                                "client_software_version": "1"})
    ranges = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert ranges[OFFSET_COMMIT] == (0, 10)
    assert ranges[OFFSET_FETCH] == (0, 10)


def test_commit_and_fetch_by_topic_id_at_v10(broker):
    group = f"v10-{uuid.uuid4().hex[:8]}"
    unknown_id = uuid.uuid4()
    with RawClient(broker.bootstrap) as client:
        topic, topic_id = _new_topic(client)
        body = _commit(client, 10, group, [
            {"topic_id": topic_id, "partitions": [
                {"partition_index": 0, "committed_offset": 42, "committed_leader_epoch": 3,
                 "committed_metadata": "by-id"}]},
            {"topic_id": unknown_id, "partitions": [
                {"partition_index": 0, "committed_offset": 1, "committed_metadata": ""}]},
        ])
        assert [(t.topic_id, [(p.partition_index, p.error_code) for p in t.partitions])
                for t in body.topics] == [(topic_id, [(0, 0)]),
                                          (unknown_id, [(0, errors.UnknownTopicId.code)])]
        requested = _fetch_v10(client, group, [
            {"topic_id": topic_id, "partition_indexes": [0, 1]},
            {"topic_id": unknown_id, "partition_indexes": [0]}])
        everything = _fetch_v10(client, group, None)
        by_name = _fetch_by_name(client, group, topic, [0])
    assert [(t.topic_id, [(p.partition_index, p.committed_offset, p.committed_leader_epoch,
                           p.metadata, p.error_code) for p in t.partitions])
            for t in requested] == [
        (topic_id, [(0, 42, 3, "by-id", 0), (1, -1, -1, "", 0)]),
        (unknown_id, [(0, -1, -1, "", errors.UnknownTopicId.code)])]
    assert [(t.topic_id, [p.committed_offset for p in t.partitions])
            for t in everything] == [(topic_id, [42])]
    assert by_name == {0: (42, "by-id", 0)}


def test_metadata_over_the_limit_is_refused_for_that_partition_only(broker):
    group = f"meta-{uuid.uuid4().hex[:8]}"
    with RawClient(broker.bootstrap) as client:
        topic, _ = _new_topic(client)
        body = _commit(client, 9, group, [{"name": topic, "partitions": [
            {"partition_index": 0, "committed_offset": 7,
             "committed_metadata": "m" * OFFSET_METADATA_MAX_BYTES},
            {"partition_index": 1, "committed_offset": 8,
             "committed_metadata": "m" * (OFFSET_METADATA_MAX_BYTES + 1)}]}])
        fetched = _fetch_by_name(client, group, topic, [0, 1])
    assert {p.partition_index: p.error_code for p in body.topics[0].partitions} == {
        0: 0, 1: errors.OffsetMetadataTooLarge.code}
    assert fetched == {0: (7, "m" * OFFSET_METADATA_MAX_BYTES, 0), 1: (-1, "", 0)}


def test_commit_larger_than_the_offsets_topic_batch_limit_is_invalid_commit_offset_size(broker):
    group = f"huge-{uuid.uuid4().hex[:8]}"
    partitions = OFFSETS_TOPIC_MAX_MESSAGE_BYTES // OFFSET_METADATA_MAX_BYTES + 10
    metadata = "x" * OFFSET_METADATA_MAX_BYTES
    with RawClient(broker.bootstrap) as client:
        topic, _ = _new_topic(client, partitions)
        first = _commit(client, 9, group, [{"name": topic, "partitions": [
            {"partition_index": 0, "committed_offset": 5, "committed_metadata": "small"}]}])
        assert first.topics[0].partitions[0].error_code == 0
        body = _commit(client, 9, group, [{"name": topic, "partitions": [
            {"partition_index": index, "committed_offset": 100 + index,
             "committed_metadata": metadata} for index in range(partitions)]}])
        fetched = _fetch_by_name(client, group, topic, [0, 1, partitions - 1])
    codes = {p.error_code for p in body.topics[0].partitions}
    assert codes == {errors.InvalidCommitOffsetSize.code}
    assert fetched == {0: (5, "small", 0), 1: (-1, "", 0), partitions - 1: (-1, "", 0)}
