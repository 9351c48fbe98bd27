"""AlterConfigs (api key 33, the legacy form): replace a resource's whole set of overrides.

For a topic (resource type 2) the given configs become the topic's overrides, every other
override is removed; they are validated as a whole (INVALID_CONFIG naming key and value) and
applied live and persisted by ``LogManager.alter_topic_config`` (in cluster mode written to
ZooKeeper by any broker, as Kafka's AdminZkClient does: ``cluster_admin.change_topic_config``). For the broker (resource type
4) the given configs become the cluster-wide defaults (name "") or this broker's dynamic
configs (its id) through ``BrokerConfig.alter_dynamic``, removing the ones of that level not
given. A config named twice is
INVALID_REQUEST, a null value INVALID_REQUEST, an unknown topic UNKNOWN_TOPIC_OR_PARTITION, as
in Kafka. ``validate_only`` checks without changing anything.

The helpers for applying topic overrides and broker changes are shared with
IncrementalAlterConfigs. Runs on the event loop thread; a change is persisted and applied on a
worker thread (``asyncio.to_thread``), never on the append thread: persisting fsyncs a file
and its directory, which on a disk busy with write-back takes tens to hundreds of
milliseconds, and produce requests queued behind it on the append thread would wait as long.
The change reaches each log under its lock (which every append holds), and
``LogManager``/``BrokerConfig`` order concurrent changes themselves.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

from headrace.broker import cluster_admin
from headrace.broker.handlers.describe_configs import (
    BROKER_RESOURCE_TYPE,
    TOPIC_RESOURCE_TYPE,
    check_broker_resource,
)
from headrace.errors import InvalidRequest, KafkaError, UnknownTopicOrPartition
from headrace.storage.config import validate_topic_overrides

API_KEY = 33
MIN_VERSION = 0
MAX_VERSION = 2

def check_unique_names(configs: tuple[Any, ...]) -> None:
    duplicated = sorted(name for name, count in Counter(c.name for c in configs).items()
                        if count > 1)
    if duplicated:
        raise InvalidRequest(f"Error due to duplicate config keys: {', '.join(duplicated)}")


def current_topic_overrides(broker: Any, topic: str) -> dict[str, str]:
    try:
        return dict(broker.log_manager.topic(topic).overrides)
    except UnknownTopicOrPartition:
        raise UnknownTopicOrPartition(f"The topic '{topic}' does not exist.") from None


async def apply_topic_overrides(broker: Any, topic: str, overrides: Mapping[str, str],
                                validate_only: bool) -> None:
    """Validate the complete new override set and, unless validate_only, apply it."""
    normalised = validate_topic_overrides(dict(overrides))
    if validate_only:
        return
    if cluster_admin.runs_controller(broker):  # cluster mode: through ZooKeeper
        await cluster_admin.change_topic_config(broker, topic, normalised)
    else:
        await asyncio.to_thread(broker.log_manager.alter_topic_config, topic, normalised)


async def apply_broker_changes(broker: Any, changes: dict[str, str | None],
                               validate_only: bool, per_broker: bool) -> None:
    """Set (value) or remove (None) this broker's dynamic configs or the cluster-wide
    defaults; InvalidRequest for read-only names or bad values. Its change listeners push the
    new defaults to the log manager and the cleaner."""
    await asyncio.to_thread(broker.config.alter_dynamic, changes, validate_only, per_broker)


def _require_values(configs: tuple[Any, ...]) -> dict[str, str]:
    values = {}
    for config in configs:
        if config.value is None:
            raise InvalidRequest(f"Null value not supported for : {config.name}")
        values[config.name] = config.value
    return values


async def _alter_topic(broker: Any, resource: Any, validate_only: bool) -> None:
    current_topic_overrides(broker, resource.resource_name)
    await apply_topic_overrides(broker, resource.resource_name, _require_values(resource.configs),
                                validate_only)


async def _alter_broker(broker: Any, resource: Any, validate_only: bool) -> None:
    check_broker_resource(broker, resource.resource_name)
    per_broker = resource.resource_name != ""
    values: dict[str, str | None] = dict(_require_values(resource.configs))
    for name in broker.config.dynamic_configs(per_broker):
        values.setdefault(name, None)
    await apply_broker_changes(broker, values, validate_only, per_broker)


async def alter_resource(broker: Any, resource: Any, validate_only: bool,
                   alter_topic: Callable, alter_broker: Callable) -> dict[str, Any]:
    """One resource's response entry, running the matching alteration."""
    result = {"resource_type": resource.resource_type, "resource_name": resource.resource_name,
              "error_code": 0, "error_message": None}
    try:
        check_unique_names(resource.configs)
        if resource.resource_type == TOPIC_RESOURCE_TYPE:
            await alter_topic(broker, resource, validate_only)
        elif resource.resource_type == BROKER_RESOURCE_TYPE:
            await alter_broker(broker, resource, validate_only)
        else:
            raise InvalidRequest(f"Unsupported resource type {resource.resource_type}")
    except KafkaError as error:
        result.update(error_code=error.code, error_message=error.message)
    return result


async def handle(ctx, request):
    responses = [
        await alter_resource(ctx.broker, resource, request.validate_only, _alter_topic, _alter_broker)
        for resource in request.resources
    ]
    return ctx.respond({"throttle_time": 0, "responses": responses})
