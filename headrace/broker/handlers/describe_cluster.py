"""DescribeCluster (api key 60): the cluster id, the controller and the brokers.

A single node is its own controller: the answer lists this broker (node id, advertised host
and port, ``broker.rack`` if set) and names it as controller. In a cluster the answer lists the
live brokers registered in ZooKeeper and the controller named by ``/controller``
(``broker.cluster_service``). v1+ asks for an
endpoint type: brokers (1) is answered; controllers (2) is MISMATCHED_ENDPOINT_TYPE (this is a
broker endpoint) and anything else UNSUPPORTED_ENDPOINT_TYPE, as Kafka's brokers do. Cluster
authorized operations, when asked for, come from ``headrace.broker.authorization`` (every
operation on the cluster resource: there is no authorizer). Stateless; runs on the event loop thread.
"""

from __future__ import annotations

from typing import Any

from headrace.broker.authorization import (
    AUTHORIZED_OPERATIONS_OMITTED,
    CLUSTER_NAME,
    ResourceType,
    authorized_operations,
)

API_KEY = 60
MIN_VERSION = 0
MAX_VERSION = 2

BROKER_ENDPOINT_TYPE = 1
CONTROLLER_ENDPOINT_TYPE = 2
UNSUPPORTED_ENDPOINT_TYPE = 111
MISMATCHED_ENDPOINT_TYPE = 114


def _endpoint_error(endpoint_type: int) -> tuple[int, str | None]:
    if endpoint_type == BROKER_ENDPOINT_TYPE:
        return 0, None
    if endpoint_type == CONTROLLER_ENDPOINT_TYPE:
        return MISMATCHED_ENDPOINT_TYPE, (
            "The request was sent to an endpoint of type BROKER, but we wanted an endpoint of "
            "type CONTROLLER"
        )
    return UNSUPPORTED_ENDPOINT_TYPE, f"Unsupported endpoint type {endpoint_type}"


def _brokers(broker: Any) -> list[dict[str, Any]]:
    if broker.cluster is not None:
        return [{"broker_id": b["node_id"], "host": b["host"], "port": b["port"],
                 "rack": b["rack"], "is_fenced": False} for b in broker.cluster.live_brokers()]
    rack = broker.config.properties().get("broker.rack") or None
    return [{"broker_id": broker.node_id, "host": broker.advertised_host,
             "port": broker.advertised_port, "rack": rack, "is_fenced": False}]


def _controller_id(broker: Any) -> int:
    return broker.cluster.controller_id if broker.cluster is not None else broker.node_id


async def handle(ctx, request):
    broker = ctx.broker
    endpoint_type = getattr(request, "endpoint_type", BROKER_ENDPOINT_TYPE)
    error_code, error_message = _endpoint_error(endpoint_type)
    operations = AUTHORIZED_OPERATIONS_OMITTED
    if request.include_cluster_authorized_operations:
        operations = authorized_operations(ResourceType.CLUSTER, CLUSTER_NAME)
    return ctx.respond({
        "throttle_time": 0,
        "error_code": error_code,
        "error_message": error_message,
        "endpoint_type": endpoint_type,
        "cluster_id": broker.cluster_id,
        "controller_id": _controller_id(broker) if error_code == 0 else -1,
        "brokers": _brokers(broker) if error_code == 0 else [],
        "cluster_authorized_operations": operations,
    })
