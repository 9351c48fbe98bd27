"""DescribeConfigs (api key 32): the effective configuration of topics and of this broker.

Owns the description of configs for the admin APIs: for a topic (resource type 2) every topic
config of ``headrace.storage.config.TOPIC_CONFIGS`` with its effective value and where it
came from (topic override, dynamic or static broker synonym, or Kafka's default); for the
broker (resource type 4) the entries of ``BrokerConfig.describe()``. Resource name "" is the
cluster-wide default, which describes only the configs set at that level, as in Kafka; this
node's id describes every broker config with its synonyms (per-broker, cluster-default, static
and default values, in that order).

``topic_config_descriptions`` is shared with CreateTopics (v5+ returns configs) and the alter
handlers use ``check_broker_resource``.

v0 (kio lacks it: wire.py reads it as v1 with include_synonyms false) answers without config
sources or synonyms, encoded here::

    throttle_time_ms int32, results [ error_code int16, error_message nullable string,
      resource_type int8, resource_name string, configs [ name string,
      value nullable string, read_only bool, is_default bool, is_sensitive bool ] ]

``is_default`` is false for every config, as Kafka 3.9 answers it: its ``ConfigHelper``
never sets the field, so v0 carries the schema's default (a v0 client cannot tell defaults
from overrides). Stateless; runs on the event loop thread.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from headrace.broker.config import BROKER_CONFIGS
from headrace.broker.context import RawResponse
from headrace.errors import InvalidRequest, KafkaError, UnknownTopicOrPartition
from headrace.protocol.wire import legacy_string
from headrace.storage.config import TOPIC_CONFIGS, ConfigDef, LogConfig

API_KEY = 32
MIN_VERSION = 0
MAX_VERSION = 4

NO_CONFIG_SOURCE_VERSION = 0
V0_IS_DEFAULT = False  # never set by Kafka 3.9's ConfigHelper
_INT16, _INT32 = struct.Struct(">h"), struct.Struct(">i")
_INT8, _V0_FLAGS = struct.Struct(">b"), struct.Struct(">???")  # read_only, is_default, sensitive

TOPIC_RESOURCE_TYPE = 2
BROKER_RESOURCE_TYPE = 4

# DescribeConfigsResponse.ConfigSource
DYNAMIC_TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5

# DescribeConfigsResponse.ConfigType (v3+)
CONFIG_TYPE_UNKNOWN = 0
_CONFIG_TYPES = {"boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6,
                 "list": 7, "class": 8, "password": 9}


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: int


@dataclass(frozen=True, slots=True)
class ConfigDescription:
    """One described config, version-independent."""

    name: str
    value: str | None
    source: int
    read_only: bool
    sensitive: bool
    synonyms: tuple[ConfigSynonym, ...]
    config_type: int
    documentation: str | None

    def to_response(self, include_synonyms: bool, include_documentation: bool) -> dict[str, Any]:
        synonyms = self.synonyms if include_synonyms else ()
        return {
            "name": self.name,
            "value": self.value,
            "read_only": self.read_only,
            "config_source": self.source,
            "is_sensitive": self.sensitive,
            "synonyms": [{"name": s.name, "value": s.value, "source": s.source} for s in synonyms],
            "config_type": self.config_type,
            "documentation": self.documentation if include_documentation else None,
        }


def broker_entries(broker: Any) -> dict[str, Any]:
    """BrokerConfig.describe() by name."""
    return {entry.name: entry for entry in broker.config.describe()}


def _broker_synonyms(definition: ConfigDef, entries: Mapping[str, Any]) -> list[ConfigSynonym]:
    """The broker-level synonyms of a topic config that have a value, explicitly set ones
    (in Kafka's precedence order) before defaults."""
    explicit: list[ConfigSynonym] = []
    defaults: list[ConfigSynonym] = []
    for key, _multiplier in definition.broker_synonyms:
        entry = entries.get(key)
        if entry is None or entry.value is None or str(entry.value) == "":
            continue
        synonym = ConfigSynonym(key, str(entry.value), entry.source)
        (defaults if synonym.source == DEFAULT_CONFIG else explicit).append(synonym)
    return explicit + defaults


def topic_config_descriptions(
    broker: Any, overrides: Mapping[str, str], log_config: LogConfig,
    entries: Mapping[str, Any] | None = None,
) -> list[ConfigDescription]:
    """Every topic config with its effective value, source and synonyms."""
    if entries is None:
        entries = broker_entries(broker)
    effective = log_config.to_properties()
    descriptions = []
    for name, definition in TOPIC_CONFIGS.items():
        synonyms = _broker_synonyms(definition, entries)
        if name in overrides:
            synonyms.insert(0, ConfigSynonym(name, overrides[name], DYNAMIC_TOPIC_CONFIG))
        source = synonyms[0].source if synonyms else DEFAULT_CONFIG
        descriptions.append(ConfigDescription(
            name=name, value=effective[name], source=source, read_only=False, sensitive=False,
            synonyms=tuple(synonyms), config_type=_CONFIG_TYPES.get(definition.type, 0),
            documentation=definition.doc,
        ))
    return descriptions


def _topic_descriptions(broker: Any, topic: str) -> list[ConfigDescription]:
    try:
        info = broker.log_manager.topic(topic)
    except UnknownTopicOrPartition:
        raise UnknownTopicOrPartition(f"The topic '{topic}' does not exist.") from None
    return topic_config_descriptions(broker, info.overrides, info.config)


def check_broker_resource(broker: Any, resource_name: str) -> None:
    """A broker resource names the cluster default ("") or this node; InvalidRequest else."""
    if resource_name == "":
        return
    try:
        broker_id = int(resource_name)
    except ValueError:
        raise InvalidRequest("Unable to parse broker name as a base 10 number.") from None
    if broker_id != broker.node_id:
        raise InvalidRequest(
            f"Unexpected broker id, expected {broker.node_id} or empty string, "
            f"but received {resource_name}"
        )


def _broker_config_type(name: str) -> int:
    definition = BROKER_CONFIGS.get(name)
    if definition is None:
        return CONFIG_TYPE_UNKNOWN
    return _CONFIG_TYPES.get(definition.type, CONFIG_TYPE_UNKNOWN)


def _broker_descriptions(broker: Any, resource_name: str) -> list[ConfigDescription]:
    check_broker_resource(broker, resource_name)
    descriptions = []
    for entry in broker.config.describe(per_broker=resource_name != ""):
        value = None if entry.sensitive else entry.value
        synonyms = tuple(ConfigSynonym(s.name, None if entry.sensitive else s.value, s.source)
                         for s in entry.synonyms)
        descriptions.append(ConfigDescription(
            name=entry.name, value=value, source=entry.source, read_only=entry.read_only,
            sensitive=entry.sensitive, synonyms=synonyms,
            config_type=_broker_config_type(entry.name), documentation=None,
        ))
    return descriptions


def _wanted(descriptions: Iterable[ConfigDescription],
            names: tuple[str, ...] | None) -> list[ConfigDescription]:
    """Filter by configuration_keys; null (and, for the clients that send it, empty) is all."""
    if not names:
        return list(descriptions)
    wanted = set(names)
    return [d for d in descriptions if d.name in wanted]


def _describe_resource(broker: Any, resource: Any, request: Any) -> dict[str, Any]:
    result = {"resource_type": resource.resource_type, "resource_name": resource.resource_name,
              "error_code": 0, "error_message": None, "configs": []}
    try:
        if resource.resource_type == TOPIC_RESOURCE_TYPE:
            descriptions = _topic_descriptions(broker, resource.resource_name)
        elif resource.resource_type == BROKER_RESOURCE_TYPE:
            descriptions = _broker_descriptions(broker, resource.resource_name)
        else:
            raise InvalidRequest(f"Unsupported resource type {resource.resource_type}")
    except KafkaError as error:
        result.update(error_code=error.code, error_message=error.message)
        return result
    include_documentation = getattr(request, "include_documentation", False)
    result["configs"] = [
        d.to_response(request.include_synonyms, include_documentation)
        for d in _wanted(descriptions, resource.configuration_keys)
    ]
    return result


async def handle(ctx, request):
    results = [_describe_resource(ctx.broker, resource, request) for resource in request.resources]
    if ctx.api_version == NO_CONFIG_SOURCE_VERSION:
        return _v0_response(results)
    return ctx.respond({"throttle_time": 0, "results": results})


def _v0_response(results: list[dict[str, Any]]) -> RawResponse:
    body = bytearray(_INT32.pack(0) + _INT32.pack(len(results)))  # throttle_time_ms, count
    for result in results:
        body += _INT16.pack(result["error_code"]) + legacy_string(result["error_message"])
        body += _INT8.pack(result["resource_type"]) + legacy_string(result["resource_name"])
        body += _INT32.pack(len(result["configs"]))
        for config in result["configs"]:
            body += legacy_string(config["name"]) + legacy_string(config["value"])
            body += _V0_FLAGS.pack(config["read_only"], V0_IS_DEFAULT, config["is_sensitive"])
    return RawResponse((bytes(body),), len(body))
