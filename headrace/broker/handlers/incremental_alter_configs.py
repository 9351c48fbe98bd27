"""IncrementalAlterConfigs (api key 44): change single configs of a topic or the broker.

Operations, as in Kafka (AlterConfigOp.OpType): SET (0) a value, DELETE (1) an override
(back to the broker's or Kafka's default), APPEND (2) and SUBTRACT (3) items of a list config
such as cleanup.policy, starting from the effective value. APPEND/SUBTRACT on a non-list config
is INVALID_CONFIG; an unknown operation, a config named twice, or a null value for SET/APPEND/
SUBTRACT is INVALID_REQUEST. Topic changes are validated as a whole and applied live and
persisted through ``LogManager.alter_topic_config``; broker changes (resource "", the
cluster-wide defaults, or this node's id) through ``BrokerConfig.alter_dynamic``, APPEND and
SUBTRACT starting from that level's value or else the config's default, as Kafka's
``prepareIncrementalConfigs``, both on a worker thread, not the append
thread (see ``alter_configs``). Runs on the event loop thread.
"""

from __future__ import annotations

from typing import Any

from headrace.broker.config import BROKER_CONFIGS
from headrace.broker.handlers.alter_configs import (
    alter_resource,
    apply_broker_changes,
    apply_topic_overrides,
    current_topic_overrides,
)
from headrace.broker.handlers.describe_configs import check_broker_resource
from headrace.errors import InvalidConfig, InvalidRequest
from headrace.storage.config import TOPIC_CONFIGS

API_KEY = 44
MIN_VERSION = 0
MAX_VERSION = 1

SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
_OPERATION_NAMES = {SET: "SET", DELETE: "DELETE", APPEND: "APPEND", SUBTRACT: "SUBTRACT"}


def _is_list_config(name: str) -> bool:
    """A topic list config, or a broker config that is a synonym of one."""
    for definition in TOPIC_CONFIGS.values():
        if definition.type != "list":
            continue
        if name == definition.name or any(key == name for key, _ in definition.broker_synonyms):
            return True
    return False


def _check_operation(config: Any) -> None:
    if config.config_operation not in _OPERATION_NAMES:
        raise InvalidRequest(f"Unknown operation type {config.config_operation}")
    if config.config_operation != DELETE and config.value is None:
        raise InvalidRequest(f"Null value not supported for : {config.name}")
    if config.config_operation in (APPEND, SUBTRACT) and not _is_list_config(config.name):
        raise InvalidConfig(
            f"Can't {_OPERATION_NAMES[config.config_operation]} to key {config.name} because "
            "its type is not LIST."
        )


def _split(value: str | None) -> list[str]:
    return [item.strip() for item in (value or "").split(",") if item.strip()]


def _list_result(operation: int, current: str | None, change: str) -> str:
    items = _split(current)
    if operation == APPEND:
        items += [item for item in _split(change) if item not in items]
    else:
        removed = set(_split(change))
        items = [item for item in items if item not in removed]
    return ",".join(items)


def _apply(values: dict[str, str | None], effective: dict[str, str], config: Any) -> None:
    _check_operation(config)
    if config.config_operation == SET:
        values[config.name] = config.value
    elif config.config_operation == DELETE:
        values[config.name] = None
    else:
        current = values.get(config.name, effective.get(config.name))
        values[config.name] = _list_result(config.config_operation, current, config.value)


async def _alter_topic(broker: Any, resource: Any, validate_only: bool) -> None:
    topic = resource.resource_name
    overrides: dict[str, str | None] = dict(current_topic_overrides(broker, topic))
    effective = broker.log_manager.topic(topic).config.to_properties()
    for config in resource.configs:
        if config.name not in TOPIC_CONFIGS:
            raise InvalidConfig(f"Unknown topic config name: {config.name}")
        _apply(overrides, effective, config)
    remaining = {name: value for name, value in overrides.items() if value is not None}
    await apply_topic_overrides(broker, topic, remaining, validate_only)


async def _alter_broker(broker: Any, resource: Any, validate_only: bool) -> None:
    check_broker_resource(broker, resource.resource_name)
    per_broker = resource.resource_name != ""
    current = {name: d.default for name, d in BROKER_CONFIGS.items() if d.default is not None}
    current.update(broker.config.dynamic_configs(per_broker))
    changes: dict[str, str | None] = {}
    for config in resource.configs:
        _apply(changes, current, config)
    await apply_broker_changes(broker, changes, validate_only, per_broker)


async def handle(ctx, request):
    responses = [
        await alter_resource(ctx.broker, resource, request.validate_only, _alter_topic, _alter_broker)
        for resource in request.resources
    ]
    return ctx.respond({"throttle_time": 0, "responses": responses})
