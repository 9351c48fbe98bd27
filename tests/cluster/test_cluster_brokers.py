"""The controller in real broker processes (``headrace broker`` with ``zookeeper.connect``) on a
real ZooKeeper: failover after SIGKILL, a SIGSTOPped controller fenced when it wakes, CreateTopics
spreading leaders 4/4/4, partitions of a killed broker offline until it returns, DeleteTopics,
NOT_CONTROLLER from the other brokers. Observed through ZooKeeper and the Kafka protocol."""

from __future__ import annotations

import os
import signal
from collections import Counter
from datetime import timedelta

import pytest

from headrace.cluster import topic_admin
from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from tests.broker.raw_client import RawClient
from tests.cli.cli_runner import run_json
from tests.cluster.cluster_helpers import (
    close,
    controller_epoch,
    controller_id,
    partition_state,
    topic_states,
    wait_until,
    zookeeper_client,
)
from tests.cluster.conftest import BROKER_SESSION_TIMEOUT_MS
from tests.conftest import BrokerProcess

FAILOVER_WAIT_S = 3 * BROKER_SESSION_TIMEOUT_MS / 1000 + 10  # generous: the bench measures it
METADATA, CREATE_TOPICS, DELETE_TOPICS, CREATE_PARTITIONS = 3, 19, 20, 37
DESCRIBE_CONFIGS, INCREMENTAL_ALTER_CONFIGS, TOPIC = 32, 44, 2
NOT_CONTROLLER = 41
POLICY_VIOLATION, LEADER_NOT_AVAILABLE = 44, 5
DESCRIBE_CLUSTER = 60
ELECT_LEADERS, ELECTION_NOT_NEEDED, PREFERRED_LEADER_NOT_AVAILABLE = 43, 84, 80
REQUEST_TIMEOUT = timedelta(seconds=30)


class BrokerCluster:
    """Three brokers started by ``cluster_brokers``, and a kazoo client in their chroot."""

    def __init__(self, cluster_brokers, broker_ids) -> None:
        self.brokers = {broker_id: cluster_brokers.start(broker_id) for broker_id in broker_ids}
        self.zk = zookeeper_client(cluster_brokers.zookeeper_connect)
        wait_until(lambda: len(self.zk.get_children(paths.BROKER_IDS)) == len(self.brokers),
                   "every broker registered")

    def controller(self) -> int:
        """The controller's id, once its broker's metadata lists every live broker (its
        ensemble node may apply the others' registrations a little after ours)."""
        active = wait_until(lambda: controller_id(self.zk), "a controller")
        live = set(self.zk.get_children(paths.BROKER_IDS))
        wait_until(lambda: {str(b) for b in metadata_brokers(self.brokers[active])} >= live,
                   "the controller's broker sees every broker")
        return active

    def others(self, broker_id: int) -> list[int]:
        return [b for b in self.brokers if b != broker_id]


@pytest.fixture
def cluster(cluster_brokers):
    cluster = BrokerCluster(cluster_brokers, (1, 2, 3))
    yield cluster
    close(cluster.zk)


def metadata_brokers(broker: BrokerProcess) -> list[int]:
    with RawClient(broker.bootstrap) as client:
        response = client.request(METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False})
    return [b.node_id for b in response.brokers]


def metadata_partitions(broker: BrokerProcess, topic: str) -> list[int]:
    with RawClient(broker.bootstrap) as client:
        response = client.request(METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                                 "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False})
    return [p.partition_index for p in response.topics[0].partitions]


def metadata_partition_errors(broker: BrokerProcess, topic: str) -> dict[int, int]:
    with RawClient(broker.bootstrap) as client:
        response = client.request(METADATA, 12, {"topics": [{"name": topic, "topic_id": None}],
                                                 "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False})
    return {p.partition_index: p.error_code for p in response.topics[0].partitions}


def described_controller(broker: BrokerProcess) -> int:
    with RawClient(broker.bootstrap) as client:
        return client.request(DESCRIBE_CLUSTER, 0, {
            "include_cluster_authorized_operations": False}).controller_id


def create_topics(broker: BrokerProcess, name: str, partitions: int, **overrides):
    topic = {"name": name, "num_partitions": partitions, "replication_factor": 1,
             "assignments": [], "configs": [], **overrides}
    with RawClient(broker.bootstrap) as client:
        response = client.request(CREATE_TOPICS, 7, {"timeout": REQUEST_TIMEOUT, "validate_only": False,
                                                     "topics": [topic]})
    return response.topics[0]


def delete_topics(broker: BrokerProcess, name: str):
    with RawClient(broker.bootstrap) as client:
        response = client.request(DELETE_TOPICS, 6, {"timeout": REQUEST_TIMEOUT, "topics": [
            {"name": name, "topic_id": None}]})
    return response.responses[0]


def test_sigkill_of_the_controller_elects_a_new_one_with_the_next_epoch(cluster):
    first = cluster.controller()
    epoch = controller_epoch(cluster.zk)
    cluster.brokers[first].kill()
    second = wait_until(lambda: (c := controller_id(cluster.zk)) not in (None, first) and c,
                        "a new controller", timeout_s=FAILOVER_WAIT_S)
    assert second in cluster.others(first)
    assert controller_epoch(cluster.zk) == epoch + 1
    for broker_id in cluster.others(first):
        wait_until(lambda b=broker_id: described_controller(cluster.brokers[b]) == second,
                   f"DescribeCluster on broker {broker_id} names the new controller")


def test_create_topics_on_the_controller_spreads_12_leaders_4_4_4(cluster):
    controller = cluster.brokers[cluster.controller()]
    result = create_topics(controller, "spread", 12)
    assert (result.error_code, result.num_partitions, result.replication_factor) == (0, 12, 1)
    states = topic_states(cluster.zk, "spread", 12)  # written before the answer
    assert Counter(state.leader for state in states.values()) == {1: 4, 2: 4, 3: 4}
    assert create_topics(controller, "spread", 1).error_code == 36  # TOPIC_ALREADY_EXISTS
    assert create_topics(controller, "wide", 1, replication_factor=4).error_code == 38


def test_non_controllers_answer_not_controller(cluster):
    active = cluster.controller()
    create_topics(cluster.brokers[active], "exists", 1)
    for broker_id in cluster.others(active):
        broker = cluster.brokers[broker_id]
        result = create_topics(broker, "refused", 1)
        assert (result.error_code, result.error_message) == (NOT_CONTROLLER, None)
        assert delete_topics(broker, "exists").error_code == NOT_CONTROLLER
        with RawClient(broker.bootstrap) as client:
            grown = client.request(CREATE_PARTITIONS, 3, {"timeout": REQUEST_TIMEOUT, "validate_only": False,
                                                         "topics": [{"name": "exists", "count": 2,
                                                                     "assignments": None}]})
        assert grown.results[0].error_code == NOT_CONTROLLER
    assert cluster.zk.exists(paths.topic_path("refused")) is None
    assert topic_states(cluster.zk, "exists", 1) and partition_state(cluster.zk, "exists", 1) is None


def test_delete_topics_removes_the_znodes(cluster):
    controller = cluster.brokers[cluster.controller()]
    create_topics(controller, "gone", 3)
    assert delete_topics(controller, "gone").error_code == 0
    cluster.zk.sync("/")
    assert cluster.zk.exists(paths.topic_path("gone")) is None
    assert cluster.zk.exists(paths.topic_config_path("gone")) is None
    assert cluster.zk.get_children(paths.DELETE_TOPICS) == []
    assert delete_topics(controller, "gone").error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION


def test_partitions_of_a_killed_broker_go_offline_and_return_when_it_restarts(cluster):
    active = cluster.controller()
    create_topics(cluster.brokers[active], "rf1", 6)
    victim = cluster.others(active)[0]
    led = [p for p, state in topic_states(cluster.zk, "rf1", 6).items() if state.leader == victim]
    assert led
    cluster.brokers[victim].kill()
    for p in led:
        wait_until(lambda p=p: partition_state(cluster.zk, "rf1", p).leader == -1,
                   "leader -1", timeout_s=FAILOVER_WAIT_S)
    offline = wait_until(lambda: {p for p, code in metadata_partition_errors(
        cluster.brokers[active], "rf1").items() if code == LEADER_NOT_AVAILABLE} == set(led),
        "Metadata says LEADER_NOT_AVAILABLE for them")
    assert offline
    cluster.brokers[victim].start()
    for p in led:
        wait_until(lambda p=p: partition_state(cluster.zk, "rf1", p).leader == victim, "leader back")


def test_a_sigstopped_controller_that_wakes_after_its_session_expired_writes_nothing(cluster):
    stale = cluster.controller()
    epoch = controller_epoch(cluster.zk)
    create_topics(cluster.brokers[stale], "still", 2,
                  assignments=[{"partition_index": 0, "broker_ids": [cluster.others(stale)[0]]},
                               {"partition_index": 1, "broker_ids": [cluster.others(stale)[1]]}],
                  num_partitions=-1, replication_factor=-1)
    log_mark = cluster.brokers[stale].log_bytes()
    os.kill(cluster.brokers[stale].pid, signal.SIGSTOP)
    try:
        successor = wait_until(lambda: (c := controller_id(cluster.zk)) not in (None, stale) and c,
                               "a new controller", timeout_s=FAILOVER_WAIT_S)
        assert controller_epoch(cluster.zk) == epoch + 1
        watched = [paths.CONTROLLER_EPOCH, paths.CONTROLLER] + [
            paths.partition_state_path("still", p) for p in (0, 1)]
        before = {path: cluster.zk.exists(path).mzxid for path in watched}
    finally:
        os.kill(cluster.brokers[stale].pid, signal.SIGCONT)
    wait_until(lambda: "resigned as controller (epoch" in cluster.brokers[stale].log_text(log_mark)
               and "ZooKeeper session expired" in cluster.brokers[stale].log_text(log_mark),
               "the woken controller resigns")
    wait_until(lambda: cluster.zk.exists(paths.broker_id_path(stale)), "it registers again")
    assert {path: cluster.zk.exists(path).mzxid for path in watched} == before
    assert controller_id(cluster.zk) == successor and controller_epoch(cluster.zk) == epoch + 1


def test_a_topic_config_changed_on_any_broker_reaches_zookeeper_and_every_broker(cluster):
    active = cluster.controller()
    create_topics(cluster.brokers[active], "tuned", 2)
    changer, reader = cluster.others(active)

    def described(broker_id: int) -> str | None:
        with RawClient(cluster.brokers[broker_id].bootstrap) as client:
            result = client.request(DESCRIBE_CONFIGS, 4, {"resources": [
                {"resource_type": TOPIC, "resource_name": "tuned",
                 "configuration_keys": ["retention.ms"]}],
                "include_synonyms": False, "include_documentation": False}).results[0]
        return next((c.value for c in result.configs if c.name == "retention.ms"), None)

    wait_until(lambda: described(changer), "the changing broker knows the topic")
    with RawClient(cluster.brokers[changer].bootstrap) as client:
        response = client.request(INCREMENTAL_ALTER_CONFIGS, 1, {"validate_only": False, "resources": [
            {"resource_type": TOPIC, "resource_name": "tuned",
             "configs": [{"name": "retention.ms", "config_operation": 0, "value": "12345"}]}]})
    assert response.responses[0].error_code == 0
    assert topic_admin.read_topic_config(cluster.zk, "tuned") == {"retention.ms": "12345"}
    [change] = cluster.zk.get_children(paths.CONFIG_CHANGES)
    assert records.decode_config_change_notification(
        cluster.zk.get(f"{paths.CONFIG_CHANGES}/{change}")[0]) == ("topics", "tuned")

    for broker_id in (changer, reader, active):
        wait_until(lambda b=broker_id: described(b) == "12345", f"broker {broker_id} sees it")


def elect_leaders(broker: BrokerProcess, partitions) -> dict[tuple[str, int], int]:
    with RawClient(broker.bootstrap) as client:
        response = client.request(ELECT_LEADERS, 2, {"election_type": 0, "timeout": REQUEST_TIMEOUT,
                                                    "topic_partitions": partitions})
    assert response.error_code == 0
    return {(r.topic, p.partition_id): p.error_code
            for r in response.replica_election_results for p in r.partition_result}


def test_elect_leaders_on_the_controller_and_elsewhere(cluster):
    active = cluster.controller()
    create_topics(cluster.brokers[active], "chosen", 3)
    asked = [{"topic": "chosen", "partitions": [0, 1, 2]}]
    assert elect_leaders(cluster.brokers[active], asked) == {
        ("chosen", p): ELECTION_NOT_NEEDED for p in range(3)}
    assert elect_leaders(cluster.brokers[active], None) == {}
    for other in cluster.others(active):
        assert set(elect_leaders(cluster.brokers[other], asked).values()) == {NOT_CONTROLLER}
    victim = cluster.others(active)[0]
    led = [p for p, s in topic_states(cluster.zk, "chosen", 3).items() if s.leader == victim]
    cluster.brokers[victim].kill()
    for p in led:
        wait_until(lambda p=p: partition_state(cluster.zk, "chosen", p).leader == -1, "offline",
                   timeout_s=FAILOVER_WAIT_S)
    answer = elect_leaders(cluster.brokers[active], asked)
    assert {tp for tp, code in answer.items() if code == PREFERRED_LEADER_NOT_AVAILABLE} == {
        ("chosen", p) for p in led}
    assert elect_leaders(cluster.brokers[active], [{"topic": "none", "partitions": [0]}]) == {
        ("none", 0): 3}
    rows = run_json("cluster", "elect-leaders", "--topic", "chosen",
                    "--bootstrap-server", cluster.brokers[cluster.others(active)[1]].bootstrap)
    assert {(row["partition"], row["result"]) for row in rows} == {
        (p, "PREFERRED_LEADER_NOT_AVAILABLE" if p in led else "ELECTION_NOT_NEEDED") for p in range(3)}


def test_create_partitions_and_validate_only_on_the_controller(cluster):
    controller = cluster.brokers[cluster.controller()]
    create_topics(controller, "growing", 2)
    with RawClient(controller.bootstrap) as client:
        dry = client.request(CREATE_TOPICS, 7, {"timeout": REQUEST_TIMEOUT, "validate_only": True,
                                                "topics": [{"name": "dry", "num_partitions": 6,
                                                            "replication_factor": 1,
                                                            "assignments": [], "configs": []}]})
        assert (dry.topics[0].error_code, dry.topics[0].num_partitions) == (0, 6)
        grown = client.request(CREATE_PARTITIONS, 3, {"timeout": REQUEST_TIMEOUT, "validate_only": False,
                                                     "topics": [{"name": "growing", "count": 5,
                                                                 "assignments": None}]})
        assert grown.results[0].error_code == 0
        again = client.request(CREATE_PARTITIONS, 3, {"timeout": REQUEST_TIMEOUT, "validate_only": False,
                                                     "topics": [{"name": "growing", "count": 5,
                                                                 "assignments": None}]})
        assert again.results[0].error_code == 37  # INVALID_PARTITIONS
    cluster.zk.sync("/")
    assert cluster.zk.exists(paths.topic_path("dry")) is None
    states = topic_states(cluster.zk, "growing", 5)  # the new ones written before the answer
    assert states and all(state.has_leader for state in states.values())
    assert len(metadata_partitions(controller, "growing")) == 5


def test_huge_partition_counts_are_policy_violations_and_the_cluster_carries_on(cluster):
    controller = cluster.brokers[cluster.controller()]
    assert create_topics(controller, "huge", 2**31 - 1).error_code == POLICY_VIOLATION
    create_topics(controller, "small", 1)
    with RawClient(controller.bootstrap) as client:
        grown = client.request(CREATE_PARTITIONS, 3, {"timeout": REQUEST_TIMEOUT, "validate_only": False,
                                                     "topics": [{"name": "small", "count": 2**31 - 1,
                                                                 "assignments": None}]})
    assert grown.results[0].error_code == POLICY_VIOLATION
    cluster.zk.sync("/")
    assert cluster.zk.exists(paths.topic_path("huge")) is None
    assert create_topics(controller, "after", 3).error_code == 0
    assert topic_states(cluster.zk, "after", 3)


def test_delete_topics_with_deletion_disabled(cluster_brokers):
    broker = cluster_brokers.start(1, **{"delete.topic.enable": "false"})
    zk = zookeeper_client(cluster_brokers.zookeeper_connect)
    try:
        wait_until(lambda: controller_id(zk) == 1, "broker 1 is the controller")
        wait_until(lambda: metadata_brokers(broker) == [1], "it sees itself")
        assert create_topics(broker, "kept", 1).error_code == 0
        assert delete_topics(broker, "kept").error_code == 73  # TOPIC_DELETION_DISABLED
        with RawClient(broker.bootstrap) as client:
            old = client.request(DELETE_TOPICS, 2, {"timeout": REQUEST_TIMEOUT, "topic_names": ["kept"]})
        assert old.responses[0].error_code == 42  # INVALID_REQUEST before v3
        zk.sync("/")
        assert zk.exists(paths.topic_path("kept")) is not None
    finally:
        close(zk)
