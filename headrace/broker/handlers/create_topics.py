"""CreateTopics (api key 19): validate and create topics in the log manager.

Validation follows Kafka's controller (ReplicationControlManager.createTopics), in its order,
each failure answered per topic with Kafka's error code and message:

0. an internal topic (``__consumer_offsets``, ``__transaction_state``): INVALID_REQUEST, with
   Kafka's message for its own ``__cluster_metadata``. Kafka lets clients create (and delete)
   its group and transaction topics; headrace's group coordinator fixes the offsets topic's
   layout at start-up (``offsets.topic.num.partitions``), so a client-made one would break
   every group: the broker alone creates them;
1. a name given twice in one request: INVALID_REQUEST (one result for the name);
2. the name (Kafka's rules: [a-zA-Z0-9._-], 1..249 characters, not "." or ".."):
   INVALID_TOPIC_EXCEPTION;
3. an existing topic: TOPIC_ALREADY_EXISTS; a name equal to an existing one once '.' and '_'
   are unified: INVALID_TOPIC_EXCEPTION;
4. the configs (a null value, an unknown name, a bad value): INVALID_CONFIG naming key and
   value;
5. manual assignments (INVALID_REQUEST unless partitions and replication factor are -1;
   INVALID_REPLICA_ASSIGNMENT unless every partition 0..n-1 is placed once on exactly this
   node), replication factor (-1 = default.replication.factor; 0 or < -1, or more than the
   one broker: INVALID_REPLICATION_FACTOR), partitions (-1 = num.partitions; 0 or < -1:
   INVALID_PARTITIONS).

Then, as Kafka's controller bounds the metadata records of one request to
``MAX_RECORDS_PER_USER_OP`` (one per topic, per config override and per partition), a request
over the bound creates nothing and every topic is answered POLICY_VIOLATION ("Unable to
perform excessively large batch operation."), checked before any topic is created; the log
manager also refuses partitions its file-descriptor budget cannot hold (POLICY_VIOLATION).

``validate_only`` (v1+) stops after validation. v0 and v1 (kio lacks them: wire.py reads v0
as v2 without validate_only, v1 is v2's request) answer without throttle time, encoded here::

    topics [ name string, error_code int16, error_message nullable string (v1) ]

v5+ responses carry the partition count, replication
factor and every config with its source. Runs on the event loop thread; the log manager
is changed on the broker's append thread (``BrokerState.run_append``).
"""

from __future__ import annotations

import re
import struct
import uuid
from collections import Counter
from dataclasses import dataclass
from typing import Any

from headrace.broker import cluster_admin
from headrace.broker.context import RawResponse
from headrace.broker.handlers.describe_configs import topic_config_descriptions
from headrace.broker.handlers.metadata import INTERNAL_TOPIC_NAMES
from headrace.errors import (
    InvalidConfig,
    InvalidPartitions,
    InvalidReplicaAssignment,
    InvalidReplicationFactor,
    InvalidRequest,
    InvalidTopic,
    KafkaError,
    PolicyViolation,
    TopicAlreadyExists,
)
from headrace.protocol.wire import legacy_string
from headrace.storage.config import LogConfig, validate_topic_overrides

API_KEY = 19
MIN_VERSION = 0
MAX_VERSION = 7

FIRST_ERROR_MESSAGE_VERSION = 1
FIRST_THROTTLE_TIME_VERSION = 2
_INT16, _INT32 = struct.Struct(">h"), struct.Struct(">i")

MAX_TOPIC_NAME_LENGTH = 249
_LEGAL_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
BROKERS_IN_CLUSTER = 1
MAX_RECORDS_PER_USER_OP = 10_000  # Kafka's QuorumController.MAX_RECORDS_PER_USER_OP


def validate_topic_name(name: str | None) -> None:
    """Kafka's Topic.validate; InvalidTopic with Kafka's message."""
    if not name:
        raise InvalidTopic("Topic name is illegal, it can't be empty")
    if name in (".", ".."):
        raise InvalidTopic('Topic name cannot be "." or ".."')
    if len(name) > MAX_TOPIC_NAME_LENGTH:
        raise InvalidTopic(
            f"Topic name is illegal, it can't be longer than {MAX_TOPIC_NAME_LENGTH} "
            f"characters, topic name: {name}"
        )
    if not _LEGAL_TOPIC_NAME.fullmatch(name):
        raise InvalidTopic(
            f'Topic name "{name}" is illegal, it contains a character other than '
            "ASCII alphanumerics, '.', '_' and '-'"
        )


def _unify_collision_chars(name: str) -> str:
    return name.replace(".", "_")


def _check_not_existing(name: str, existing: dict[str, Any]) -> None:
    if name in existing:
        raise TopicAlreadyExists(f"Topic '{name}' already exists.")
    unified = _unify_collision_chars(name)
    for other in existing:
        if _unify_collision_chars(other) == unified:
            raise InvalidTopic(f"Topic '{name}' collides with existing topic: {other}")


def _overrides(topic: Any) -> dict[str, str]:
    overrides: dict[str, str] = {}
    for config in topic.configs:
        if config.value is None:
            raise InvalidConfig(f"Null value not supported for topic configs: {config.name}")
        overrides[config.name] = config.value
    return validate_topic_overrides(overrides)


def _check_assignments(topic: Any, node_id: int) -> int:
    """The partition count of a manual assignment placed entirely on this node."""
    if topic.replication_factor != -1:
        raise InvalidRequest(
            "A manual partition assignment was specified, but replication factor was not set to -1."
        )
    if topic.num_partitions != -1:
        raise InvalidRequest(
            "A manual partition assignment was specified, but numPartitions was not set to -1."
        )
    seen: set[int] = set()
    for assignment in topic.assignments:
        if assignment.partition_index in seen:
            raise InvalidReplicaAssignment(
                f"Found multiple manual partition assignments for partition "
                f"{assignment.partition_index}"
            )
        seen.add(assignment.partition_index)
        check_manual_replicas(assignment.broker_ids, node_id)
    if seen != set(range(len(seen))):
        raise InvalidReplicaAssignment(
            f"Partitions must be numbered 0 to {len(seen) - 1}, but got {sorted(seen)}"
        )
    return len(seen)


def check_manual_replicas(broker_ids: tuple[int, ...], node_id: int) -> None:
    """Kafka's validateManualPartitionAssignment on a one-broker cluster."""
    if not broker_ids:
        raise InvalidReplicaAssignment(
            "The manual partition assignment includes an empty replica list."
        )
    for broker_id, count in sorted(Counter(broker_ids).items()):
        if broker_id != node_id:
            raise InvalidReplicaAssignment(
                f"The manual partition assignment includes broker {broker_id}, but no such "
                "broker is registered."
            )
        if count > 1:
            raise InvalidReplicaAssignment(
                f"The manual partition assignment includes the broker {broker_id} more than once."
            )


def _partition_count(topic: Any, config: Any, node_id: int) -> int:
    if topic.assignments:
        return _check_assignments(topic, node_id)
    if topic.replication_factor < -1 or topic.replication_factor == 0:
        raise InvalidReplicationFactor(
            "Replication factor must be larger than 0, or -1 to use the default value."
        )
    if topic.num_partitions < -1 or topic.num_partitions == 0:
        raise InvalidPartitions(
            "Number of partitions was set to an invalid non-positive value."
        )
    replication_factor = topic.replication_factor
    if replication_factor == -1:
        replication_factor = config.get_int("default.replication.factor")
    if replication_factor > BROKERS_IN_CLUSTER:
        raise InvalidReplicationFactor(
            f"Unable to replicate the partition {replication_factor} time(s): The target "
            f"replication factor of {replication_factor} cannot be reached because only "
            f"{BROKERS_IN_CLUSTER} broker(s) are registered."
        )
    if topic.num_partitions == -1:
        return config.get_int("num.partitions")
    return topic.num_partitions


@dataclass(frozen=True, slots=True)
class _Creation:
    """A topic that passed validation: what creating it takes."""

    name: str
    partitions: int
    overrides: dict[str, str]

    @property
    def metadata_records(self) -> int:
        """Kafka's controller writes one TopicRecord, one ConfigRecord per override and one
        PartitionRecord per partition."""
        return 1 + len(self.overrides) + self.partitions


def _plan(broker: Any, topic: Any) -> _Creation:
    validate_topic_name(topic.name)
    _check_not_existing(topic.name, broker.log_manager.topics())
    overrides = _overrides(topic)
    return _Creation(topic.name, _partition_count(topic, broker.config, broker.node_id),
                     overrides)


def check_records_per_user_op(records: int) -> None:
    """Kafka's QuorumController bounds the records of one request (BoundedList); past the
    bound the whole request fails with POLICY_VIOLATION."""
    if records > MAX_RECORDS_PER_USER_OP:
        raise PolicyViolation("Unable to perform excessively large batch operation.")


async def _create_one(broker: Any, plan: _Creation, validate_only: bool) -> dict[str, Any]:
    partitions, overrides = plan.partitions, plan.overrides
    info = await broker.run_append(
        broker.log_manager.create_topic, plan.name, partitions, overrides, validate_only
    )
    log_config = LogConfig.from_properties(overrides, broker.config.properties())
    descriptions = topic_config_descriptions(broker, overrides, log_config)
    topic_id = getattr(info, "topic_id", None) if not validate_only else None
    return {
        "name": plan.name,
        "topic_id": topic_id or uuid.UUID(int=0),
        "error_code": 0,
        "error_message": None,
        "num_partitions": partitions,
        "replication_factor": BROKERS_IN_CLUSTER,
        "configs": [
            {"name": d.name, "value": d.value, "read_only": d.read_only,
             "config_source": d.source, "is_sensitive": d.sensitive}
            for d in descriptions
        ],
    }


def _failure(name: str, error: KafkaError) -> dict[str, Any]:
    return {"name": name, "topic_id": uuid.UUID(int=0), "error_code": error.code,
            "error_message": error.message, "num_partitions": -1, "replication_factor": -1,
            "configs": []}


def _plans(broker: Any, topics: list[Any]) -> list[_Creation | KafkaError]:
    """One entry per distinct name, in request order: what to create, or why not."""
    counts = Counter(topic.name for topic in topics)
    plans: list[_Creation | KafkaError] = []
    answered: set[str] = set()
    for topic in topics:
        if topic.name in answered:
            continue
        answered.add(topic.name)
        if topic.name in INTERNAL_TOPIC_NAMES:
            plans.append(InvalidRequest(f"Creation of internal topic {topic.name} is prohibited."))
            continue
        if counts[topic.name] > 1:
            plans.append(InvalidRequest("Duplicate topic name."))
            continue
        try:
            plans.append(_plan(broker, topic))
        except KafkaError as error:
            plans.append(error)
    return plans


async def handle(ctx, request):
    if cluster_admin.runs_controller(ctx.broker):
        return await cluster_admin.create_topics(ctx, request)
    names = list(dict.fromkeys(topic.name for topic in request.topics))
    plans = _plans(ctx.broker, request.topics)
    try:
        check_records_per_user_op(sum(plan.metadata_records for plan in plans
                                      if isinstance(plan, _Creation)))
    except PolicyViolation as error:  # nothing is created: every topic gets the error
        return _respond(ctx, [_failure(name, error) for name in names])
    results = []
    for name, plan in zip(names, plans, strict=True):
        if isinstance(plan, KafkaError):
            results.append(_failure(name, plan))
            continue
        try:
            results.append(await _create_one(ctx.broker, plan, request.validate_only))
        except KafkaError as error:
            results.append(_failure(name, error))
    return _respond(ctx, results)


def _respond(ctx, results: list[dict[str, Any]]):
    if ctx.api_version >= FIRST_THROTTLE_TIME_VERSION:
        return ctx.respond({"throttle_time": 0, "topics": results})
    body = bytearray(_INT32.pack(len(results)))
    for result in results:
        body += legacy_string(result["name"]) + _INT16.pack(result["error_code"])
        if ctx.api_version >= FIRST_ERROR_MESSAGE_VERSION:
            body += legacy_string(result["error_message"])
    return RawResponse((bytes(body),), len(body))
