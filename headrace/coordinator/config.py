"""Group coordinator settings, with Kafka's broker config names and defaults.

Owns ``COORDINATOR_CONFIGS``, the one declaration of the broker configs the coordinator reads
(Kafka name, ConfigDef type, default) -- the broker's config table takes these entries from
here -- and ``CoordinatorConfig`` (an immutable value; thread-safe), whose field for a config
is its name in snake case and defaults to the declared default. ``from_properties`` builds it
from the broker's effective ``group.*`` / ``offsets.*`` / ``offset.*`` values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from headrace.coordinator.records import OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT

JAVA_INT_MAX = 2**31 - 1
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000  # GroupCoordinator.NewMemberJoinTimeoutMs (not a config)


@dataclass(frozen=True, slots=True)
class CoordinatorConfigDef:
    name: str  # Kafka's broker config name
    type: str  # Kafka's ConfigDef type, lower case
    default: int

    @property
    def field_name(self) -> str:
        return self.name.replace(".", "_")


COORDINATOR_CONFIGS: Mapping[str, CoordinatorConfigDef] = MappingProxyType({d.name: d for d in (
    CoordinatorConfigDef("group.initial.rebalance.delay.ms", "int", 3000),
    CoordinatorConfigDef("group.min.session.timeout.ms", "int", 6000),
    CoordinatorConfigDef("group.max.session.timeout.ms", "int", 1_800_000),
    CoordinatorConfigDef("group.max.size", "int", JAVA_INT_MAX),
    CoordinatorConfigDef("offset.metadata.max.bytes", "int", 4096),
    CoordinatorConfigDef("offsets.topic.num.partitions", "int",
                         OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT),
    CoordinatorConfigDef("offsets.retention.minutes", "int", 10080),
    CoordinatorConfigDef("offsets.retention.check.interval.ms", "long", 600_000),
)})


def _default(name: str) -> int:
    return COORDINATOR_CONFIGS[name].default


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    group_initial_rebalance_delay_ms: int = _default("group.initial.rebalance.delay.ms")
    group_min_session_timeout_ms: int = _default("group.min.session.timeout.ms")
    group_max_session_timeout_ms: int = _default("group.max.session.timeout.ms")
    group_max_size: int = _default("group.max.size")
    offset_metadata_max_bytes: int = _default("offset.metadata.max.bytes")
    offsets_topic_num_partitions: int = _default("offsets.topic.num.partitions")
    offsets_retention_minutes: int = _default("offsets.retention.minutes")
    offsets_retention_check_interval_ms: int = _default("offsets.retention.check.interval.ms")
    new_member_join_timeout_ms: int = NEW_MEMBER_JOIN_TIMEOUT_MS

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> CoordinatorConfig:
        """From the broker's effective values of ``COORDINATOR_CONFIGS`` (absent: default)."""
        return cls(**{d.field_name: int(properties.get(d.name, d.default))
                      for d in COORDINATOR_CONFIGS.values()})

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * 60_000


assert {d.field_name for d in COORDINATOR_CONFIGS.values()} <= {
    f.name for f in fields(CoordinatorConfig)}
