"""Replication factors above 1 in real broker processes on a real ZooKeeper: CreateTopics with
RF 3 places three distinct replicas per partition (Kafka's assignment: preferred leaders spread
evenly, the ISR every replica), RF above the live brokers is INVALID_REPLICATION_FACTOR with
Kafka's message, RF -1 takes ``default.replication.factor``, Metadata's auto-creation answers
INVALID_REPLICATION_FACTOR when too few brokers are alive, and ``__consumer_offsets`` is not
created while fewer than ``offsets.topic.replication.factor`` (3) brokers are alive: FindCoordinator
answers COORDINATOR_NOT_AVAILABLE until the third broker registers."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from tests.broker.raw_client import RawClient
from tests.cluster.cluster_helpers import (
    close,
    controller_id,
    topic_states,
    wait_until,
    zookeeper_client,
)
from tests.conftest import BrokerProcess

METADATA, CREATE_TOPICS, FIND_COORDINATOR = 3, 19, 10
INVALID_REPLICATION_FACTOR, COORDINATOR_NOT_AVAILABLE, LEADER_NOT_AVAILABLE = 38, 15, 5
REQUEST_TIMEOUT = timedelta(seconds=30)
OFFSETS_TOPIC = "__consumer_offsets"


def create_topic(broker: BrokerProcess, name: str, partitions: int, replication_factor: int):
    topic = {"name": name, "num_partitions": partitions, "replication_factor": replication_factor,
             "assignments": [], "configs": []}
    with RawClient(broker.bootstrap) as client:
        return client.request(CREATE_TOPICS, 7, {"timeout": REQUEST_TIMEOUT, "validate_only": False,
                                                 "topics": [topic]}).topics[0]


def metadata_brokers(broker: BrokerProcess) -> set[int]:
    with RawClient(broker.bootstrap) as client:
        response = client.request(METADATA, 12, {"topics": [], "allow_auto_topic_creation": False,
                                                 "include_topic_authorized_operations": False})
    return {b.node_id for b in response.brokers}


def auto_created_topic_error(broker: BrokerProcess, name: str) -> int:
    with RawClient(broker.bootstrap) as client:
        response = client.request(METADATA, 12, {"topics": [{"name": name, "topic_id": None}],
                                                 "allow_auto_topic_creation": True,
                                                 "include_topic_authorized_operations": False})
    return response.topics[0].error_code


def find_coordinator_error(broker: BrokerProcess, group: str) -> int:
    with RawClient(broker.bootstrap) as client:
        return client.request(FIND_COORDINATOR, 3, {"key": group, "key_type": 0}).error_code


class Brokers:
    """Brokers started one by one in the test's chroot, and a kazoo client there."""

    def __init__(self, cluster_brokers, **overrides: str) -> None:
        self._cluster_brokers = cluster_brokers
        self._overrides = overrides
        self.brokers: dict[int, BrokerProcess] = {}
        self.zk = zookeeper_client(cluster_brokers.zookeeper_connect)

    def start(self, *broker_ids: int) -> None:
        for broker_id in broker_ids:
            self.brokers[broker_id] = self._cluster_brokers.start(broker_id, **self._overrides)
        wait_until(lambda: all(metadata_brokers(b) == set(self.brokers) for b in self.brokers.values()),
                   "every broker sees every broker")

    def controller(self) -> BrokerProcess:
        return self.brokers[wait_until(lambda: controller_id(self.zk), "a controller")]


@pytest.fixture
def brokers(cluster_brokers, request):
    started = Brokers(cluster_brokers, **getattr(request, "param", {}))
    yield started
    close(started.zk)


def test_replication_factor_3_places_three_replicas_per_partition(brokers):
    brokers.start(1, 2, 3)
    result = create_topic(brokers.controller(), "triple", 6, 3)
    assert (result.error_code, result.num_partitions, result.replication_factor) == (0, 6, 3)
    brokers.zk.sync(paths.topic_path("triple"))
    assignment = brokers.zk.get(paths.topic_path("triple"))[0]
    replicas = records.decode_topic_assignment("triple", assignment).partitions
    assert all(sorted(r) == [1, 2, 3] for r in replicas.values())
    assert Counter(r[0] for r in replicas.values()) == {1: 2, 2: 2, 3: 2}
    states = topic_states(brokers.zk, "triple", 6)
    assert all(state.leader == replicas[p][0] and state.isr == replicas[p]
               for p, state in states.items())


def test_replication_factor_above_the_live_brokers_is_refused_with_kafkas_message(brokers):
    brokers.start(1, 2)
    result = create_topic(brokers.controller(), "too-wide", 1, 3)
    assert (result.error_code, result.error_message) == (
        INVALID_REPLICATION_FACTOR, "Replication factor: 3 larger than available brokers: 2.")
    assert create_topic(brokers.controller(), "none", 1, 0).error_code == INVALID_REPLICATION_FACTOR
    brokers.zk.sync("/")
    assert brokers.zk.exists(paths.topic_path("too-wide")) is None


@pytest.mark.parametrize("brokers", [{"default.replication.factor": "2"}], indirect=True)
def test_default_replication_factor_applies_to_minus_one_and_auto_creation(brokers):
    brokers.start(1, 2)
    result = create_topic(brokers.controller(), "defaulted", 2, -1)
    assert (result.error_code, result.replication_factor) == (0, 2)
    assert all(len(s.isr) == 2 for s in topic_states(brokers.zk, "defaulted", 2).values())
    assert auto_created_topic_error(brokers.brokers[1], "auto-two") == LEADER_NOT_AVAILABLE
    states = wait_until(lambda: topic_states(brokers.zk, "auto-two", 1), "auto-two's state")
    assert sorted(states[0].isr) == [1, 2]


@pytest.mark.parametrize("brokers", [{"default.replication.factor": "3"}], indirect=True)
def test_auto_creation_with_too_few_brokers_answers_invalid_replication_factor(brokers):
    brokers.start(1, 2)
    assert auto_created_topic_error(brokers.brokers[2], "auto-wide") == INVALID_REPLICATION_FACTOR
    brokers.zk.sync("/")
    assert brokers.zk.exists(paths.topic_path("auto-wide")) is None


@pytest.mark.parametrize("brokers", [{"offsets.topic.num.partitions": "3"}], indirect=True)
def test_offsets_topic_waits_for_offsets_topic_replication_factor_brokers(brokers):
    brokers.start(1, 2)
    assert find_coordinator_error(brokers.brokers[1], "early") == COORDINATOR_NOT_AVAILABLE
    assert find_coordinator_error(brokers.brokers[2], "early") == COORDINATOR_NOT_AVAILABLE
    brokers.zk.sync("/")
    assert brokers.zk.exists(paths.topic_path(OFFSETS_TOPIC)) is None
    brokers.start(3)
    wait_until(lambda: find_coordinator_error(brokers.brokers[1], "early") == 0,
               "a coordinator once three brokers are alive")
    states = topic_states(brokers.zk, OFFSETS_TOPIC, 3)
    assert states and all(sorted(s.isr) == [1, 2, 3] for s in states.values())
