"""ElectLeaders (api key 43): preferred (0) or unclean (1) leader election for partitions.

In a cluster the active controller elects, as Kafka's ZooKeeper-mode controller
(``KafkaController.processReplicaLeaderElection``): per partition no error when a new leader
was written, ELECTION_NOT_NEEDED (84) when the preferred replica already leads (preferred) or
the leader is live (unclean), PREFERRED_LEADER_NOT_AVAILABLE (80) / ELIGIBLE_LEADERS_NOT_AVAILABLE
(83) when no leader can be elected, UNKNOWN_TOPIC_OR_PARTITION for a partition the cluster does
not have; any other broker answers every partition NOT_CONTROLLER (41). The top-level error
(v1+) is none; a null partition list means every partition, and then the partitions that
needed no election are left out of the answer, as Kafka does. An unknown election type is
INVALID_REQUEST for every partition.

A single node leads every partition it has, with one replica: each existing partition needs no
election (ELECTION_NOT_NEEDED), the others are UNKNOWN_TOPIC_OR_PARTITION. v0 (preferred
only) has no top-level error code. Runs on the event loop thread; the election on the
controller's thread.
"""

from __future__ import annotations

from typing import Any

from headrace.broker.cluster_admin import request_timeout_ms
from headrace.cluster.controller import ELECTION_TYPE_PREFERRED, ELECTION_TYPE_UNCLEAN
from headrace.errors import (
    ElectionNotNeeded,
    InvalidRequest,
    KafkaError,
    NotController,
    UnknownTopicOrPartition,
)

API_KEY = 43
MIN_VERSION = 0
MAX_VERSION = 2

FIRST_TOP_LEVEL_ERROR_VERSION = 1


def _requested(request: Any) -> list[tuple[str, int]] | None:
    if request.topic_partitions is None:
        return None
    return list(dict.fromkeys((entry.topic, int(partition))
                              for entry in request.topic_partitions
                              for partition in entry.partitions))


def _single_node(broker: Any, partitions: list[tuple[str, int]] | None) -> dict:
    topics = broker.log_manager.topics()
    if partitions is None:
        return {}  # every partition already has its preferred (only) replica as leader
    results: dict[tuple[str, int], KafkaError | None] = {}
    for topic, partition in partitions:
        exists = topic in topics and 0 <= partition < topics[topic].partitions
        results[(topic, partition)] = ElectionNotNeeded(
            "Leader election not needed for topic partition.") if exists else \
            UnknownTopicOrPartition(f"The partition {topic}-{partition} does not exist.")
    return results


async def _cluster(ctx: Any, request: Any, election_type: int,
                   partitions: list[tuple[str, int]] | None) -> dict:
    service = ctx.broker.controller
    if not service.is_active:
        return {tp: NotController(None) for tp in partitions or ()}
    return await service.run(
        lambda controller: controller.elect_leaders(election_type, partitions),
        request_timeout_ms(request))


def _every(partitions, error: KafkaError) -> dict:
    return {tp: error for tp in partitions or ()}


async def handle(ctx, request):
    election_type = getattr(request, "election_type", ELECTION_TYPE_PREFERRED)
    partitions = _requested(request)
    if election_type not in (ELECTION_TYPE_PREFERRED, ELECTION_TYPE_UNCLEAN):
        results = _every(partitions, InvalidRequest(f"Unknown election type {election_type}"))
    elif getattr(ctx.broker, "controller", None) is not None:
        try:
            results = await _cluster(ctx, request, election_type, partitions)
        except KafkaError as error:
            results = _every(partitions, error)
    else:
        results = _single_node(ctx.broker, partitions)
    body: dict[str, Any] = {"throttle_time": 0,
                            "replica_election_results": _by_topic(results)}
    if ctx.api_version >= FIRST_TOP_LEVEL_ERROR_VERSION:
        body["error_code"] = 0
    return ctx.respond(body)


def _by_topic(results: dict[tuple[str, int], KafkaError | None]) -> list[dict[str, Any]]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), error in results.items():
        topics.setdefault(topic, []).append({
            "partition_id": partition,
            "error_code": error.code if error is not None else 0,
            "error_message": None if error is None or isinstance(error, NotController)
            else error.message,
        })
    return [{"topic": topic, "partition_result": entries} for topic, entries in topics.items()]
