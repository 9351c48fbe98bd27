"""Topic configuration: Kafka's topic configs, their defaults, broker synonyms and validation.

Owns ``TOPIC_CONFIGS`` (one ``ConfigDef`` per topic config Kafka defines that headrace honours,
with Kafka's name, type, default, valid range and broker-level synonyms) and ``LogConfig``, the
frozen per-partition view built from topic overrides over broker properties.

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

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from headrace.errors import InvalidConfig

INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
LONG_MIN = -(2**63)
INT_MIN = -(2**31)
MS_PER_MINUTE = 60_000
MS_PER_HOUR = 3_600_000

TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")
CLEANUP_POLICIES = ("compact", "delete")
COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")


@dataclass(frozen=True, slots=True)
class ConfigDef:
    """One topic config: Kafka name, type ("int", "long", "double", "string", "list"),
    default (already parsed), the inclusive range or allowed values, and the broker
    synonyms as (broker key, multiplier to the topic unit) in precedence order."""

    name: str
    type: str
    default: object
    doc: str
    broker_synonyms: tuple[tuple[str, int], ...] = ()
    min_value: float | None = None
    max_value: float | None = None
    allowed: tuple[str, ...] = ()

    @property
    def field_name(self) -> str:
        return self.name.replace(".", "_")


def _def(name: str, type_: str, default: object, doc: str, synonyms=(), lo=None, hi=None,
         allowed=()) -> ConfigDef:
    return ConfigDef(name, type_, default, doc, tuple(synonyms), lo, hi, tuple(allowed))


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


def _parse_value(definition: ConfigDef, raw: str, key: str, multiplier: int = 1) -> object:
    if definition.type in ("int", "long", "double"):
        value = _parse_number(definition, raw, multiplier, key)
        _check_range(definition, value, raw, key)
        return value
    if definition.type == "list":
        items = tuple(item.strip() for item in str(raw).split(",") if item.strip())
        bad = [item for item in items if item not in definition.allowed]
        if bad or not items:
            raise _invalid(key, raw, f"String must be one of: {', '.join(definition.allowed)}")
        return tuple(dict.fromkeys(sorted(items)))
    value = str(raw).strip()
    if definition.allowed and value not in definition.allowed:
        raise _invalid(key, raw, f"String must be one of: {', '.join(definition.allowed)}")
    return value


def _format_value(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


def validate_topic_overrides(overrides: dict[str, str]) -> dict[str, str]:
    """Check every key is a topic config and every value parses and lies in range; return the
    overrides normalised to their canonical text. InvalidConfig names the bad key and value."""
    normalised: dict[str, str] = {}
    for key, raw in overrides.items():
        definition = TOPIC_CONFIGS.get(key)
        if definition is None:
            raise InvalidConfig(f"Unknown topic config name: {key}")
        normalised[key] = _format_value(_parse_value(definition, raw, key))
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


_FieldParser = Callable[[ConfigDef, Mapping[str, str]], object]


@dataclass(frozen=True, slots=True)
class LogConfig:
    """The effective configuration of one partition log (Kafka topic config names in
    snake_case)."""

    segment_bytes: int = 1073741824
    segment_ms: int = 604800000
    segment_jitter_ms: int = 0
    segment_index_bytes: int = 10485760
    index_interval_bytes: int = 4096
    flush_messages: int = LONG_MAX
    flush_ms: int = LONG_MAX
    retention_ms: int = 604800000
    retention_bytes: int = -1
    max_message_bytes: int = 1048588
    message_timestamp_type: str = "CreateTime"
    cleanup_policy: tuple[str, ...] = ("delete",)
    compression_type: str = "producer"
    min_cleanable_dirty_ratio: float = 0.5
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    delete_retention_ms: int = 86400000
    min_insync_replicas: int = 1
    message_timestamp_before_max_ms: int = LONG_MAX
    message_timestamp_after_max_ms: int = 3600000
    file_delete_delay_ms: int = 60000

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
        return cls(**values)

    def to_properties(self) -> dict[str, str]:
        return {
            definition.name: _format_value(getattr(self, definition.field_name))
            for definition in TOPIC_CONFIGS.values()
        }

    @property
    def delete_enabled(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def compact_enabled(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"


assert {f.name for f in fields(LogConfig)} == {d.field_name for d in _DEFS}


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
