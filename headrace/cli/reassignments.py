"""Partition reassignment for ``headrace cluster reassign|decommission``, as Kafka's
kafka-reassign-partitions.sh does it, through AlterPartitionReassignments (45) and
ListPartitionReassignments (46) sent to the controller with headrace's blocking wire client
(confluent-kafka has neither call).

Formats: Kafka's reassignment JSON file, ``{"version":1,"partitions":[{"topic":"t",
"partition":0,"replicas":[3,1]}, ...]}`` (``log_dirs`` accepted and ignored: one log dir per
broker). ``plan_decommission`` builds such a plan moving every replica off one broker: each
replica on it is replaced, in place (so a preferred leader's successor is preferred), by the
live broker outside the partition holding the fewest replicas so far (the lowest id on ties).

Errors a user can fix (no controller, a malformed file, no broker to move to) are
``UserError``. Stateless; used from the CLI's main thread.
"""

from __future__ import annotations

import json
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

from headrace.cli.common import UserError
from headrace.client.broker_connection import BrokerConnection, WireClientError
from headrace.errors import error_for_code

ALTER_PARTITION_REASSIGNMENTS_KEY = 45
LIST_PARTITION_REASSIGNMENTS_KEY = 46
CLIENT_ID = "headrace-cli"
Targets = dict[tuple[str, int], tuple[int, ...] | None]


def read_reassignment_file(path: Path) -> Targets:
    """(topic, partition) -> replicas of Kafka's reassignment JSON file."""
    try:
        document = json.loads(path.read_text())
        entries = document["partitions"]
        return {(str(e["topic"]), int(e["partition"])): tuple(int(r) for r in e["replicas"])
                for e in entries}
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path} is not a reassignment JSON file ({error!r}); expected "
                        '{"version":1,"partitions":[{"topic":...,"partition":...,"replicas":[...]}]}') from None


def reassignment_document(targets: Targets) -> dict[str, Any]:
    return {"version": 1, "partitions": [
        {"topic": topic, "partition": partition, "replicas": list(replicas or ())}
        for (topic, partition), replicas in sorted(targets.items())]}


def current_replicas(metadata: Any) -> dict[tuple[str, int], tuple[int, ...]]:
    """(topic, partition) -> replicas, from confluent-kafka's ClusterMetadata."""
    return {(name, index): tuple(partition.replicas)
            for name, topic in metadata.topics.items()
            for index, partition in topic.partitions.items()}


def plan_decommission(metadata: Any, broker_id: int) -> Targets:
    """Every partition with a replica on ``broker_id``, reassigned off it."""
    assigned = current_replicas(metadata)
    others = sorted(b for b in metadata.brokers if b != broker_id)
    load = {b: 0 for b in others}
    for replicas in assigned.values():
        for replica in replicas:
            if replica in load:
                load[replica] += 1
    plan: Targets = {}
    for key, replicas in sorted(assigned.items()):
        if broker_id not in replicas:
            continue
        candidates = [b for b in others if b not in replicas]
        if not candidates:
            raise UserError(f"no live broker outside {list(replicas)} can take "
                            f"{key[0]}-{key[1]}'s replica from broker {broker_id}")
        successor = min(candidates, key=lambda b: (load[b], b))
        load[successor] += 1
        plan[key] = tuple(successor if r == broker_id else r for r in replicas)
    return plan


def read_topics_to_move_file(path: Path) -> list[str]:
    """The topics of Kafka's --topics-to-move-json-file: {"version":1,"topics":[{"topic":"t"}]}."""
    try:
        return [str(entry["topic"]) for entry in json.loads(path.read_text())["topics"]]
    except OSError as error:
        raise UserError(f"cannot read {path}: {error.strerror}") from None
    except (ValueError, KeyError, TypeError) as error:
        raise UserError(f"{path} is not a topics-to-move JSON file ({error!r}); expected "
                        '{"version":1,"topics":[{"topic":...}]}') from None


def plan_generate(metadata: Any, topics: list[str], broker_list: list[int]) -> tuple[Targets, Targets]:
    """(current, proposed) assignments of ``topics`` over ``broker_list``, as
    kafka-reassign-partitions --generate: each topic's partitions placed again by Kafka's
    rack-unaware assignment, keeping its replication factor."""
    from headrace.cluster.zookeeper_records import assign_replicas_to_brokers
    from headrace.errors import KafkaError

    current = current_replicas(metadata)
    missing = [t for t in topics if t not in metadata.topics]
    if missing:
        raise UserError(f"topic(s) {', '.join(missing)} do not exist")
    moved: Targets = {}
    proposed: Targets = {}
    for topic in topics:
        partitions = sorted(metadata.topics[topic].partitions)
        replication_factor = len(current[(topic, partitions[0])]) if partitions else 0
        try:
            placed = assign_replicas_to_brokers(broker_list, len(partitions), replication_factor)
        except KafkaError as error:
            raise UserError(f"{topic}: {error.message}") from None
        for index, partition in enumerate(partitions):
            moved[(topic, partition)] = current[(topic, partition)]
            proposed[(topic, partition)] = placed[index]
    return moved, proposed


def controller_connection(metadata: Any, timeout_ms: int) -> BrokerConnection:
    controller = getattr(metadata, "controller_id", -1)
    broker = metadata.brokers.get(controller)
    if broker is None:
        raise UserError("the cluster has no controller right now; try again")
    try:
        return BrokerConnection((broker.host, broker.port), CLIENT_ID, request_timeout_ms=timeout_ms)
    except (OSError, WireClientError) as error:
        raise UserError(f"controller {broker.host}:{broker.port} failed: {error}") from None


def alter(metadata: Any, targets: Targets, timeout_ms: int) -> dict[tuple[str, int], str]:
    """Send the reassignments (None cancels); (topic, partition) -> "ok" or Kafka's error name."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), replicas in sorted(targets.items()):
        topics.setdefault(topic, []).append({
            "partition_index": partition, "replicas": None if replicas is None else list(replicas)})
    with controller_connection(metadata, timeout_ms) as connection:
        response = _request(connection, ALTER_PARTITION_REASSIGNMENTS_KEY, {
            "timeout": _timeout(timeout_ms),
            "topics": [{"name": name, "partitions": parts} for name, parts in topics.items()]})
    _raise_top_level(response)
    return {(topic.name, p.partition_index): _result_name(p.error_code, p.error_message)
            for topic in response.responses for p in topic.partitions}


def list_ongoing(metadata: Any, timeout_ms: int, topics: list[str] | None = None
                 ) -> dict[tuple[str, int], dict[str, list[int]]]:
    """The ongoing reassignments (of ``topics`` only, when given)."""
    asked = None if topics is None else [
        {"name": name, "partition_indexes": sorted(metadata.topics[name].partitions)}
        for name in topics if name in metadata.topics]
    with controller_connection(metadata, timeout_ms) as connection:
        response = _request(connection, LIST_PARTITION_REASSIGNMENTS_KEY,
                            {"timeout": _timeout(timeout_ms), "topics": asked})
    _raise_top_level(response)
    return {(topic.name, p.partition_index): {
        "replicas": list(p.replicas), "adding_replicas": list(p.adding_replicas),
        "removing_replicas": list(p.removing_replicas)}
        for topic in response.topics for p in topic.partitions}


def _request(connection: BrokerConnection, api_key: int, values: dict[str, Any]) -> Any:
    try:
        version = connection.version_for(api_key, (0, 1) if api_key == ALTER_PARTITION_REASSIGNMENTS_KEY
                                         else (0, 0))
        return connection.request_values(api_key, version, values)
    except (OSError, WireClientError) as error:
        raise UserError(f"the controller failed: {error}") from None


def _timeout(timeout_ms: int) -> timedelta:
    return timedelta(milliseconds=timeout_ms)


def _raise_top_level(response: Any) -> None:
    if response.error_code:
        error = error_for_code(int(response.error_code), response.error_message or "")
        raise UserError(f"{error_name(error.code)}: {response.error_message or 'refused'} "
                        "(the controller may have moved; try again)")


def error_name(code: int) -> str:
    """Kafka's name of an error code: INVALID_REPLICA_ASSIGNMENT for 39."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", type(error_for_code(int(code))).__name__).upper()


def _result_name(code: int, message: str | None) -> str:
    if not code:
        return "ok"
    return f"{error_name(code)}: {message}" if message else error_name(code)


# --- throttles, as kafka-reassign-partitions --throttle sets and --verify removes them -------

LEADER_RATE, FOLLOWER_RATE = "leader.replication.throttled.rate", "follower.replication.throttled.rate"
LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"


def throttle_plan(current: dict[tuple[str, int], tuple[int, ...]], targets: Targets
                  ) -> tuple[dict[str, dict[str, str]], set[int]]:
    """(topic -> its throttled-replica configs, the brokers whose rates to set) for the
    partitions that move: the leader side throttles their current replicas, the follower side
    the replicas being added ("partition:broker" lists), on every broker involved."""
    leader_entries: dict[str, list[str]] = {}
    follower_entries: dict[str, list[str]] = {}
    brokers: set[int] = set()
    for (topic, partition), target in sorted(targets.items()):
        existing = current.get((topic, partition), ())
        moving = [b for b in target or () if b not in existing]
        if not moving:
            continue
        leader_entries.setdefault(topic, []).extend(f"{partition}:{b}" for b in existing)
        follower_entries.setdefault(topic, []).extend(f"{partition}:{b}" for b in moving)
        brokers |= set(existing) | set(moving)
    configs = {topic: {LEADER_REPLICAS: ",".join(leader_entries[topic]),
                       FOLLOWER_REPLICAS: ",".join(follower_entries[topic])}
               for topic in leader_entries}
    return configs, brokers


def set_throttles(admin: Any, topic_configs: dict[str, dict[str, str]], brokers: set[int],
                  rate_bytes_per_s: int, timeout_ms: int) -> None:
    rates = {LEADER_RATE: str(rate_bytes_per_s), FOLLOWER_RATE: str(rate_bytes_per_s)}
    _alter_configs(admin, [("topic", topic, configs) for topic, configs in topic_configs.items()]
                   + [("broker", str(broker), rates) for broker in sorted(brokers)], timeout_ms)


def clear_throttles(admin: Any, topics: set[str], brokers: set[int], timeout_ms: int) -> None:
    _alter_configs(admin, [("topic", t, dict.fromkeys((LEADER_REPLICAS, FOLLOWER_REPLICAS)))
                           for t in sorted(topics)]
                   + [("broker", str(b), dict.fromkeys((LEADER_RATE, FOLLOWER_RATE)))
                      for b in sorted(brokers)], timeout_ms)


def _alter_configs(admin: Any, changes: list[tuple[str, str, dict[str, str | None]]],
                   timeout_ms: int) -> None:
    """IncrementalAlterConfigs: a value SETs, None DELETEs."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    from headrace.cli.common import wait_all

    kinds = {"topic": ResourceType.TOPIC, "broker": ResourceType.BROKER}
    resources = [ConfigResource(kinds[kind], name, incremental_configs=[
        ConfigEntry(key, value, incremental_operation=AlterConfigOpType.SET if value is not None
                    else AlterConfigOpType.DELETE) for key, value in configs.items()])
        for kind, name, configs in changes]
    # librdkafka sends a broker's configs to that broker: one broker resource per call
    topics = [r for r in resources if r.restype == ResourceType.TOPIC]
    batches = ([topics] if topics else []) + [[r] for r in resources if r.restype == ResourceType.BROKER]
    for batch in batches:
        wait_all(admin.incremental_alter_configs(batch, request_timeout=timeout_ms / 1000), timeout_ms)
