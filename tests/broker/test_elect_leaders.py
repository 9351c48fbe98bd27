"""ElectLeaders on a single node (a real broker process): every partition it has is led by its
only replica (ELECTION_NOT_NEEDED), others are UNKNOWN_TOPIC_OR_PARTITION; v0 has no top-level
error. The cluster's elections are in tests/cluster/test_cluster_brokers.py."""

from datetime import timedelta

from tests.broker.raw_client import RawClient
from tests.cli.cli_runner import assert_user_error, run, run_json

ELECT_LEADERS, CREATE_TOPICS = 43, 19
ELECTION_NOT_NEEDED, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST = 84, 3, 42


def elect(client, version: int, partitions, election_type: int = 0):
    body = {"topic_partitions": partitions, "timeout": timedelta(seconds=30)}
    if version >= 1:
        body["election_type"] = election_type
    return client.request(ELECT_LEADERS, version, body)


def codes(response) -> dict[tuple[str, int], int]:
    return {(result.topic, p.partition_id): p.error_code
            for result in response.replica_election_results for p in result.partition_result}


def test_single_node_elect_leaders(broker):
    with RawClient(broker.bootstrap) as client:
        client.request(CREATE_TOPICS, 7, {"validate_only": False, "topics": [
            {"name": "elect-me", "num_partitions": 2, "replication_factor": 1,
             "assignments": [], "configs": []}]})
        response = elect(client, 2, [{"topic": "elect-me", "partitions": [0, 1, 5]},
                                     {"topic": "nope", "partitions": [0]}])
        assert response.error_code == 0
        assert codes(response) == {("elect-me", 0): ELECTION_NOT_NEEDED,
                                   ("elect-me", 1): ELECTION_NOT_NEEDED,
                                   ("elect-me", 5): UNKNOWN_TOPIC_OR_PARTITION,
                                   ("nope", 0): UNKNOWN_TOPIC_OR_PARTITION}
        assert codes(elect(client, 2, None)) == {}
        assert codes(elect(client, 0, [{"topic": "elect-me", "partitions": [0]}])) == {
            ("elect-me", 0): ELECTION_NOT_NEEDED}
        assert codes(elect(client, 1, [{"topic": "elect-me", "partitions": [0]}], 7)) == {
            ("elect-me", 0): INVALID_REQUEST}


def test_elect_leaders_command(broker):
    with RawClient(broker.bootstrap) as client:
        client.request(CREATE_TOPICS, 7, {"validate_only": False, "topics": [
            {"name": "elect-cli", "num_partitions": 2, "replication_factor": 1,
             "assignments": [], "configs": []}]})
    rows = run_json("cluster", "elect-leaders", "--topic", "elect-cli",
                    "--bootstrap-server", broker.bootstrap)
    assert rows == [{"topic": "elect-cli", "partition": p, "result": "ELECTION_NOT_NEEDED"}
                    for p in (0, 1)]
    assert_user_error(run("cluster", "elect-leaders", "--bootstrap-server", broker.bootstrap),
                      "give either --topic")
    assert_user_error(run("cluster", "elect-leaders", "--topic", "absent",
                          "--bootstrap-server", broker.bootstrap), "does not exist")
    assert_user_error(run("cluster", "elect-leaders", "--all-topic-partitions", "--election-type",
                          "random", "--bootstrap-server", broker.bootstrap), "--election-type")
