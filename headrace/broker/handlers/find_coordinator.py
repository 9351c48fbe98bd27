"""FindCoordinator (key 10), versions 0-6: a group's or a transactional id's coordinator.

On a single node every group's and transactional id's coordinator is this node; in a cluster a
group's is the leader of the group's ``__consumer_offsets`` partition, COORDINATOR_NOT_AVAILABLE
while it has none (``broker.cluster_service``), and transactions are not coordinated yet
(COORDINATOR_NOT_AVAILABLE).

key_type 0 (group) and 1 (transaction) are answered with this broker's advertised host and
port; key_type 2 (share) is not served here: COORDINATOR_NOT_AVAILABLE, as Kafka answers
while no coordinator exists for the key. v4+ batches keys (``coordinator_keys``) and answers
one ``Coordinator`` per key; v0-3 carry one ``key`` and answer at the top level.
An empty group id is INVALID_REQUEST (Kafka's check). Event loop thread.
"""

from __future__ import annotations

from headrace.errors import CoordinatorNotAvailable, InvalidRequest, KafkaError

API_KEY = 10
MIN_VERSION = 0
MAX_VERSION = 6

GROUP_KEY_TYPE = 0
TRANSACTION_KEY_TYPE = 1
BATCHED_KEYS_VERSION = 4


def _coordinator(broker, key: str, key_type: int) -> dict:
    if key_type not in (GROUP_KEY_TYPE, TRANSACTION_KEY_TYPE):
        error = CoordinatorNotAvailable(f"key type {key_type} is not served by this broker")
    elif not key and key_type == GROUP_KEY_TYPE:
        error = InvalidRequest("empty group id")
    elif broker.cluster is not None and key_type == TRANSACTION_KEY_TYPE:
        error = CoordinatorNotAvailable("transactions are not coordinated in a cluster yet")
    elif broker.cluster is not None:
        try:
            return {"key": key, **broker.cluster.group_coordinator(key), "error_code": 0,
                    "error_message": None}
        except KafkaError as caught:
            error = caught
    else:
        return {"key": key, "node_id": broker.node_id, "host": broker.advertised_host,
                "port": broker.advertised_port, "error_code": 0, "error_message": None}
    return {"key": key, "node_id": -1, "host": "", "port": -1, "error_code": error.code,
            "error_message": error.message}


async def handle(ctx, request):
    key_type = getattr(request, "key_type", GROUP_KEY_TYPE)
    if ctx.api_version >= BATCHED_KEYS_VERSION:
        coordinators = [_coordinator(ctx.broker, key, key_type)
                        for key in request.coordinator_keys]
        return ctx.respond({"throttle_time": 0, "coordinators": coordinators})
    answer = _coordinator(ctx.broker, request.key, key_type)
    del answer["key"]
    return ctx.respond({"throttle_time": 0, **answer})
