"""ListPartitionReassignments (api key 46, v0): the ongoing partition reassignments.

In a cluster the active controller answers (``Controller.list_partition_reassignments``, as
Kafka's ``processListPartitionReassignments``): for the partitions asked (null topics: every
partition) those being reassigned, with their full replica set, adding and removing replicas;
partitions not being reassigned or unknown are left out. Any other broker answers
NOT_CONTROLLER (41). A single node never reassigns: an empty list. Runs on the event loop
thread; the controller's work on its thread.
"""

from __future__ import annotations

from typing import Any

from headrace.broker.cluster_admin import request_timeout_ms
from headrace.errors import KafkaError, NotController

API_KEY = 46
MIN_VERSION = 0
MAX_VERSION = 0


def _requested(request: Any) -> list[tuple[str, int]] | None:
    if request.topics is None:
        return None
    return list(dict.fromkeys((topic.name, int(partition)) for topic in request.topics
                              for partition in topic.partition_indexes))


async def handle(ctx, request):
    service = getattr(ctx.broker, "controller", None)
    top_error: KafkaError | None = None
    ongoing: dict = {}
    if service is not None and not service.is_active:
        top_error = NotController("")
    elif service is not None:
        partitions = _requested(request)
        try:
            ongoing = await service.run(
                lambda controller: controller.list_partition_reassignments(partitions),
                request_timeout_ms(request))
        except KafkaError as error:
            top_error = error
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), assignment in sorted(ongoing.items()):
        topics.setdefault(topic, []).append({
            "partition_index": partition, "replicas": list(assignment.replicas),
            "adding_replicas": list(assignment.adding),
            "removing_replicas": list(assignment.removing)})
    return ctx.respond({
        "throttle_time": 0,
        "error_code": top_error.code if top_error else 0,
        "error_message": None if top_error is None or isinstance(top_error, NotController)
        else top_error.message,
        "topics": [{"name": name, "partitions": partitions} for name, partitions in topics.items()],
    })
