"""ZooKeeper record codecs: round trips, and parsing JSON as Kafka 3.x writes it (ZkData.scala);
Kafka's rack-unaware replica assignment."""

import json
import random
from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from headrace.cluster import zookeeper_records as records
from headrace.errors import InvalidPartitions, InvalidReplicationFactor

KAFKA_BROKER_V5 = (
    b'{"features":{},"listener_security_protocol_map":{"PLAINTEXT":"PLAINTEXT"},'
    b'"endpoints":["PLAINTEXT://broker1:9092"],"jmx_port":-1,"port":9092,"host":"broker1",'
    b'"version":5,"timestamp":"1700000000000"}'
)
KAFKA_TOPIC = (
    b'{"partitions":{"0":[1,2],"1":[2,3]},"topic_id":"wYm4fFHxRz2Q4IzjV9nyXg",'
    b'"adding_replicas":{},"removing_replicas":{},"version":3}'
)
KAFKA_STATE = b'{"controller_epoch":7,"leader":2,"version":1,"leader_epoch":4,"isr":[2,1]}'
KAFKA_CONTROLLER = b'{"version":2,"brokerid":3,"timestamp":"1700000000123","kraftControllerEpoch":-1}'


def test_broker_registration_parses_kafka_json():
    broker = records.decode_broker_registration(1, KAFKA_BROKER_V5)
    assert (broker.broker_id, broker.host, broker.port) == (1, "broker1", 9092)
    assert broker.endpoints == ("PLAINTEXT://broker1:9092",)
    assert broker.timestamp_ms == 1700000000000 and broker.rack is None


def test_broker_registration_v1_has_only_host_and_port():
    broker = records.decode_broker_registration(
        4, b'{"version":1,"host":"h","port":9093,"jmx_port":-1,"timestamp":"5"}'
    )
    assert broker.endpoints == ("PLAINTEXT://h:9093",) and (broker.host, broker.port) == ("h", 9093)


def test_broker_registration_round_trip_has_kafkas_v5_fields():
    broker = records.BrokerRegistration(
        broker_id=2, host="127.0.0.1", port=4000, endpoints=("PLAINTEXT://127.0.0.1:4000",),
        timestamp_ms=12, rack="r1",
    )
    encoded = records.encode_broker_registration(broker)
    assert set(json.loads(encoded)) == {
        "version", "host", "port", "endpoints", "jmx_port", "timestamp",
        "listener_security_protocol_map", "features", "rack",
    }
    assert json.loads(encoded)["timestamp"] == "12"  # a string, as Kafka writes it
    assert records.decode_broker_registration(2, encoded) == broker


def test_topic_assignment_parses_kafka_json():
    assignment = records.decode_topic_assignment("t", KAFKA_TOPIC)
    assert assignment.partitions == {0: (1, 2), 1: (2, 3)}
    assert records.topic_id_to_string(assignment.topic_id) == "wYm4fFHxRz2Q4IzjV9nyXg"


def test_topic_assignment_without_topic_id_as_kafka_before_2_8_wrote_it():
    assignment = records.decode_topic_assignment("t", b'{"version":1,"partitions":{"0":[5]}}')
    assert assignment.topic_id is None and assignment.partitions == {0: (5,)}
    assert assignment.adding_replicas == {}


@given(
    st.dictionaries(st.integers(0, 1000), st.lists(st.integers(0, 100), min_size=1, max_size=4)
                    .map(tuple), min_size=1, max_size=20),
    st.binary(min_size=16, max_size=16),
)
def test_topic_assignment_round_trip(partitions, topic_id):
    assignment = records.TopicAssignment(topic_id=topic_id, partitions=partitions)
    assert records.decode_topic_assignment("t", records.encode_topic_assignment(assignment)) == assignment


def test_partition_state_parses_kafka_json():
    state = records.decode_partition_state(KAFKA_STATE)
    assert state == records.PartitionState(leader=2, leader_epoch=4, isr=(2, 1), controller_epoch=7)


def test_partition_state_without_leader_encodes_kafkas_no_leader():
    state = records.PartitionState(leader=records.NO_LEADER, leader_epoch=5, isr=(3,), controller_epoch=2)
    encoded = records.encode_partition_state(state)
    assert json.loads(encoded) == {
        "controller_epoch": 2, "leader": -1, "version": 1, "leader_epoch": 5, "isr": [3]
    }
    assert records.decode_partition_state(encoded) == state and not state.has_leader


def test_partition_state_recovering_carries_leader_recovery_state():
    state = records.PartitionState(leader=1, leader_epoch=1, isr=(1,), controller_epoch=1,
                                   leader_recovery_state=1)
    assert json.loads(records.encode_partition_state(state))["leader_recovery_state"] == 1
    assert records.decode_partition_state(records.encode_partition_state(state)) == state


def test_controller_registration_parses_kafka_json_and_round_trips():
    controller = records.decode_controller_registration(KAFKA_CONTROLLER)
    assert controller == records.ControllerRegistration(broker_id=3, timestamp_ms=1700000000123)
    assert records.encode_controller_registration(controller) == KAFKA_CONTROLLER


def test_controller_epoch_is_a_decimal_string():
    assert records.encode_controller_epoch(12) == b"12"
    assert records.decode_controller_epoch(b"12") == 12
    with pytest.raises(records.MalformedZnode):
        records.decode_controller_epoch(b"x")


def test_entity_config_round_trip_and_kafkas_empty_node():
    encoded = records.encode_entity_config({"retention.ms": "1000"})
    assert json.loads(encoded) == {"version": 1, "config": {"retention.ms": "1000"}}
    assert records.decode_entity_config(encoded) == {"retention.ms": "1000"}
    assert records.decode_entity_config(None) == {}


def test_config_change_notification_is_version_2_entity_path():
    encoded = records.encode_config_change_notification("topics", "orders")
    assert json.loads(encoded) == {"version": 2, "entity_path": "topics/orders"}
    assert records.decode_config_change_notification(encoded) == ("topics", "orders")


def test_preferred_replica_election_and_cluster_id_round_trip():
    encoded = records.encode_preferred_replica_election([("a", 0), ("b", 3)])
    assert records.decode_preferred_replica_election(encoded) == (("a", 0), ("b", 3))
    assert records.decode_cluster_id(b'{"version":"1","id":"abc"}') == "abc"
    assert records.decode_cluster_id(records.encode_cluster_id("xyz")) == "xyz"


@pytest.mark.parametrize("data", [b"", b"[]", b"{", b'{"leader":"1"}', b"\xff",
                                  b'{"leader":1,"leader_epoch":0,"controller_epoch":1,"isr":[true]}'])
def test_malformed_partition_state_raises_malformed_znode(data):
    with pytest.raises(records.MalformedZnode):
        records.decode_partition_state(data)


def test_twelve_partitions_over_three_brokers_give_four_leaders_each():
    for seed in range(20):
        assignment = records.assign_replicas_to_brokers([3, 1, 2], 12, 1, rng=random.Random(seed))
        assert sorted(assignment) == list(range(12))
        assert Counter(replicas[0] for replicas in assignment.values()) == {1: 4, 2: 4, 3: 4}


def test_replicas_of_a_partition_are_on_distinct_brokers_and_spread_evenly():
    assignment = records.assign_replicas_to_brokers(range(5), 10, 3, rng=random.Random(1))
    assert all(len(set(replicas)) == 3 for replicas in assignment.values())
    assert set(Counter(b for replicas in assignment.values() for b in replicas).values()) == {6}


def test_fixed_start_matches_kafkas_documented_example():
    # AdminUtils' javadoc: 5 brokers, 10 partitions, RF 3, start index 0.
    assignment = records.assign_replicas_to_brokers(range(5), 10, 3, fixed_start_index=0)
    assert assignment[0] == (0, 1, 2) and assignment[4] == (4, 0, 1)
    assert assignment[5] == (0, 2, 3) and assignment[9] == (4, 1, 2)


def test_assignment_refuses_kafkas_invalid_arguments():
    with pytest.raises(InvalidReplicationFactor):
        records.assign_replicas_to_brokers([1, 2], 3, 3)
    with pytest.raises(InvalidPartitions):
        records.assign_replicas_to_brokers([1, 2], 0, 1)


def test_added_partitions_continue_the_round_robin_from_partition_zeros_leader():
    existing = {0: (2,), 1: (3,), 2: (1,)}
    added = records.assign_added_partitions([1, 2, 3], existing, 6)
    assert added == {3: (2,), 4: (3,), 5: (1,)}
    with pytest.raises(InvalidPartitions):
        records.assign_added_partitions([1, 2, 3], existing, 3)
