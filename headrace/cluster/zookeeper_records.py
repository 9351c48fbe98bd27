"""The JSON records headrace keeps in ZooKeeper, exactly as Kafka's ZooKeeper mode wrote them.

Owns: the codecs (encode to bytes, decode from bytes) of every znode of the cluster, one frozen
dataclass per record, with Kafka 3.x's field names and versions (``kafka.zk.ZkData``), so that a
headrace cluster's ZooKeeper reads like a Kafka cluster's:

- ``/brokers/ids/<id>`` (ephemeral): ``BrokerRegistration``, version 5
  ``{"version":5,"host":h,"port":p,"endpoints":["PLAINTEXT://h:p"],"jmx_port":-1,
  "timestamp":"<ms>","listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},
  "features":{},"rack":r}`` (versions 1-5 decode);
- ``/brokers/topics/<t>``: ``TopicAssignment`` ``{"version":3,"topic_id":"<base64 uuid>",
  "partitions":{"0":[1,2]},"adding_replicas":{},"removing_replicas":{}}``;
- ``/brokers/topics/<t>/partitions/<p>/state``: ``PartitionState`` ``{"version":1,"leader":L,
  "leader_epoch":E,"controller_epoch":C,"isr":[..]}`` (``leader_recovery_state`` only when not
  RECOVERED (0), as Kafka writes it); ``leader`` -1 is Kafka's ``LeaderAndIsr.NoLeader``;
- ``/controller`` (ephemeral): ``ControllerRegistration`` ``{"version":2,"brokerid":N,
  "timestamp":"<ms>","kraftControllerEpoch":-1}``;
- ``/controller_epoch``: the decimal epoch, e.g. ``"3"``;
- ``/config/topics/<t>``: ``{"version":1,"config":{"k":"v"}}`` (values are strings);
- ``/config/changes/config_change_<seq>`` (persistent sequential): ``{"version":2,
  "entity_path":"topics/<t>"}``;
- ``/admin/delete_topics/<t>``: no data (Kafka creates it empty);
- ``/admin/preferred_replica_election``: ``{"version":1,"partitions":[{"topic":t,"partition":p}]}``;
- ``/cluster/id``: ``{"version":"1","id":"<cluster id>"}``.

Also Kafka's rack-unaware replica assignment (``AdminUtils.assignReplicasToBrokers``): the first
replica of each partition round-robin from a random start index over the brokers sorted by id,
the others at an increasing shift. The randomness is injectable (``rng``) for tests.

A record that does not parse raises ``MalformedZnode`` (a ValueError) naming the field. Pure
functions and immutable values: thread-safe.
"""

from __future__ import annotations

import base64
import json
import random
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from headrace.errors import InvalidPartitions, InvalidReplicationFactor

NO_LEADER = -1  # Kafka's LeaderAndIsr.NoLeader
INITIAL_LEADER_EPOCH = 0
LEADER_RECOVERY_STATE_RECOVERED = 0
BROKER_REGISTRATION_VERSION = 5
TOPIC_ASSIGNMENT_VERSION = 3
PARTITION_STATE_VERSION = 1
CONTROLLER_REGISTRATION_VERSION = 2
CONFIG_ENTITY_VERSION = 1
CONFIG_CHANGE_NOTIFICATION_VERSION = 2
CONFIG_CHANGE_SEQUENCE_PREFIX = "config_change_"
NO_JMX_PORT = -1


class MalformedZnode(ValueError):
    """A znode's bytes are not the record its path promises."""


def _dump(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _load_object(data: bytes | None, what: str) -> dict:
    if not data:
        raise MalformedZnode(f"{what}: empty znode")
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise MalformedZnode(f"{what}: not JSON ({error})") from None
    if not isinstance(value, dict):
        raise MalformedZnode(f"{what}: not a JSON object")
    return value


def _int_field(record: Mapping, key: str, what: str) -> int:
    value = record.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise MalformedZnode(f"{what}: {key!r} is not an integer: {value!r}")
    return value


def _int_list(value: object, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or any(
        isinstance(item, bool) or not isinstance(item, int) for item in value
    ):
        raise MalformedZnode(f"{what}: not a list of integers: {value!r}")
    return tuple(value)


# --- topic ids: Kafka's Uuid.toString is URL-safe base64 without padding -----------------------

def topic_id_to_string(topic_id: bytes) -> str:
    return base64.urlsafe_b64encode(topic_id).decode().rstrip("=")


def topic_id_from_string(text: str) -> bytes:
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError):
        raise MalformedZnode(f"topic_id {text!r} is not base64") from None
    if len(raw) != 16:
        raise MalformedZnode(f"topic_id {text!r} is not 16 bytes")
    return raw


def new_topic_id() -> bytes:
    """A random topic id, never Kafka's reserved zero or one ids (``Uuid.randomUuid``)."""
    while True:
        raw = uuid.uuid4().bytes
        if raw not in (bytes(16), bytes(15) + b"\x01") and not topic_id_to_string(raw).startswith("-"):
            return raw


# --- /brokers/ids/<id> ------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    host: str
    port: int
    endpoints: tuple[str, ...]  # "LISTENER://host:port"
    timestamp_ms: int
    rack: str | None = None
    jmx_port: int = NO_JMX_PORT
    listener_security_protocols: Mapping[str, str] = field(
        default_factory=lambda: {"PLAINTEXT": "PLAINTEXT"}
    )


def encode_broker_registration(broker: BrokerRegistration) -> bytes:
    record = {
        "version": BROKER_REGISTRATION_VERSION, "host": broker.host, "port": broker.port,
        "endpoints": list(broker.endpoints), "jmx_port": broker.jmx_port,
        "timestamp": str(broker.timestamp_ms),
        "listener_security_protocol_map": dict(broker.listener_security_protocols),
        "features": {},
    }
    if broker.rack is not None:
        record["rack"] = broker.rack
    return _dump(record)


def decode_broker_registration(broker_id: int, data: bytes) -> BrokerRegistration:
    what = f"/brokers/ids/{broker_id}"
    record = _load_object(data, what)
    version = _int_field(record, "version", what)
    if version < 1:
        raise MalformedZnode(f"{what}: unsupported version {version}")
    if version == 1:
        host, port = record.get("host"), _int_field(record, "port", what)
        endpoints = (f"PLAINTEXT://{host}:{port}",)
    else:
        endpoints = record.get("endpoints")
        if not isinstance(endpoints, list) or not all(isinstance(e, str) for e in endpoints):
            raise MalformedZnode(f"{what}: 'endpoints' is not a list of strings")
        endpoints = tuple(endpoints)
    protocols = record.get("listener_security_protocol_map") or {"PLAINTEXT": "PLAINTEXT"}
    host, port = _first_endpoint_address(endpoints, record, what)
    return BrokerRegistration(
        broker_id=broker_id, host=host, port=port, endpoints=endpoints,
        timestamp_ms=int(record.get("timestamp", "-1")), rack=record.get("rack"),
        jmx_port=record.get("jmx_port", NO_JMX_PORT), listener_security_protocols=protocols,
    )


def _first_endpoint_address(endpoints: tuple[str, ...], record: Mapping, what: str) -> tuple[str, int]:
    """The host and port clients use: the first endpoint's (Kafka's top level host/port may be
    null/-1 when there is no PLAINTEXT listener)."""
    if not endpoints:
        return str(record.get("host")), _int_field(record, "port", what)
    _, _, address = endpoints[0].partition("://")
    host, _, port = address.rpartition(":")
    try:
        return host.strip("[]"), int(port)
    except ValueError:
        raise MalformedZnode(f"{what}: endpoint {endpoints[0]!r} has no port") from None


# --- /brokers/topics/<t> ----------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class TopicAssignment:
    topic_id: bytes | None
    partitions: Mapping[int, tuple[int, ...]]  # partition -> replicas, preferred leader first
    adding_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    removing_replicas: Mapping[int, tuple[int, ...]] = field(default_factory=dict)


def _encode_replica_map(replicas: Mapping[int, Sequence[int]]) -> dict[str, list[int]]:
    return {str(partition): list(ids) for partition, ids in sorted(replicas.items())}


def encode_topic_assignment(assignment: TopicAssignment) -> bytes:
    record: dict[str, object] = {
        "version": TOPIC_ASSIGNMENT_VERSION,
        "partitions": _encode_replica_map(assignment.partitions),
        "adding_replicas": _encode_replica_map(assignment.adding_replicas),
        "removing_replicas": _encode_replica_map(assignment.removing_replicas),
    }
    if assignment.topic_id is not None:
        record["topic_id"] = topic_id_to_string(assignment.topic_id)
    return _dump(record)


def _decode_replica_map(value: object, what: str) -> dict[int, tuple[int, ...]]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise MalformedZnode(f"{what}: replica map is not an object")
    try:
        return {int(key): _int_list(ids, what) for key, ids in value.items()}
    except ValueError as error:
        raise MalformedZnode(f"{what}: {error}") from None


def decode_topic_assignment(topic: str, data: bytes) -> TopicAssignment:
    what = f"/brokers/topics/{topic}"
    record = _load_object(data, what)
    topic_id = record.get("topic_id")
    return TopicAssignment(
        topic_id=topic_id_from_string(topic_id) if isinstance(topic_id, str) else None,
        partitions=_decode_replica_map(record.get("partitions"), what),
        adding_replicas=_decode_replica_map(record.get("adding_replicas"), what),
        removing_replicas=_decode_replica_map(record.get("removing_replicas"), what),
    )


# --- /brokers/topics/<t>/partitions/<p>/state -------------------------------------------------

@dataclass(frozen=True, slots=True)
class PartitionState:
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    controller_epoch: int
    leader_recovery_state: int = LEADER_RECOVERY_STATE_RECOVERED

    @property
    def has_leader(self) -> bool:
        return self.leader != NO_LEADER


def encode_partition_state(state: PartitionState) -> bytes:
    record: dict[str, object] = {
        "controller_epoch": state.controller_epoch, "leader": state.leader,
        "version": PARTITION_STATE_VERSION, "leader_epoch": state.leader_epoch,
        "isr": list(state.isr),
    }
    if state.leader_recovery_state != LEADER_RECOVERY_STATE_RECOVERED:
        record["leader_recovery_state"] = state.leader_recovery_state
    return _dump(record)


def decode_partition_state(data: bytes, what: str = "partition state") -> PartitionState:
    record = _load_object(data, what)
    recovery = record.get("leader_recovery_state", LEADER_RECOVERY_STATE_RECOVERED)
    return PartitionState(
        leader=_int_field(record, "leader", what),
        leader_epoch=_int_field(record, "leader_epoch", what),
        isr=_int_list(record.get("isr"), what),
        controller_epoch=_int_field(record, "controller_epoch", what),
        leader_recovery_state=recovery if isinstance(recovery, int) else 0,
    )


# --- /controller and /controller_epoch --------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ControllerRegistration:
    broker_id: int
    timestamp_ms: int
    kraft_controller_epoch: int = -1


def encode_controller_registration(controller: ControllerRegistration) -> bytes:
    return _dump({
        "version": CONTROLLER_REGISTRATION_VERSION, "brokerid": controller.broker_id,
        "timestamp": str(controller.timestamp_ms),
        "kraftControllerEpoch": controller.kraft_controller_epoch,
    })


def decode_controller_registration(data: bytes) -> ControllerRegistration:
    record = _load_object(data, "/controller")
    timestamp = record.get("timestamp", "-1")
    return ControllerRegistration(
        broker_id=_int_field(record, "brokerid", "/controller"),
        timestamp_ms=int(timestamp) if str(timestamp).lstrip("-").isdigit() else -1,
        kraft_controller_epoch=record.get("kraftControllerEpoch", -1),
    )


def encode_controller_epoch(epoch: int) -> bytes:
    return str(epoch).encode()


def decode_controller_epoch(data: bytes) -> int:
    try:
        return int(data.decode())
    except (UnicodeDecodeError, ValueError, AttributeError):
        raise MalformedZnode(f"/controller_epoch: not a decimal integer: {data!r}") from None


# --- /config/topics/<t> and /config/changes ---------------------------------------------------

def encode_entity_config(configs: Mapping[str, str]) -> bytes:
    return _dump({"version": CONFIG_ENTITY_VERSION, "config": dict(configs)})


def decode_entity_config(data: bytes | None) -> dict[str, str]:
    """Kafka reads a missing or empty config znode as no overrides."""
    if not data:
        return {}
    config = _load_object(data, "/config entity").get("config")
    if not isinstance(config, dict):
        return {}
    return {str(key): str(value) for key, value in config.items()}


def encode_config_change_notification(entity_type: str, entity_name: str) -> bytes:
    return _dump({
        "version": CONFIG_CHANGE_NOTIFICATION_VERSION, "entity_path": f"{entity_type}/{entity_name}",
    })


def decode_config_change_notification(data: bytes) -> tuple[str, str]:
    """(entity type, entity name) of a version 2 notification, e.g. ("topics", "orders")."""
    record = _load_object(data, "/config/changes")
    entity_path = record.get("entity_path")
    if _int_field(record, "version", "/config/changes") != 2 or not isinstance(entity_path, str):
        raise MalformedZnode(f"/config/changes: unsupported notification {record!r}")
    entity_type, _, entity_name = entity_path.partition("/")
    return entity_type, entity_name


# --- /admin/preferred_replica_election and /cluster/id ----------------------------------------

def encode_preferred_replica_election(partitions: Sequence[tuple[str, int]]) -> bytes:
    return _dump({"version": 1, "partitions": [
        {"topic": topic, "partition": partition} for topic, partition in partitions
    ]})


def decode_preferred_replica_election(data: bytes) -> tuple[tuple[str, int], ...]:
    what = "/admin/preferred_replica_election"
    entries = _load_object(data, what).get("partitions")
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise MalformedZnode(f"{what}: 'partitions' is not a list of objects")
    return tuple((str(e.get("topic")), _int_field(e, "partition", what)) for e in entries)


def encode_cluster_id(cluster_id: str) -> bytes:
    return _dump({"version": "1", "id": cluster_id})


def decode_cluster_id(data: bytes) -> str:
    cluster_id = _load_object(data, "/cluster/id").get("id")
    if not isinstance(cluster_id, str):
        raise MalformedZnode("/cluster/id: 'id' is not a string")
    return cluster_id


# --- Kafka's rack-unaware replica assignment --------------------------------------------------

def assign_replicas_to_brokers(
    broker_ids: Sequence[int],
    partition_count: int,
    replication_factor: int,
    *,
    fixed_start_index: int = -1,
    start_partition_id: int = -1,
    rng: random.Random | None = None,
) -> dict[int, tuple[int, ...]]:
    """Partition -> replicas (preferred leader first), as ``AdminUtils.assignReplicasToBrokers``
    without racks: brokers sorted by id, first replicas round-robin from a start index (random
    unless fixed), followers at a shift that grows by one after each full round of brokers."""
    if partition_count <= 0:
        raise InvalidPartitions("Number of partitions must be larger than 0.")
    if replication_factor <= 0:
        raise InvalidReplicationFactor("Replication factor must be larger than 0.")
    brokers = sorted(broker_ids)
    if replication_factor > len(brokers):
        raise InvalidReplicationFactor(
            f"Replication factor: {replication_factor} larger than available brokers: {len(brokers)}."
        )
    rng = rng or random.Random()
    start_index = fixed_start_index if fixed_start_index >= 0 else rng.randrange(len(brokers))
    shift = fixed_start_index if fixed_start_index >= 0 else rng.randrange(len(brokers))
    assignment = {}
    for partition in range(max(0, start_partition_id), max(0, start_partition_id) + partition_count):
        if partition > 0 and partition % len(brokers) == 0:
            shift += 1
        first = (partition + start_index) % len(brokers)
        followers = [brokers[_follower_index(first, shift, j, len(brokers))]
                     for j in range(replication_factor - 1)]
        assignment[partition] = (brokers[first], *followers)
    return assignment


def _follower_index(first_index: int, shift: int, replica: int, broker_count: int) -> int:
    return (first_index + 1 + (shift + replica) % (broker_count - 1)) % broker_count


def assign_added_partitions(
    broker_ids: Sequence[int],
    existing: Mapping[int, Sequence[int]],
    partition_count: int,
) -> dict[int, tuple[int, ...]]:
    """Replicas of the partitions CreatePartitions adds to reach ``partition_count``, as
    ``AdminZkClient.createNewPartitionsAssignment``: same replication factor as partition 0, the
    start index at the first broker whose id is >= partition 0's preferred leader."""
    if 0 not in existing:
        raise InvalidPartitions("partition 0 is missing from the existing assignment")
    if partition_count <= len(existing):
        raise InvalidPartitions(
            f"Topic currently has {len(existing)} partitions, {partition_count} would not be an increase."
        )
    brokers = sorted(broker_ids)
    first_leader = existing[0][0]
    start_index = next((i for i, broker in enumerate(brokers) if broker >= first_leader), 0)
    return assign_replicas_to_brokers(
        brokers, partition_count - len(existing), len(existing[0]),
        fixed_start_index=start_index, start_partition_id=len(existing),
    )
