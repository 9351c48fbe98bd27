"""Group coordinator settings, with Kafka's broker config names and defaults.

Owns ``CoordinatorConfig`` (an immutable value; thread-safe). The broker builds it from its
``group.*`` / ``offsets.*`` / ``offset.*`` settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.coordinator.records import OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT

JAVA_INT_MAX = 2**31 - 1


@dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    group_initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    group_min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    group_max_session_timeout_ms: int = 1_800_000  # group.max.session.timeout.ms
    group_max_size: int = JAVA_INT_MAX  # group.max.size
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    offsets_topic_num_partitions: int = OFFSETS_TOPIC_NUM_PARTITIONS_DEFAULT
    offsets_retention_minutes: int = 10080  # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600_000  # offsets.retention.check.interval.ms
    new_member_join_timeout_ms: int = 300_000  # GroupCoordinator.NewMemberJoinTimeoutMs

    @property
    def offsets_retention_ms(self) -> int:
        return self.offsets_retention_minutes * 60_000
