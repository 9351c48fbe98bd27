"""Transaction coordinator settings, with Kafka's broker config names and defaults.

Owns ``TRANSACTION_CONFIGS``, the one declaration of the broker configs the transaction
coordinator reads (Kafka name, ConfigDef type, default; the broker's config table takes these
entries from here), and ``TransactionConfig`` (an immutable value; thread-safe), whose field
for a config is its name in snake case. ``from_properties`` builds it from the broker's
effective ``transaction.*`` / ``transactional.*`` values.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from types import MappingProxyType

from headrace.coordinator.config import CoordinatorConfigDef
from headrace.coordinator.transaction_records import TRANSACTION_STATE_NUM_PARTITIONS_DEFAULT

MARKER_RETRY_BACKOFF_MS = 100  # a partition whose marker failed is retried after this

TRANSACTION_CONFIGS: Mapping[str, CoordinatorConfigDef] = MappingProxyType({d.name: d for d in (
    CoordinatorConfigDef("transaction.max.timeout.ms", "int", 900_000),
    CoordinatorConfigDef("transactional.id.expiration.ms", "int", 604_800_000),
    CoordinatorConfigDef("transaction.state.log.num.partitions", "int",
                         TRANSACTION_STATE_NUM_PARTITIONS_DEFAULT),
    CoordinatorConfigDef("transaction.state.log.replication.factor", "short", 3),
    CoordinatorConfigDef("transaction.state.log.min.isr", "int", 2),
    CoordinatorConfigDef("transaction.state.log.segment.bytes", "int", 104_857_600),
    CoordinatorConfigDef("transaction.state.log.load.buffer.size", "int", 5_242_880),
    CoordinatorConfigDef("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int",
                         10_000),
    CoordinatorConfigDef("transaction.remove.expired.transaction.cleanup.interval.ms", "int",
                         3_600_000),
)})


def _default(name: str) -> int:
    return TRANSACTION_CONFIGS[name].default


@dataclass(frozen=True, slots=True)
class TransactionConfig:
    transaction_max_timeout_ms: int = _default("transaction.max.timeout.ms")
    transactional_id_expiration_ms: int = _default("transactional.id.expiration.ms")
    transaction_state_log_num_partitions: int = _default("transaction.state.log.num.partitions")
    transaction_state_log_replication_factor: int = _default(
        "transaction.state.log.replication.factor")
    transaction_state_log_min_isr: int = _default("transaction.state.log.min.isr")
    transaction_state_log_segment_bytes: int = _default("transaction.state.log.segment.bytes")
    transaction_state_log_load_buffer_size: int = _default(
        "transaction.state.log.load.buffer.size")
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = _default(
        "transaction.abort.timed.out.transaction.cleanup.interval.ms")
    transaction_remove_expired_transaction_cleanup_interval_ms: int = _default(
        "transaction.remove.expired.transaction.cleanup.interval.ms")
    marker_retry_backoff_ms: int = MARKER_RETRY_BACKOFF_MS

    @classmethod
    def from_properties(cls, properties: Mapping[str, str]) -> TransactionConfig:
        """From the broker's effective values of ``TRANSACTION_CONFIGS`` (absent: default)."""
        return cls(**{d.field_name: int(properties.get(d.name, d.default))
                      for d in TRANSACTION_CONFIGS.values()})


assert {d.field_name for d in TRANSACTION_CONFIGS.values()} <= {
    f.name for f in fields(TransactionConfig)}
