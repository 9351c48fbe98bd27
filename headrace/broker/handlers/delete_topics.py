"""DeleteTopics (api key 20): delete topics by name (v0+) or by topic id (v6+).

As Kafka's controller (ControllerApis.deleteTopics): a name or id given twice is
INVALID_REQUEST ("Duplicate topic name." / "Duplicate topic id."); in v6 a state with neither
or both of name and id is INVALID_REQUEST; an unknown name is UNKNOWN_TOPIC_OR_PARTITION and
an unknown id UNKNOWN_TOPIC_ID. An internal topic (``__consumer_offsets``) is INVALID_REQUEST,
unlike Kafka, whose FindCoordinator recreates a missing offsets topic with its internal layout:
headrace's group coordinator owns that layout from start-up and would lose every group (see
create_topics). The answer names the topic and, in v6, its id, whichever one the client sent. Deletion itself is the log manager's (renamed away, removed later).
v0 has v1's request (kio lacks v0: wire.py decodes it with v1's class); its response, without
throttle_time_ms, is encoded here::

    responses [ name string, error_code int16 ]

Runs on the event loop thread; deletes run on the broker's append thread.
"""

from __future__ import annotations

import struct
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from headrace.broker import cluster_admin
from headrace.broker.context import RawResponse
from headrace.broker.handlers.metadata import INTERNAL_TOPIC_NAMES
from headrace.errors import InvalidRequest, KafkaError, UnknownTopicId, UnknownTopicOrPartition
from headrace.protocol.wire import legacy_string

API_KEY = 20
MIN_VERSION = 0
MAX_VERSION = 6

NO_THROTTLE_TIME_VERSION = 0
_INT16, _INT32 = struct.Struct(">h"), struct.Struct(">i")

ZERO_UUID = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class _Target:
    """One topic to delete as the client named it (by name, or by id when name is None)."""

    name: str | None
    topic_id: uuid.UUID | None


def _targets(request: Any) -> list[_Target]:
    if hasattr(request, "topic_names"):
        return [_Target(name, None) for name in request.topic_names]
    return [_Target(state.name, state.topic_id) for state in request.topics]


def _target_error(target: _Target, counts: Counter) -> KafkaError | None:
    has_id = target.topic_id is not None and target.topic_id != ZERO_UUID
    if has_id and target.name is not None:
        return InvalidRequest("You may not specify both topic name and topic id.")
    if not has_id and target.name is None:
        return InvalidRequest("Neither topic name nor id were specified.")
    if counts[_key(target)] > 1:
        return InvalidRequest("Duplicate topic id." if has_id else "Duplicate topic name.")
    return None


async def _delete(broker: Any, target: _Target) -> dict[str, Any]:
    topics = broker.log_manager.topics()
    if target.name is None:
        name = next((n for n, info in topics.items() if info.topic_id == target.topic_id), None)
        if name is None:
            raise UnknownTopicId(f"Topic id {target.topic_id} does not exist.")
    else:
        name = target.name
        if name not in topics:
            raise UnknownTopicOrPartition(f"The topic '{name}' does not exist.")
    if name in INTERNAL_TOPIC_NAMES:
        raise InvalidRequest(f"Deletion of internal topic {name} is prohibited.")
    topic_id = topics[name].topic_id
    await broker.run_append(broker.log_manager.delete_topic, name)
    return {"name": name, "topic_id": topic_id, "error_code": 0, "error_message": None}


def _key(target: _Target) -> tuple[str | None, uuid.UUID | None]:
    has_id = target.topic_id is not None and target.topic_id != ZERO_UUID
    return (target.name, target.topic_id if has_id else None)


async def handle(ctx, request):
    targets = _targets(request)
    refusal = cluster_admin.delete_refusal(ctx.broker, ctx.api_version) \
        if cluster_admin.runs_controller(ctx.broker) else None
    if refusal is not None:  # as Kafka's ZooKeeper mode: every topic, no message
        return _respond(ctx, [{"name": t.name, "topic_id": t.topic_id or ZERO_UUID,
                               "error_code": refusal.code, "error_message": None} for t in targets])
    counts = Counter(_key(target) for target in targets)
    responses = []
    answered: set[tuple[str | None, uuid.UUID | None]] = set()
    for target in targets:
        if _key(target) in answered:
            continue
        answered.add(_key(target))
        error = _target_error(target, counts)
        if error is None:
            try:
                if cluster_admin.runs_controller(ctx.broker):
                    responses.append(await cluster_admin.delete_topic(
                        ctx.broker, target.name, target.topic_id if target.name is None else None,
                        request))
                    continue
                responses.append(await _delete(ctx.broker, target))
                continue
            except KafkaError as raised:
                error = raised
        responses.append({"name": target.name, "topic_id": target.topic_id or ZERO_UUID,
                          "error_code": error.code, "error_message": error.message})
    return _respond(ctx, responses)


def _respond(ctx, responses: list[dict[str, Any]]):
    if ctx.api_version == NO_THROTTLE_TIME_VERSION:
        return _v0_response(responses)
    return ctx.respond({"throttle_time": 0, "responses": responses})


def _v0_response(responses: list[dict[str, Any]]) -> RawResponse:
    body = bytearray(_INT32.pack(len(responses)))
    for response in responses:
        body += legacy_string(response["name"]) + _INT16.pack(response["error_code"])
    return RawResponse((bytes(body),), len(body))
