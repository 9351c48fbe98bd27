"""Static membership (KIP-345) against a broker process, over raw wire requests: a static
member that rejoins a Stable group is answered only after the group record carrying its new
member id is appended to ``__consumer_offsets``. The append is made to fail for real, with
no double: the rejoin's protocol metadata (opaque to the coordinator) makes the group record
larger than the offsets topic's max.message.bytes. The old member id then keeps its place."""

from __future__ import annotations

import uuid

import pytest

from headrace import errors
from tests.broker.raw_client import RawClient
from tests.conftest import _start

JOIN_GROUP, HEARTBEAT, SYNC_GROUP = 11, 12, 14
JOIN_VERSION, HEARTBEAT_VERSION, SYNC_VERSION = 9, 4, 5
OFFSETS_TOPIC_MAX_MESSAGE_BYTES = 1048588  # Kafka's default max.message.bytes
SESSION_TIMEOUT_MS = 10_000
INSTANCE = "static-a"


@pytest.fixture(scope="module")
def static_broker(tmp_path_factory):
    process = _start(tmp_path_factory.mktemp("static"), {"group.initial.rebalance.delay.ms": "0"})
    yield process
    process.stop()


def _join(client: RawClient, group: str, metadata: bytes, member_id: str = ""):
    return client.request(JOIN_GROUP, JOIN_VERSION, {
        "group_id": group, "session_timeout": SESSION_TIMEOUT_MS,
        "rebalance_timeout": SESSION_TIMEOUT_MS, "member_id": member_id,
        "group_instance_id": INSTANCE, "protocol_type": "consumer",
        "protocols": [{"name": "range", "metadata": metadata}]})


def _sync(client: RawClient, group: str, member_id: str, generation: int, assignments=()):
    return client.request(SYNC_GROUP, SYNC_VERSION, {
        "group_id": group, "generation_id": generation, "member_id": member_id,
        "group_instance_id": INSTANCE, "protocol_type": "consumer", "protocol_name": "range",
        "assignments": [{"member_id": m, "assignment": a} for m, a in assignments]})


def _heartbeat(client: RawClient, group: str, member_id: str, generation: int) -> int:
    return client.request(HEARTBEAT, HEARTBEAT_VERSION, {
        "group_id": group, "generation_id": generation, "member_id": member_id,
        "group_instance_id": INSTANCE}).error_code


def test_failed_rejoin_append_keeps_the_old_member_id(static_broker):
    group = f"static-{uuid.uuid4().hex[:8]}"
    with RawClient(static_broker.bootstrap) as client:
        joined = _join(client, group, b"small")
        assert joined.error_code == 0 and joined.leader == joined.member_id
        old_id, generation = joined.member_id, joined.generation_id
        synced = _sync(client, group, old_id, generation, [(old_id, b"A")])
        assert (synced.error_code, synced.assignment) == (0, b"A")

        too_large = _join(client, group, b"x" * (OFFSETS_TOPIC_MAX_MESSAGE_BYTES + 1))
        assert (too_large.error_code, too_large.member_id) == (errors.UnknownServerError.code, "")
        assert too_large.leader == old_id and too_large.generation_id == generation
        assert _heartbeat(client, group, old_id, generation) == 0
        assert _sync(client, group, old_id, generation).assignment == b"A"

        rejoined = _join(client, group, b"small")
        assert rejoined.error_code == 0 and rejoined.member_id not in ("", old_id)
        assert rejoined.generation_id == generation and rejoined.skip_assignment
        new_id = rejoined.member_id
        assert _heartbeat(client, group, old_id, generation) == errors.FencedInstanceId.code
        assert _heartbeat(client, group, new_id, generation) == 0
        assert _sync(client, group, new_id, generation).assignment == b"A"
