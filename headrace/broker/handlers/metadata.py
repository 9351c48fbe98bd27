"""Metadata (key 3), versions 0-13: brokers, cluster id, controller, topics and partitions.

In a cluster (``BrokerState.cluster``) the brokers, the controller and each partition's
leader, epoch, replicas, isr and offline replicas come from ZooKeeper
(``broker.cluster_service``); an unknown topic allowed to be auto-created is written to
ZooKeeper and answered LEADER_NOT_AVAILABLE, as Kafka's ZooKeeper-mode brokers answer it,
until the controller has elected its leaders. Otherwise:
a single node leads every partition (leader = replicas = isr = this node, leader epoch 0),
except a partition whose log failed to load at start-up: leader -1, LEADER_NOT_AVAILABLE, this
node in ``offline_replicas`` (Kafka's offline partition).
Unknown topics are created with ``num.partitions`` when ``auto.create.topics.enable`` and the
request (v4+) allow it, answered at once with the new topic; otherwise
UNKNOWN_TOPIC_OR_PARTITION (UNKNOWN_TOPIC_ID for an unknown or zero id, v12+). As Kafka,
v10-11 requests naming a topic by id or with a null name are INVALID_REQUEST for every
topic (ids are in the schema from v10 but looked up only from v12). Names breaking Kafka's
rules get INVALID_TOPIC_EXCEPTION. A null topic list (or an empty one at v0) means all topics.
``is_internal`` is true for Kafka's internal topics only (``__consumer_offsets``,
``__transaction_state``), not for every name starting with ``__``. Authorized operations, as
Kafka's ``KafkaApis``: v8-10 answer the cluster's when ``include_cluster_authorized_operations``
(v11 dropped the field for DescribeCluster); v8+ answer each topic's, named ones including
those with an error, when ``include_topic_authorized_operations``; else Kafka's "omitted"
value. The bit sets come from ``headrace.broker.authorization``.
Event loop thread; topic creation runs on the append thread.
"""

from __future__ import annotations

import re
import uuid

from headrace.broker.authorization import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_NAME,
    ResourceType,
    authorized_operations,
)
from headrace.coordinator.records import OFFSETS_TOPIC_NAME
from headrace.errors import (
    InvalidRequest,
    InvalidTopic,
    KafkaError,
    LeaderNotAvailable,
    TopicAlreadyExists,
    UnknownTopicId,
    UnknownTopicOrPartition,
)

API_KEY = 3
MIN_VERSION = 0
MAX_VERSION = 13

AUTHORIZED_OPERATIONS_MIN_VERSION = 8
CLUSTER_AUTHORIZED_OPERATIONS_MAX_VERSION = 10
FIRST_LOOKUP_BY_ID_VERSION = 12
MAX_TOPIC_NAME_CHARS = 249
_LEGAL_TOPIC_NAME = re.compile(r"^[a-zA-Z0-9._-]+$")
_ZERO_UUID = uuid.UUID(int=0)
TRANSACTION_STATE_TOPIC_NAME = "__transaction_state"
INTERNAL_TOPIC_NAMES = frozenset({OFFSETS_TOPIC_NAME, TRANSACTION_STATE_TOPIC_NAME})


def topic_name_is_legal(name: str) -> bool:
    return (
        0 < len(name) <= MAX_TOPIC_NAME_CHARS
        and name not in (".", "..")
        and _LEGAL_TOPIC_NAME.match(name) is not None
    )


def topic_metadata(broker, info) -> dict:
    if broker.cluster is not None:
        partitions = [broker.cluster.partition_metadata(info.name, index)
                      for index in range(info.partitions)]
    else:
        offline = broker.log_manager.offline_partitions()
        partitions = [_partition_metadata(broker.node_id, index, (info.name, index) in offline)
                      for index in range(info.partitions)]
    return {
        "error_code": 0,
        "name": info.name,
        "topic_id": info.topic_id,
        "is_internal": info.name in INTERNAL_TOPIC_NAMES,
        "partitions": partitions,
        "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
    }


def _partition_metadata(node_id: int, index: int, offline: bool) -> dict:
    """This node leads every partition; a partition whose log failed to load has no leader
    (Kafka's offline partition: LEADER_NOT_AVAILABLE, leader -1, its replica offline)."""
    if offline:
        return {"error_code": LeaderNotAvailable.code, "partition_index": index,
                "leader_id": -1, "leader_epoch": 0, "replica_nodes": [node_id],
                "isr_nodes": [node_id], "offline_replicas": [node_id]}
    return {"error_code": 0, "partition_index": index, "leader_id": node_id,
            "leader_epoch": 0, "replica_nodes": [node_id], "isr_nodes": [node_id],
            "offline_replicas": []}


def _error_topic(code: int, name: str | None, topic_id: uuid.UUID | None = None) -> dict:
    return {"error_code": code, "name": name, "topic_id": topic_id or _ZERO_UUID,
            "partitions": [], "topic_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED}


async def _lookup_or_create(ctx, name: str, may_create: bool) -> dict:
    broker = ctx.broker
    manager = broker.log_manager
    try:
        return topic_metadata(broker, manager.topic(name))
    except UnknownTopicOrPartition:
        pass
    if not topic_name_is_legal(name):
        return _error_topic(InvalidTopic.code, name)
    if not may_create:
        return _error_topic(UnknownTopicOrPartition.code, name)
    partitions = broker.config.get_int("num.partitions")
    if broker.cluster is not None:  # written to ZooKeeper; leaders follow from the controller
        error = await broker.cluster.create_topic(name, partitions, "default.replication.factor", {})
        return _error_topic(error.code if error else LeaderNotAvailable.code, name)
    try:
        info = await broker.run_append(manager.create_topic, name, partitions, {})
    except TopicAlreadyExists:
        info = manager.topic(name)
    except KafkaError as error:
        return _error_topic(error.code, name)
    return topic_metadata(broker, info)


async def _requested_topics(ctx, request) -> list[dict]:
    broker = ctx.broker
    manager = broker.log_manager
    if request.topics is None or (ctx.api_version == 0 and not request.topics):
        return [topic_metadata(broker, info) for info in manager.topics().values()]
    may_create = broker.config.get_bool("auto.create.topics.enable") and getattr(
        request, "allow_auto_topic_creation", True
    )
    by_id = None
    answers = []
    for requested in request.topics:
        name = requested.name
        if name is None:
            topic_id = getattr(requested, "topic_id", _ZERO_UUID)
            if by_id is None:
                by_id = {info.topic_id: info for info in manager.topics().values()}
            info = by_id.get(topic_id)
            answers.append(topic_metadata(broker, info) if info is not None
                           else _error_topic(UnknownTopicId.code, None, topic_id))
            continue
        answers.append(await _lookup_or_create(ctx, name, may_create))
    return answers


def _with_topic_operations(ctx, request, topics: list[dict]) -> list[dict]:
    if ctx.api_version < AUTHORIZED_OPERATIONS_MIN_VERSION or not getattr(
            request, "include_topic_authorized_operations", False):
        return topics
    return [{**topic, "topic_authorized_operations": authorized_operations(
        ResourceType.TOPIC, topic["name"])} if topic["name"] is not None else topic
        for topic in topics]


def _cluster_operations(ctx, request) -> int:
    if (AUTHORIZED_OPERATIONS_MIN_VERSION <= ctx.api_version
            <= CLUSTER_AUTHORIZED_OPERATIONS_MAX_VERSION
            and getattr(request, "include_cluster_authorized_operations", False)):
        return authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)
    return AUTHORIZED_OPERATIONS_OMITTED


def _topic_ids_refused(ctx, request) -> bool:
    """Kafka's handleTopicMetadataRequest: before v12 a named topic list may carry neither a
    null name nor a topic id (v10-11 have the field but no lookup by it)."""
    if ctx.api_version >= FIRST_LOOKUP_BY_ID_VERSION or not request.topics:
        return False
    return any(topic.name is None or getattr(topic, "topic_id", None) not in (None, _ZERO_UUID)
               for topic in request.topics)


def _invalid_request_response(ctx, request):
    """Kafka's MetadataRequest.getErrorResponse for INVALID_REQUEST: every requested topic
    with the error (a null name answered as ""), no brokers, no cluster id."""
    return ctx.respond({
        "throttle_time": 0, "brokers": [], "cluster_id": None, "controller_id": -1,
        "topics": [{**_error_topic(InvalidRequest.code, topic.name or "",
                                   getattr(topic, "topic_id", None)), "is_internal": False}
                   for topic in request.topics],
        "cluster_authorized_operations": AUTHORIZED_OPERATIONS_OMITTED,
        "error_code": 0,
    })


async def handle(ctx, request):
    if _topic_ids_refused(ctx, request):
        return _invalid_request_response(ctx, request)
    broker = ctx.broker
    topics = _with_topic_operations(ctx, request, await _requested_topics(ctx, request))
    if broker.cluster is not None:
        brokers, controller_id = broker.cluster.live_brokers(), broker.cluster.controller_id
    else:
        brokers = [{"node_id": broker.node_id, "host": broker.advertised_host,
                    "port": broker.advertised_port, "rack": None}]
        controller_id = broker.node_id
    return ctx.respond({
        "throttle_time": 0,
        "brokers": brokers,
        "cluster_id": broker.cluster_id,
        "controller_id": controller_id,
        "topics": topics,
        "cluster_authorized_operations": _cluster_operations(ctx, request),
        "error_code": 0,
    })
