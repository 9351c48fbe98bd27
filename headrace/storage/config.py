"""Topic configuration: Kafka's topic configs, their defaults, broker synonyms and validation.

Owns ``TOPIC_CONFIGS`` (one ``ConfigDef`` per topic config Kafka 3.9 defines, with Kafka's
name, type, default, validation and broker-level synonyms) and ``LogConfig``, the frozen
per-partition view built from topic overrides over broker properties.

Every topic config Kafka 3.9 accepts is accepted, validated as Kafka's ``LogConfig`` does,
stored and described; those headrace has no machinery for say so in their documentation
(DescribeConfigs v3+ ``documentation``): the deprecated ``message.format.version`` (any valid
MetadataVersion string, ignored from 3.0 on, in Kafka too), ``preallocate``,
``unclean.leader.election.enable`` and the replication throttles (one replica), the
``compression.*.level`` configs (recompression uses each codec's default level) and the tiered
storage configs (``remote.storage.enable=true`` is refused as by a broker with tiered storage
disabled; ``remote.log.copy.disable``/``remote.log.delete.on.disable=true`` as in ZooKeeper
mode). The deprecated ``message.timestamp.difference.max.ms`` takes effect as in Kafka 3.9:
``message.timestamp.before.max.ms`` / ``after.max.ms`` left at Long.MAX_VALUE fall back to it.

Precedence, as in Kafka: a topic override (``retention.ms``) wins; else the first broker
synonym that is set, in Kafka's order (``log.retention.ms`` over ``log.retention.minutes``
over ``log.retention.hours``), converted to the topic unit; else the default. A broker value
of -1 for ``log.retention.ms`` means unlimited, as in Kafka.

Persisted form: ``to_properties`` / the overrides dict are Java-properties text
(``key=value`` lines) written by the log manager to
``<first log dir>/__topic_configs/<topic>``.

Errors: ``InvalidConfig("Invalid value -5 for configuration retention.ms: ...")``, naming the
key and the value, for unknown keys and bad values. Pure data; thread-safe.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from types import MappingProxyType

from headrace.errors import InvalidConfig

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
INT_MIN = -(2**31)
MS_PER_MINUTE = 60_000
MS_PER_HOUR = 3_600_000

GZIP_MIN_LEVEL, GZIP_MAX_LEVEL, GZIP_DEFAULT_LEVEL = 1, 9, -1  # java.util.zip.Deflater's
LZ4_MIN_LEVEL, LZ4_MAX_LEVEL, LZ4_DEFAULT_LEVEL = 1, 17, 9
ZSTD_MIN_LEVEL, ZSTD_MAX_LEVEL, ZSTD_DEFAULT_LEVEL = -131072, 22, 3
LOCAL_RETENTION_FROM_RETENTION = -2  # local.retention.*: -2 means "as retention.*"
DEFAULT_MESSAGE_FORMAT_VERSION = "3.0-IV1"
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES = ("compact", "delete")
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One topic config: Kafka name, type ("int", "long", "double", "boolean", "string",
    "list"), default (already parsed), the inclusive range or allowed values, the broker
    synonyms as (broker key, multiplier to the topic unit) in precedence order, an extra
    ``validator`` (the parsed value -> the reason it is invalid, or None) for Kafka's custom
    validators, and whether the broker synonyms may be altered dynamically (Kafka's
    ``DynamicLogConfig``: all but ``log.message.format.version``)."""

    name: str
    type: str
    default: object
    doc: str
    broker_synonyms: tuple[tuple[str, int], ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    allowed: tuple[str, ...] = ()
    validator: Callable[[object], str | None] | None = None
    broker_reconfigurable: bool = True

    @property
    def field_name(self) -> str:
        return self.name.replace(".", "_")


def _def(name: str, type_: str, default: object, doc: str, synonyms=(), lo=None, hi=None,
         allowed=(), validator=None, broker_reconfigurable=True) -> ConfigDef:
    return ConfigDef(name, type_, default, doc, tuple(synonyms), lo, hi, tuple(allowed),
                     validator, broker_reconfigurable)


# Kafka 3.9's MetadataVersion: release -> its sub-versions ("" for none). Every
# "release-subversion" is valid, and so is a production release on its own (all but 4.0).
_METADATA_VERSIONS = {
    "0.8.0": ("",), "0.8.1": ("",), "0.8.2": ("",), "0.9.0": ("",),
    "0.10.0": ("IV0", "IV1"), "0.10.1": ("IV0", "IV1", "IV2"), "0.10.2": ("IV0",),
    "0.11.0": ("IV0", "IV1", "IV2"), "1.0": ("IV0",), "1.1": ("IV0",), "2.0": ("IV0", "IV1"),
    "2.1": ("IV0", "IV1", "IV2"), "2.2": ("IV0", "IV1"), "2.3": ("IV0", "IV1"),
    "2.4": ("IV0", "IV1"), "2.5": ("IV0",), "2.6": ("IV0",), "2.7": ("IV0", "IV1", "IV2"),
    "2.8": ("IV0", "IV1"), "3.0": ("IV0", "IV1"), "3.1": ("IV0",), "3.2": ("IV0",),
    "3.3": ("IV0", "IV1", "IV2", "IV3"), "3.4": ("IV0",), "3.5": ("IV0", "IV1", "IV2"),
    "3.6": ("IV0", "IV1", "IV2"), "3.7": ("IV0", "IV1", "IV2", "IV3", "IV4"), "3.8": ("IV0",),
    "3.9": ("IV0",), "4.0": ("IV0", "IV1"),
}
_UNSTABLE_RELEASES = ("4.0",)
METADATA_VERSION_STRINGS = frozenset(
    {f"{release}-{sub}" if sub else release
     for release, subs in _METADATA_VERSIONS.items() for sub in subs}
    | {release for release in _METADATA_VERSIONS if release not in _UNSTABLE_RELEASES})


def _metadata_version_problem(value: object) -> str | None:
    """Kafka's ``MetadataVersion.fromVersionString``: the first three dot-separated parts of
    a 0.x version, or two of a later one, must name a version."""
    text = str(value)
    parts = text.split(".")
    kept = 3 if text.startswith("0.") else 2
    key = text if kept >= len(parts) else ".".join(parts[:kept])
    if key in METADATA_VERSION_STRINGS:
        return None
    return f"Version {text} is not a valid version"


_THROTTLED_REPLICA = re.compile(r"([0-9]+:[0-9]+)?")


def _throttled_replicas_problem(items: object) -> str | None:
    """Kafka's ``ThrottledReplicaListValidator``: '*' or partition:broker entries."""
    if "".join(items) == "*" or all(_THROTTLED_REPLICA.fullmatch(i) for i in items):
        return None
    return ("must be the literal '*' or a list of replicas in the following format: "
            "[partitionId]:[brokerId],[partitionId]:[brokerId],...")


def _gzip_level_problem(level: object) -> str | None:
    if level == GZIP_DEFAULT_LEVEL or GZIP_MIN_LEVEL <= level <= GZIP_MAX_LEVEL:
        return None
    return (f"Value must be between {GZIP_MIN_LEVEL} and {GZIP_MAX_LEVEL} or equal to "
            f"{GZIP_DEFAULT_LEVEL}")


def _disabled_feature(reason: str) -> Callable[[object], str | None]:
    return lambda enabled: reason if enabled else None


_REFUSED_IN_ZOOKEEPER_MODE = _disabled_feature(
    "It is invalid to set `remote.log.delete.on.disable` or `remote.log.copy.disable` under "
    "Zookeeper's mode.")
_NO_EFFECT = " No effect in headrace: "
_ONE_REPLICA = "a single broker holds the only replica of every partition."


_DEFS = (
    _def("segment.bytes", "int", 1073741824, "Bytes per segment file before rolling.",
         [("log.segment.bytes", 1)], 14, INT_MAX),
    _def("segment.ms", "long", 604800000, "Roll a segment after this many ms even if not full.",
         [("log.roll.ms", 1), ("log.roll.hours", MS_PER_HOUR)], 1, LONG_MAX),
    _def("segment.jitter.ms", "long", 0, "Maximum random jitter subtracted from segment.ms.",
         [("log.roll.jitter.ms", 1), ("log.roll.jitter.hours", MS_PER_HOUR)], 0, LONG_MAX),
    _def("segment.index.bytes", "int", 10485760, "Maximum size of the offset index in bytes.",
         [("log.index.size.max.bytes", 1)], 4, INT_MAX),
    _def("index.interval.bytes", "int", 4096, "Bytes of log between offset index entries.",
         [("log.index.interval.bytes", 1)], 0, INT_MAX),
    _def("flush.messages", "long", LONG_MAX, "fsync after this many messages.",
         [("log.flush.interval.messages", 1)], 1, LONG_MAX),
    _def("flush.ms", "long", LONG_MAX, "fsync after this many ms.",
         [("log.flush.interval.ms", 1)], 0, LONG_MAX),
    _def("retention.ms", "long", 604800000, "Delete segments older than this; -1: no limit.",
         [("log.retention.ms", 1), ("log.retention.minutes", MS_PER_MINUTE),
          ("log.retention.hours", MS_PER_HOUR)], -1, LONG_MAX),
    _def("retention.bytes", "long", -1, "Delete old segments beyond this size; -1: no limit.",
         [("log.retention.bytes", 1)], LONG_MIN, LONG_MAX),
    _def("max.message.bytes", "int", 1048588, "Largest record batch accepted, in bytes.",
         [("message.max.bytes", 1)], 0, INT_MAX),
    _def("message.timestamp.type", "string", "CreateTime",
         "Whether record timestamps are the producer's or the broker's append time.",
         [("log.message.timestamp.type", 1)], allowed=TIMESTAMP_TYPES),
    _def("cleanup.policy", "list", ("delete",), "delete, compact, or both.",
         [("log.cleanup.policy", 1)], allowed=CLEANUP_POLICIES),
    _def("compression.type", "string", "producer", "Final compression of stored batches.",
         [("compression.type", 1)], allowed=COMPRESSION_TYPES),
    _def("min.cleanable.dirty.ratio", "double", 0.5, "Dirty ratio that makes a log cleanable.",
         [("log.cleaner.min.cleanable.ratio", 1)], 0.0, 1.0),
    _def("min.compaction.lag.ms", "long", 0, "Minimum age of a record before compaction.",
         [("log.cleaner.min.compaction.lag.ms", 1)], 0, LONG_MAX),
    _def("max.compaction.lag.ms", "long", LONG_MAX, "Maximum age before a record is compacted.",
         [("log.cleaner.max.compaction.lag.ms", 1)], 1, LONG_MAX),
    _def("delete.retention.ms", "long", 86400000, "How long tombstones are kept.",
         [("log.cleaner.delete.retention.ms", 1)], 0, LONG_MAX),
    _def("min.insync.replicas", "int", 1, "Replicas that must acknowledge acks=all writes.",
         [("min.insync.replicas", 1)], 1, INT_MAX),
    _def("message.timestamp.before.max.ms", "long", LONG_MAX,
         "Largest allowed age of a CreateTime timestamp behind the broker's clock.",
         [("log.message.timestamp.before.max.ms", 1)], 0, LONG_MAX),
    _def("message.timestamp.after.max.ms", "long", 3600000,
         "Largest allowed lead of a CreateTime timestamp ahead of the broker's clock.",
         [("log.message.timestamp.after.max.ms", 1)], 0, LONG_MAX),
    _def("file.delete.delay.ms", "long", 60000, "Delay before a deleted file is removed.",
         [("log.segment.delete.delay.ms", 1)], 0, LONG_MAX),
    _def("message.timestamp.difference.max.ms", "long", LONG_MAX,
         "[DEPRECATED] Largest allowed difference between a CreateTime timestamp and the "
         "broker's clock; applies where message.timestamp.before.max.ms or "
         "message.timestamp.after.max.ms is left at its maximum.",
         [("log.message.timestamp.difference.max.ms", 1)], 0, LONG_MAX),
    _def("message.format.version", "string", DEFAULT_MESSAGE_FORMAT_VERSION,
         "[DEPRECATED] The message format version of appended batches: any valid "
         "MetadataVersion (0.10.0, 2.8, 3.0-IV1...). Ignored from 3.0 on, as by Kafka "
         "3.x: batches are always stored in the v2 format." + _NO_EFFECT + "deprecated.",
         [("log.message.format.version", 1)], validator=_metadata_version_problem,
         broker_reconfigurable=False),
    _def("message.downconversion.enable", "boolean", True,
         "Whether Fetch v0-3 consumers (older message formats) get records down-converted "
         "to magic 0/1; false answers them UNSUPPORTED_VERSION.",
         [("log.message.downconversion.enable", 1)]),
    _def("preallocate", "boolean", False,
         "Preallocate the file on disk when creating a new log segment." + _NO_EFFECT +
         "segments grow as they are written.", [("log.preallocate", 1)]),
    _def("unclean.leader.election.enable", "boolean", False,
         "Allow a replica not in the ISR to become leader." + _NO_EFFECT + _ONE_REPLICA,
         [("unclean.leader.election.enable", 1)]),
    _def("leader.replication.throttled.replicas", "list", (),
         "Replicas ('partition:broker' or '*') whose replication is throttled on the leader "
         "side, at the broker's leader.replication.throttled.rate, while their follower is "
         "out of the ISR.", validator=_throttled_replicas_problem),
    _def("follower.replication.throttled.replicas", "list", (),
         "Replicas ('partition:broker' or '*') whose replication is throttled on the follower "
         "side, at the broker's follower.replication.throttled.rate, until they have caught "
         "up.", validator=_throttled_replicas_problem),
    _def("compression.gzip.level", "int", GZIP_DEFAULT_LEVEL,
         "gzip level when compression.type is gzip." + _NO_EFFECT + "gzip's default level is "
         "used.", [("compression.gzip.level", 1)], validator=_gzip_level_problem),
    _def("compression.lz4.level", "int", LZ4_DEFAULT_LEVEL,
         "lz4 level when compression.type is lz4." + _NO_EFFECT + "lz4's default level is "
         "used.", [("compression.lz4.level", 1)], LZ4_MIN_LEVEL, LZ4_MAX_LEVEL),
    _def("compression.zstd.level", "int", ZSTD_DEFAULT_LEVEL,
         "zstd level when compression.type is zstd." + _NO_EFFECT + "zstd's default level "
         "is used.", [("compression.zstd.level", 1)], ZSTD_MIN_LEVEL, ZSTD_MAX_LEVEL),
    _def("remote.storage.enable", "boolean", False,
         "Tiered storage for the topic; true is refused: tiered storage is disabled in the "
         "broker.", validator=_disabled_feature(
             "Tiered Storage functionality is disabled in the broker. Topic cannot be "
             "configured with remote log storage.")),
    _def("local.retention.ms", "long", LOCAL_RETENTION_FROM_RETENTION,
         "Local retention of a tiered topic's segments; -2: retention.ms." + _NO_EFFECT +
         "no tiered storage.", [("log.local.retention.ms", 1)], -2, LONG_MAX),
    _def("local.retention.bytes", "long", LOCAL_RETENTION_FROM_RETENTION,
         "Local retention of a tiered topic's bytes; -2: retention.bytes." + _NO_EFFECT +
         "no tiered storage.", [("log.local.retention.bytes", 1)], -2, LONG_MAX),
    _def("remote.log.copy.disable", "boolean", False,
         "Stop copying a tiered topic's segments to remote storage; true is refused, as in "
         "ZooKeeper mode.", validator=_REFUSED_IN_ZOOKEEPER_MODE),
    _def("remote.log.delete.on.disable", "boolean", False,
         "Delete remote data when tiered storage is disabled; true is refused, as in "
         "ZooKeeper mode.", validator=_REFUSED_IN_ZOOKEEPER_MODE),
)
TOPIC_CONFIGS: Mapping[str, ConfigDef] = MappingProxyType({d.name: d for d in _DEFS})


def _invalid(name: str, raw: object, reason: str) -> InvalidConfig:
    return InvalidConfig(f"Invalid value {raw} for configuration {name}: {reason}")


def _parse_number(definition: ConfigDef, raw: str, multiplier: int, key: str) -> int | float:
    text = str(raw).strip()
    try:
        value: int | float = float(text) if definition.type == "double" else int(text)
    except ValueError:
        raise _invalid(key, raw, f"Not a number of type {definition.type.upper()}") from None
    if definition.type == "int" and not INT_MIN <= value <= INT_MAX:
        raise _invalid(key, raw, "Not a number of type INT")
    if definition.type == "long" and not LONG_MIN <= value <= LONG_MAX:
        raise _invalid(key, raw, "Not a number of type LONG")
    if multiplier != 1 and value > 0:
        value = min(value * multiplier, LONG_MAX)
    return value


def _check_range(definition: ConfigDef, value: int | float, raw: object, key: str) -> None:
    lo, hi = definition.min_value, definition.max_value
    if lo is not None and value < lo:
        raise _invalid(key, raw, f"Value must be at least {lo}")
    if hi is not None and value > hi:
        raise _invalid(key, raw, f"Value must be no more than {hi}")


def _parse_list(definition: ConfigDef, raw: str, key: str) -> tuple[str, ...]:
    items = tuple(item.strip() for item in str(raw).split(",") if item.strip())
    if not definition.allowed:
        return items
    bad = [item for item in items if item not in definition.allowed]
    if bad or not items:
        raise _invalid(key, raw, f"String must be one of: {', '.join(definition.allowed)}")
    return tuple(dict.fromkeys(sorted(items)))


def _parse_boolean(raw: str, key: str) -> bool:
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise _invalid(key, raw, "Expected value to be either true or false")
    return text == "true"


def _parse_typed(definition: ConfigDef, raw: str, key: str, multiplier: int) -> object:
    if definition.type in ("int", "long", "double"):
        value = _parse_number(definition, raw, multiplier, key)
        _check_range(definition, value, raw, key)
        return value
    if definition.type == "list":
        return _parse_list(definition, raw, key)
    if definition.type == "boolean":
        return _parse_boolean(raw, key)
    value = str(raw).strip()
    if definition.allowed and value not in definition.allowed:
        raise _invalid(key, raw, f"String must be one of: {', '.join(definition.allowed)}")
    return value


def _parse_value(definition: ConfigDef, raw: str, key: str, multiplier: int = 1) -> object:
    value = _parse_typed(definition, raw, key, multiplier)
    if definition.validator is not None:
        problem = definition.validator(value)
        if problem is not None:
            raise _invalid(key, raw, problem)
    return value


def format_config_value(value: object) -> str:
    """A parsed config value as Kafka writes it: lists comma-separated, booleans lower-case."""
    if isinstance(value, tuple):
        return ",".join(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def validate_topic_overrides(overrides: dict[str, str]) -> dict[str, str]:
    """Check every key is a topic config and every value parses and lies in range; return the
    overrides normalised to their canonical text. InvalidConfig names the bad key and value."""
    normalised: dict[str, str] = {}
    for key, raw in overrides.items():
        definition = TOPIC_CONFIGS.get(key)
        if definition is None:
            raise InvalidConfig(f"Unknown topic config name: {key}")
        normalised[key] = format_config_value(_parse_value(definition, raw, key))
    return normalised


def _broker_value(definition: ConfigDef, broker_properties: Mapping[str, str]) -> object:
    for key, multiplier in definition.broker_synonyms:
        raw = broker_properties.get(key)
        if raw is None or str(raw).strip() == "":
            continue
        if key == "log.retention.ms" and str(raw).strip() == "-1":
            return -1
        return _parse_value(definition, raw, key, multiplier)
    return definition.default


def _default(name: str):
    return TOPIC_CONFIGS[name].default


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The effective configuration of one partition log (Kafka topic config names in
    snake_case); each field defaults to its config's default in ``TOPIC_CONFIGS``."""

    segment_bytes: int = _default("segment.bytes")
    segment_ms: int = _default("segment.ms")
    segment_jitter_ms: int = _default("segment.jitter.ms")
    segment_index_bytes: int = _default("segment.index.bytes")
    index_interval_bytes: int = _default("index.interval.bytes")
    flush_messages: int = _default("flush.messages")
    flush_ms: int = _default("flush.ms")
    retention_ms: int = _default("retention.ms")
    retention_bytes: int = _default("retention.bytes")
    max_message_bytes: int = _default("max.message.bytes")
    message_timestamp_type: str = _default("message.timestamp.type")
    cleanup_policy: tuple[str, ...] = _default("cleanup.policy")
    compression_type: str = _default("compression.type")
    min_cleanable_dirty_ratio: float = _default("min.cleanable.dirty.ratio")
    min_compaction_lag_ms: int = _default("min.compaction.lag.ms")
    max_compaction_lag_ms: int = _default("max.compaction.lag.ms")
    delete_retention_ms: int = _default("delete.retention.ms")
    min_insync_replicas: int = _default("min.insync.replicas")
    message_timestamp_before_max_ms: int = _default("message.timestamp.before.max.ms")
    message_timestamp_after_max_ms: int = _default("message.timestamp.after.max.ms")
    file_delete_delay_ms: int = _default("file.delete.delay.ms")
    message_timestamp_difference_max_ms: int = _default("message.timestamp.difference.max.ms")
    message_format_version: str = _default("message.format.version")
    message_downconversion_enable: bool = _default("message.downconversion.enable")
    preallocate: bool = _default("preallocate")
    unclean_leader_election_enable: bool = _default("unclean.leader.election.enable")
    leader_replication_throttled_replicas: tuple[str, ...] = _default(
        "leader.replication.throttled.replicas")
    follower_replication_throttled_replicas: tuple[str, ...] = _default(
        "follower.replication.throttled.replicas")
    compression_gzip_level: int = _default("compression.gzip.level")
    compression_lz4_level: int = _default("compression.lz4.level")
    compression_zstd_level: int = _default("compression.zstd.level")
    remote_storage_enable: bool = _default("remote.storage.enable")
    local_retention_ms: int = _default("local.retention.ms")
    local_retention_bytes: int = _default("local.retention.bytes")
    remote_log_copy_disable: bool = _default("remote.log.copy.disable")
    remote_log_delete_on_disable: bool = _default("remote.log.delete.on.disable")
    # The configured text where the effective field differs (the timestamp limits falling
    # back to message.timestamp.difference.max.ms): what DescribeConfigs reports.
    configured_text: Mapping[str, str] = field(default_factory=dict, compare=False,
                                               repr=False)

    @classmethod
    def from_properties(
        cls, topic_overrides: dict[str, str], broker_properties: dict[str, str]
    ) -> LogConfig:
        validate_topic_overrides(topic_overrides)
        values: dict[str, object] = {}
        for definition in TOPIC_CONFIGS.values():
            raw = topic_overrides.get(definition.name)
            if raw is not None:
                values[definition.field_name] = _parse_value(definition, raw, definition.name)
            else:
                values[definition.field_name] = _broker_value(definition, broker_properties)
        configured_text = _apply_timestamp_difference_fallback(values)
        return cls(**values, configured_text=configured_text)

    def to_properties(self) -> dict[str, str]:
        """Every topic config's configured value as text (what DescribeConfigs reports)."""
        properties = {
            definition.name: format_config_value(getattr(self, definition.field_name))
            for definition in TOPIC_CONFIGS.values()
        }
        properties.update(self.configured_text)
        return properties

    @property
    def delete_enabled(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def compact_enabled(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"


assert {f.name for f in fields(LogConfig)} == {d.field_name for d in _DEFS} | {"configured_text"}


_TIMESTAMP_LIMITS = ("message.timestamp.before.max.ms", "message.timestamp.after.max.ms")


def _apply_timestamp_difference_fallback(values: dict[str, object]) -> dict[str, str]:
    """Kafka 3.9's ``LogConfig``: a timestamp limit left at Long.MAX_VALUE takes the
    deprecated ``message.timestamp.difference.max.ms``. Changes ``values`` (field names) to
    the effective limits; returns the configured text of the limits it changed."""
    difference = values["message_timestamp_difference_max_ms"]
    configured = {}
    for name in _TIMESTAMP_LIMITS:
        field_name = TOPIC_CONFIGS[name].field_name
        if values[field_name] == LONG_MAX and difference != LONG_MAX:
            configured[name] = format_config_value(values[field_name])
            values[field_name] = difference
    return configured


def parse_properties_text(text: str) -> dict[str, str]:
    """Java-properties subset: ``key=value`` lines, ``#``/``!`` comments, blank lines."""
    properties: dict[str, str] = {}
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped or stripped[0] in "#!":
            continue
        key, _, value = stripped.partition("=")
        properties[key.strip()] = value.strip()
    return properties


def format_properties_text(properties: Mapping[str, str]) -> str:
    return "".join(f"{key}={value}\n" for key, value in sorted(properties.items()))
