"""AlterPartitionReassignments (45) and ListPartitionReassignments (46) on real broker processes
and a real ZooKeeper, through the raw wire client and ``headrace cluster reassign|decommission``:
a reassignment started on the controller shows in the listing (and in ZooKeeper's assignment)
until cancelled (its new replica paused meanwhile), NOT_CONTROLLER from the other brokers,
Kafka's errors per partition; a partition moved from broker 1 to 3 whose records the new replica
copies and serves once it leads; a decommission that moves every replica and its records off a
broker; on a single node, the only possible target is the node itself."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from datetime import timedelta

import pytest

from headrace.cluster import topic_admin
from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from tests.broker.raw_client import RawClient
from tests.cli.cli_runner import assert_user_error, run, run_json
from tests.cluster.cluster_helpers import (
    close,
    controller_id,
    topic_states,
    wait_until,
    zookeeper_client,
)
from tests.conftest import BrokerProcess

METADATA, CREATE_TOPICS, ALTER_REASSIGNMENTS, LIST_REASSIGNMENTS = 3, 19, 45, 46
NOT_CONTROLLER, INVALID_REPLICA_ASSIGNMENT, NO_REASSIGNMENT_IN_PROGRESS = 41, 39, 85
UNKNOWN_TOPIC_OR_PARTITION = 3
RECORDS = 500
THROTTLE_BYTES_PER_S = 10_000_000  # far above what 500 small records need: nothing waits


def broker_config(broker: BrokerProcess, broker_id: int, name: str) -> str | None:
    """The broker's dynamic value of ``name`` (None when not set dynamically)."""
    rows = run_json("configs", "describe", "broker", str(broker_id), "--bootstrap-server",
                    broker.bootstrap)
    return next((r["value"] for r in rows if r["name"] == name
                 and r["source"] == "DYNAMIC_BROKER_CONFIG"), None)
REQUEST_TIMEOUT = timedelta(seconds=30)


def metadata_brokers(broker: BrokerProcess) -> set[int]:
    with RawClient(broker.bootstrap) as client:
        response = client.request(METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False})
    return {b.node_id for b in response.brokers}


def create_assigned_topic(broker: BrokerProcess, name: str, replicas: dict[int, list[int]]) -> int:
    topic = {"name": name, "num_partitions": -1, "replication_factor": -1, "configs": [],
             "assignments": [{"partition_index": p, "broker_ids": r} for p, r in replicas.items()]}
    with RawClient(broker.bootstrap) as client:
        return client.request(CREATE_TOPICS, 7, {"timeout": REQUEST_TIMEOUT, "validate_only": False,
                                                 "topics": [topic]}).topics[0].error_code


def alter(broker: BrokerProcess, topic: str, targets: dict[int, list[int] | None], version: int = 0):
    body = {"timeout": REQUEST_TIMEOUT, "topics": [{"name": topic, "partitions": [
        {"partition_index": p, "replicas": r} for p, r in targets.items()]}]}
    with RawClient(broker.bootstrap) as client:
        return client.request(ALTER_REASSIGNMENTS, version, body)


def alter_codes(response) -> dict[int, int]:
    return {p.partition_index: p.error_code for t in response.responses for p in t.partitions}


def listed(broker: BrokerProcess, topics=None):
    with RawClient(broker.bootstrap) as client:
        return client.request(LIST_REASSIGNMENTS, 0, {"timeout": REQUEST_TIMEOUT, "topics": topics})


class ThreeBrokers:
    def __init__(self, cluster_brokers, **overrides: str) -> None:
        self.brokers = {b: cluster_brokers.start(b, **overrides) for b in (1, 2, 3)}
        self.zk = zookeeper_client(cluster_brokers.zookeeper_connect)
        wait_until(lambda: all(metadata_brokers(b) == {1, 2, 3} for b in self.brokers.values()),
                   "every broker sees the three")

    def controller(self) -> int:
        return wait_until(lambda: controller_id(self.zk), "a controller")

    def assignment(self, topic: str) -> records.TopicAssignment:
        self.zk.sync(paths.topic_path(topic))
        return records.decode_topic_assignment(topic, self.zk.get(paths.topic_path(topic))[0])


@pytest.fixture
def three(cluster_brokers, request):
    cluster = ThreeBrokers(cluster_brokers, **getattr(request, "param", {}))
    yield cluster
    close(cluster.zk)


@contextlib.contextmanager
def paused(broker: BrokerProcess):
    """SIGSTOP the broker (its ZooKeeper session outlives the pause), SIGCONT after."""
    os.kill(broker.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(broker.pid, signal.SIGCONT)


# a paused broker stays registered meanwhile: the sessions outlive the test's pause
@pytest.mark.parametrize("three", [{"zookeeper.session.timeout.ms": "30000"}], indirect=True)
def test_a_reassignment_is_listed_until_cancelled_and_errors_are_kafkas(three):
    active = three.controller()
    controller = three.brokers[active]
    leader, spare = sorted(b for b in three.brokers if b != active)
    assert create_assigned_topic(controller, "moving", {0: [leader], 1: [leader]}) == 0
    wait_until(lambda: topic_states(three.zk, "moving", 2), "the states")
    with paused(three.brokers[spare]):  # the added replica cannot catch up meanwhile
        response = alter(controller, "moving", {0: [spare, leader], 1: [], 5: [1]})
        assert response.error_code == 0
        assert alter_codes(response) == {0: 0, 1: INVALID_REPLICA_ASSIGNMENT,
                                         5: UNKNOWN_TOPIC_OR_PARTITION}
        ongoing = three.assignment("moving")
        assert ongoing.partitions[0] == (spare, leader) and ongoing.adding_replicas == {0: (spare,)}
        [topic] = listed(controller).topics
        [entry] = topic.partitions
        assert (topic.name, entry.partition_index, list(entry.replicas), list(entry.adding_replicas),
                list(entry.removing_replicas)) == ("moving", 0, [spare, leader], [spare], [])
        assert alter(three.brokers[leader], "moving", {0: None}).error_code == NOT_CONTROLLER
        assert listed(three.brokers[leader]).error_code == NOT_CONTROLLER

        rows = run_json("cluster", "reassign", "--list", "--bootstrap-server", controller.bootstrap)
        assert rows == [{"topic": "moving", "partition": 0, "replicas": [spare, leader],
                         "adding_replicas": [spare], "removing_replicas": []}]
        rows = run_json("cluster", "reassign", "--cancel", "--topic", "moving", "--partition", "0",
                        "--replicas", f"{spare},{leader}", "--bootstrap-server", controller.bootstrap)
        assert rows == [{"topic": "moving", "partition": 0, "result": "ok"}]
        assert three.assignment("moving").partitions[0] == (leader,)
        assert listed(controller).topics == ()
        assert alter_codes(alter(controller, "moving", {0: None})) == {0: NO_REASSIGNMENT_IN_PROGRESS}


def test_reassign_command_from_a_json_file_and_its_user_errors(three, tmp_path):
    controller = three.brokers[three.controller()]
    assert create_assigned_topic(controller, "filed", {0: [2]}) == 0
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"version": 1, "partitions": [
        {"topic": "filed", "partition": 0, "replicas": [2, 9], "log_dirs": ["any", "any"]}]}))
    [row] = run_json("cluster", "reassign", "--execute", "--reassignment-json-file", str(plan),
                     "--bootstrap-server", controller.bootstrap)
    assert row["result"].startswith("INVALID_REPLICA_ASSIGNMENT: Replica assignment has brokers "
                                    "that are not alive")
    [row] = run_json("cluster", "reassign", "--verify", "--reassignment-json-file", str(plan),
                     "--bootstrap-server", controller.bootstrap)
    assert row["status"] == "not reassigning; replicas are [2]"
    assert_user_error(run("cluster", "reassign", "--bootstrap-server", controller.bootstrap),
                      "exactly one of")

    topics_file = tmp_path / "topics.json"
    topics_file.write_text(json.dumps({"version": 1, "topics": [{"topic": "filed"}]}))
    generated = run_json("cluster", "reassign", "--generate", "--topics-to-move-json-file",
                         str(topics_file), "--broker-list", "1,3",
                         "--bootstrap-server", controller.bootstrap)
    assert generated["current"]["partitions"] == [{"topic": "filed", "partition": 0, "replicas": [2]}]
    [proposed] = generated["proposed"]["partitions"]
    assert proposed["replicas"] in ([1], [3])
    plan.write_text(json.dumps(generated["proposed"]))
    [row] = run_json("cluster", "reassign", "--execute", "--reassignment-json-file", str(plan),
                     "--bootstrap-server", controller.bootstrap)
    assert row["result"] == "ok"
    wait_until(lambda: list(three.assignment("filed").partitions[0]) == proposed["replicas"],
               "the generated plan carried out")
    assert_user_error(run("cluster", "reassign", "--generate", "--broker-list", "1",
                          "--bootstrap-server", controller.bootstrap), "needs --topics-to-move")
    plan.write_text("{}")
    assert_user_error(run("cluster", "reassign", "--execute", "--reassignment-json-file", str(plan),
                          "--bootstrap-server", controller.bootstrap), "not a reassignment JSON")


def test_decommission_plans_every_replica_off_the_broker(three):
    controller = three.brokers[three.controller()]
    assert create_assigned_topic(controller, "spread", {0: [1, 2], 1: [2, 3], 2: [3, 1]}) == 0
    document = run_json("cluster", "decommission", "--broker-id", "2", "--dry-run",
                        "--bootstrap-server", controller.bootstrap)
    moved = {(e["topic"], e["partition"]): e["replicas"] for e in document["partitions"]}
    assert {k for k in moved if k[0] == "spread"} == {("spread", 0), ("spread", 1)}
    assert moved[("spread", 0)] == [1, 3] and moved[("spread", 1)] == [1, 3]
    assert all(2 not in replicas for replicas in moved.values())
    assert {r["result"] for r in document["results"]} == {"planned"}
    assert three.assignment("spread").partitions[0] == (1, 2)  # a dry run changes nothing


def test_single_node_reassignment_answers(broker):
    with RawClient(broker.bootstrap) as client:
        client.request(CREATE_TOPICS, 7, {"timeout": REQUEST_TIMEOUT, "validate_only": False, "topics": [
            {"name": "alone", "num_partitions": 1, "replication_factor": 1,
             "assignments": [], "configs": []}]})
    node = 1
    response = alter(broker, "alone", {0: [node]}, version=1)
    assert (response.error_code, alter_codes(response)) == (0, {0: 0})
    assert alter_codes(alter(broker, "alone", {0: [node, 7]})) == {0: INVALID_REPLICA_ASSIGNMENT}
    assert alter_codes(alter(broker, "alone", {0: None})) == {0: NO_REASSIGNMENT_IN_PROGRESS}
    assert alter_codes(alter(broker, "alone", {3: [node]})) == {3: UNKNOWN_TOPIC_OR_PARTITION}
    assert listed(broker).topics == ()


def test_reassigning_a_partition_from_broker_1_to_3_copies_its_records(three):
    from confluent_kafka import Consumer, Producer, TopicPartition

    controller = three.brokers[three.controller()]
    assert create_assigned_topic(controller, "carried", {0: [1]}) == 0
    bootstrap = ",".join(b.bootstrap for b in three.brokers.values())
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    values = [b"value-%d" % i for i in range(RECORDS)]
    for value in values:
        producer.produce("carried", value, partition=0)
    assert producer.flush(30) == 0

    rows = run_json("cluster", "reassign", "--execute", "--topic", "carried", "--partition", "0",
                    "--replicas", "3", "--throttle", str(THROTTLE_BYTES_PER_S),
                    "--bootstrap-server", controller.bootstrap)
    assert rows == [{"topic": "carried", "partition": 0, "result": "ok"}]
    throttled = topic_admin.read_topic_config(three.zk, "carried")
    assert (throttled["leader.replication.throttled.replicas"],
            throttled["follower.replication.throttled.replicas"]) == ("0:1", "0:3")
    assert {b: broker_config(three.brokers[b], b, "follower.replication.throttled.rate")
            for b in (1, 2, 3)} == {1: str(THROTTLE_BYTES_PER_S), 2: None, 3: str(THROTTLE_BYTES_PER_S)}
    wait_until(lambda: three.assignment("carried").partitions[0] == (3,), "RS = [3]")
    assert three.assignment("carried").adding_replicas == {}
    wait_until(lambda: (lambda s: (s.leader, s.isr) == (3, (3,)))(topic_states(three.zk, "carried", 1)[0]),
               "broker 3 leads, alone in the ISR")
    [row] = run_json("cluster", "reassign", "--verify", "--topic", "carried", "--partition", "0",
                     "--replicas", "3", "--bootstrap-server", controller.bootstrap)
    assert row["status"] == "completed"
    assert "follower.replication.throttled.replicas" not in topic_admin.read_topic_config(three.zk, "carried")
    assert broker_config(three.brokers[3], 3, "follower.replication.throttled.rate") is None

    consumer = Consumer({"bootstrap.servers": three.brokers[3].bootstrap, "group.id": "carried",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition("carried", 0, 0)])
        received = []
        wait_until(lambda: received.extend(m.value() for m in consumer.consume(100, timeout=1.0)
                                           if m.error() is None) or len(received) >= RECORDS,
                   "every record from broker 3")
        assert received == values
    finally:
        consumer.close()


def test_decommission_moves_every_replica_and_its_records_off_the_broker(three):
    from confluent_kafka import Consumer, Producer, TopicPartition

    controller = three.brokers[three.controller()]
    assert create_assigned_topic(controller, "emptied", {0: [1, 3], 1: [3, 2]}) == 0
    wait_until(lambda: topic_states(three.zk, "emptied", 2), "the states")
    bootstrap = ",".join(b.bootstrap for b in three.brokers.values())
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    values = {p: [b"%d-%d" % (p, i) for i in range(RECORDS)] for p in (0, 1)}
    for p, partition_values in values.items():
        for value in partition_values:
            producer.produce("emptied", value, partition=p)
    assert producer.flush(30) == 0

    document = run_json("cluster", "decommission", "--broker-id", "3",
                        "--bootstrap-server", controller.bootstrap)
    assert {r["result"] for r in document["results"]} == {"ok"}
    wait_until(lambda: all(3 not in r for r in three.assignment("emptied").partitions.values())
               and not listed(controller).topics, "no replica left on broker 3")
    wait_until(lambda: all(3 not in s.isr and s.leader != 3
                           for s in topic_states(three.zk, "emptied", 2).values()),
               "broker 3 out of every ISR")

    consumer = Consumer({"bootstrap.servers": three.brokers[1].bootstrap, "group.id": "emptied",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition("emptied", p, 0) for p in (0, 1)])
        received: dict[int, list[bytes]] = {0: [], 1: []}

        def all_received() -> bool:
            for message in consumer.consume(100, timeout=1.0):
                if message.error() is None:
                    received[message.partition()].append(message.value())
            return all(len(v) >= RECORDS for v in received.values())

        wait_until(all_received, "every record from the remaining replicas")
        assert received == values
    finally:
        consumer.close()
