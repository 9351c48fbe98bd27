"""Admin requests in cluster mode, as Kafka's ZooKeeper-mode brokers serve them.

Owns the cluster branch of CreateTopics, CreatePartitions, DeleteTopics and of topic config
changes (each handler module calls in here first when the broker runs a controller): the active controller does the work
through ZooKeeper on its event thread (``ControllerService.run``); any other broker answers
every topic NOT_CONTROLLER (41) without a message, as Kafka's ``KafkaApis`` does, and clients
send admin requests to the controller id Metadata names.

CreateTopics follows ``ZkAdminManager.createTopics``: the validation of the single-node handler
(names, internal topics, duplicates, configs; shared with it), then the replication factor and
partitions against the live brokers (Kafka's rack-unaware assignment; a manual assignment's
brokers must be registered), ``validate_only`` stopping there. The answer comes once the
partition states are written (the controller writes them in the same event) and this broker's
metadata cache shows a leader for every partition (Kafka's DelayedCreatePartitions), bounded by
the request's ``timeout_ms`` (REQUEST_TIMED_OUT past it). DeleteTopics answers once the topic's
znodes are gone and this broker's cache no longer has the topic (DelayedDeleteTopics); brokers
drop their logs when their watches see the topic vanish. A topic's config change (AlterConfigs,
IncrementalAlterConfigs) is written by whichever broker receives it, as Kafka's
``ZkAdminManager.alterConfigs``: ``/config/topics/<t>`` and a ``config_change_`` notification.

Runs on the event loop thread; ZooKeeper is only touched on the controller's thread.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

from headrace.broker.handlers import create_topics as single_node  # module: import cycle
from headrace.broker.handlers.describe_configs import topic_config_descriptions
from headrace.broker.handlers.metadata import INTERNAL_TOPIC_NAMES
from headrace.cluster import topic_admin
from headrace.cluster import zookeeper_records as records
from headrace.errors import (
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidRequest,
    KafkaError,
    NotController,
    PolicyViolation,
    RequestTimedOut,
    TopicDeletionDisabled,
)
from headrace.storage.config import LogConfig

DEFAULT_TIMEOUT_MS = 30_000
ZERO_UUID = uuid.UUID(int=0)


def runs_controller(broker: Any) -> bool:
    return getattr(broker, "controller", None) is not None


def request_timeout_ms(request: Any) -> int:
    """The request's ``timeout_ms`` (kio: a timedelta); Kafka waits not at all for 0 or less,
    headrace still needs a bound for the controller's work: ``DEFAULT_TIMEOUT_MS``."""
    timeout_ms = int(request.timeout.total_seconds() * 1000)
    return timeout_ms if timeout_ms > 0 else DEFAULT_TIMEOUT_MS


# --- CreateTopics ---------------------------------------------------------------------------

async def create_topics(ctx: Any, request: Any):
    names = list(dict.fromkeys(topic.name for topic in request.topics))
    service = ctx.broker.controller
    if not service.is_active:
        return single_node._respond(ctx, [single_node._failure(name, NotController("")) | {"error_message": None}
                              for name in names])
    counts = Counter(topic.name for topic in request.topics)
    results = []
    for name in names:
        topic = next(t for t in request.topics if t.name == name)
        try:
            results.append(await _create_topic(ctx, topic, counts[name], request))
        except KafkaError as error:
            results.append(single_node._failure(name, error))
    return single_node._respond(ctx, results)


async def _create_topic(ctx: Any, topic: Any, count: int, request: Any) -> dict[str, Any]:
    if topic.name in INTERNAL_TOPIC_NAMES:
        raise InvalidRequest(f"Creation of internal topic {topic.name} is prohibited.")
    if count > 1:
        raise InvalidRequest("Duplicate topic name.")
    single_node.validate_topic_name(topic.name)
    overrides = single_node._overrides(topic)
    partitions, replication_factor, manual = _resolve_layout(ctx.broker.config, topic)
    # the bound of the single-node path, also keeping the assignment znode far below
    # ZooKeeper's 1 MiB jute.maxbuffer (a larger write would close the broker's session)
    single_node.check_records_per_user_op(1 + len(overrides) + partitions)
    timeout_ms = request_timeout_ms(request)

    def create(controller) -> records.TopicAssignment:
        single_node._check_not_existing(topic.name, dict.fromkeys(controller.topic_names()))
        if request.validate_only:
            return _validate_layout(controller, partitions, replication_factor, manual)
        controller.create_topic(topic.name, partitions, replication_factor, overrides, manual)
        return controller.assignment(topic.name)

    assignment = await ctx.broker.controller.run(create, timeout_ms)
    if not request.validate_only:
        await _wait_for_metadata(ctx.broker, lambda metadata: _has_leaders(
            metadata, topic.name, len(assignment.partitions)), timeout_ms)
    return _created(ctx.broker, topic.name, assignment, overrides, request.validate_only)


def _has_leaders(metadata: Any, name: str, partitions: int) -> bool:
    states = metadata.states
    return all((name, p) in states and states[(name, p)].has_leader for p in range(partitions))


async def _wait_for_metadata(broker: Any, predicate, timeout_ms: int) -> None:
    """Kafka's DelayedCreatePartitions / DelayedDeleteTopics: answer once this broker's
    metadata cache shows the change, REQUEST_TIMED_OUT when it does not within the timeout."""
    cluster = getattr(broker, "cluster", None)
    if cluster is None:
        return
    if not await cluster.cache.wait_until(predicate, timeout_ms):
        raise RequestTimedOut(f"The metadata did not show the change within {timeout_ms} ms.")


def _resolve_layout(config: Any, topic: Any) -> tuple[int, int, dict[int, tuple[int, ...]] | None]:
    """(partitions, replication factor, manual assignment or None), Kafka's defaults for -1."""
    if topic.assignments:
        if topic.num_partitions != -1 or topic.replication_factor != -1:
            raise InvalidRequest("Both numPartitions or replicationFactor and replicasAssignments "
                                 "were set. Both cannot be used at the same time.")
        manual = {a.partition_index: tuple(a.broker_ids) for a in topic.assignments}
        if set(manual) != set(range(len(manual))):
            raise InvalidReplicaAssignment(
                f"Partitions must be numbered 0 to {len(manual) - 1}, but got {sorted(manual)}")
        return len(manual), len(manual[0]), manual
    partitions = topic.num_partitions
    replication_factor = topic.replication_factor
    if partitions == -1:
        partitions = config.get_int("num.partitions")
    if replication_factor == -1:
        replication_factor = config.get_int("default.replication.factor")
    if partitions <= 0:
        raise InvalidPartitions("Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise InvalidReplicationFactor("Replication factor must be larger than 0.")
    return partitions, replication_factor, None


def _validate_layout(controller: Any, partitions: int, replication_factor: int,
                     manual: dict[int, tuple[int, ...]] | None) -> records.TopicAssignment:
    live = sorted(controller.live_broker_ids())
    if manual is not None:
        topic_admin.check_manual_assignment(manual, live)
        replicas = manual
    else:
        topic_admin.check_replication_factor(replication_factor, len(live))
        replicas = records.assign_replicas_to_brokers(live, partitions, replication_factor)
    return records.TopicAssignment(topic_id=None, partitions=replicas)


def _created(broker: Any, name: str, assignment: records.TopicAssignment,
             overrides: dict[str, str], validate_only: bool) -> dict[str, Any]:
    log_config = LogConfig.from_properties(overrides, broker.config.properties())
    descriptions = topic_config_descriptions(broker, overrides, log_config)
    topic_id = uuid.UUID(bytes=assignment.topic_id) if assignment.topic_id and not validate_only \
        else ZERO_UUID
    return {
        "name": name, "topic_id": topic_id, "error_code": 0, "error_message": None,
        "num_partitions": len(assignment.partitions),
        "replication_factor": len(next(iter(assignment.partitions.values()))),
        "configs": [
            {"name": d.name, "value": d.value, "read_only": d.read_only,
             "config_source": d.source, "is_sensitive": d.sensitive}
            for d in descriptions
        ],
    }


# --- CreatePartitions -----------------------------------------------------------------------

async def create_partitions(ctx: Any, request: Any):
    service = ctx.broker.controller
    counts = Counter(topic.name for topic in request.topics)
    results, answered = [], set()
    for topic in request.topics:
        if topic.name in answered:
            continue
        answered.add(topic.name)
        try:
            if not service.is_active:
                raise NotController("")
            if counts[topic.name] > 1:
                raise InvalidRequest("Duplicate topic name.")
            await _grow(ctx, topic, request)
            results.append({"name": topic.name, "error_code": 0, "error_message": None})
        except KafkaError as error:
            message = None if isinstance(error, NotController) else error.message
            results.append({"name": topic.name, "error_code": error.code, "error_message": message})
    return ctx.respond({"throttle_time": 0, "results": results})


async def _grow(ctx: Any, topic: Any, request: Any) -> None:
    manual = [tuple(a.broker_ids) for a in topic.assignments] if topic.assignments is not None else None

    if topic.count > single_node.MAX_RECORDS_PER_USER_OP:
        raise PolicyViolation("Unable to perform excessively large batch operation.")

    def grow(controller) -> None:
        existing = controller.assignment(topic.name).partitions
        if topic.count == len(existing):
            raise InvalidPartitions(f"Topic already has {len(existing)} partition(s).")
        if manual is not None and len(manual) != topic.count - len(existing):
            raise InvalidReplicaAssignment(
                f"Attempted to add {topic.count - len(existing)} additional partition(s), but "
                f"only {len(manual)} assignment(s) were specified.")
        if request.validate_only:
            records.assign_added_partitions(controller.live_broker_ids(), existing, topic.count)
            return
        controller.create_partitions(topic.name, topic.count, manual)

    timeout_ms = request_timeout_ms(request)
    await ctx.broker.controller.run(grow, timeout_ms)
    if not request.validate_only:
        await _wait_for_metadata(ctx.broker, lambda metadata: _has_leaders(
            metadata, topic.name, topic.count), timeout_ms)


# --- DeleteTopics ---------------------------------------------------------------------------

FIRST_TOPIC_DELETION_DISABLED_VERSION = 3


def delete_refusal(broker: Any, api_version: int) -> KafkaError | None:
    """Kafka's ZooKeeper-mode answer to every topic of a DeleteTopics refused as a whole:
    NOT_CONTROLLER off the controller; with ``delete.topic.enable`` false, TOPIC_DELETION_DISABLED
    (INVALID_REQUEST before v3)."""
    if not broker.controller.is_active:
        return NotController("")
    if not broker.config.get_bool("delete.topic.enable"):
        if api_version < FIRST_TOPIC_DELETION_DISABLED_VERSION:
            return InvalidRequest("")
        return TopicDeletionDisabled("")
    return None


async def delete_topic(broker: Any, name: str | None, topic_id: uuid.UUID | None,
                       request: Any) -> dict[str, Any]:
    """Delete a topic named by name or id through the controller; by the time this returns its
    znodes are gone. The response entry."""
    def delete(controller) -> tuple[str, bytes | None]:
        resolved = name if topic_id is None else controller.topic_name_for_id(topic_id.bytes)
        if resolved in INTERNAL_TOPIC_NAMES:
            raise InvalidRequest(f"Deletion of internal topic {resolved} is prohibited.")
        deleted_id = controller.assignment(resolved).topic_id
        controller.delete_topic(resolved)
        return resolved, deleted_id

    timeout_ms = request_timeout_ms(request)
    resolved, deleted_id = await broker.controller.run(delete, timeout_ms)
    await _wait_for_metadata(broker, lambda metadata: resolved not in metadata.topics, timeout_ms)
    return {"name": resolved, "error_code": 0, "error_message": None,
            "topic_id": uuid.UUID(bytes=deleted_id) if deleted_id else ZERO_UUID}


# --- AlterConfigs / IncrementalAlterConfigs of a topic -------------------------------------

async def change_topic_config(broker: Any, topic: str, overrides: dict[str, str]) -> None:
    """Write the topic's new overrides and a change notification to ZooKeeper from this broker
    (any broker may, as with Kafka's ZooKeeper-mode AlterConfigs); every broker applies them
    from its watch. Answers once this broker's metadata cache has them (read your writes)."""
    zk = broker.membership.session.client
    await asyncio.to_thread(topic_admin.change_topic_config, zk, topic, overrides)
    await _wait_for_metadata(broker, lambda metadata: topic in metadata.topics and dict(
        metadata.topics[topic].configs) == dict(overrides), DEFAULT_TIMEOUT_MS)
