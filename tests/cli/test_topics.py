"""``headrace topics``, ``configs`` and ``cluster`` against a live headrace broker."""

from __future__ import annotations

import os
import socket

from tests.cli.cli_runner import assert_user_error, run, run_json, run_ok, unique_topic


def _partition_count(broker, topic: str) -> int:
    listing = run_json("topics", "list", "-b", broker.bootstrap)
    return {row["topic"]: row["partitions"] for row in listing}[topic]


def _config_value(broker, resource_type: str, name: str, key: str) -> str | None:
    rows = run_json("configs", "describe", resource_type, name, "-b", broker.bootstrap)
    return {row["name"]: row["value"] for row in rows}[key]


def test_create_list_describe_and_delete(broker):
    topic = unique_topic("lifecycle")
    created = run_ok("topics", "create", topic, "--partitions", "3", "--config",
                     "retention.ms=123456", "-b", broker.bootstrap)
    assert f"Created topic {topic}" in created.stdout.decode()
    assert _partition_count(broker, topic) == 3
    assert _config_value(broker, "topic", topic, "retention.ms") == "123456"
    run_ok("produce", topic, "--partition", "2", "-b", broker.bootstrap, stdin=b"a\nb\n")

    described = run_json("topics", "describe", topic, "-b", broker.bootstrap)
    by_partition = {row["partition"]: row for row in described["partitions"]}
    assert sorted(by_partition) == [0, 1, 2]
    assert (by_partition[2]["low_offset"], by_partition[2]["high_offset"]) == (0, 2)
    assert by_partition[0]["high_offset"] == 0
    assert by_partition[0]["leader"] in by_partition[0]["replicas"]

    table = run_ok("topics", "describe", topic, "-b", broker.bootstrap).stdout.decode()
    assert "high_offset" in table and topic in table

    run_ok("topics", "delete", topic, "-b", broker.bootstrap)
    names = [row["topic"] for row in run_json("topics", "list", "-b", broker.bootstrap)]
    assert topic not in names


def test_describe_shows_size_on_disk(broker):
    topic = unique_topic("size")
    run_ok("topics", "create", topic, "--partitions", "2", "-b", broker.bootstrap)
    run_ok("produce", topic, "--partition", "1", "-b", broker.bootstrap,
           stdin=b"".join(b"record-%d\n" % index for index in range(50)))

    described = run_json("topics", "describe", topic, "-b", broker.bootstrap)
    sizes = {row["partition"]: row["size_bytes"] for row in described["partitions"]}
    on_disk = sum(path.stat().st_size for path in (broker.data_dir / f"{topic}-1").glob("*.log"))
    assert sizes == {0: 0, 1: on_disk}
    assert on_disk > 50 * len(b"record-0")

    table = run_ok("topics", "describe", topic, "-b", broker.bootstrap).stdout.decode()
    assert "size_bytes" in table and str(on_disk) in table


def test_alter_config_and_add_partitions(broker):
    topic = unique_topic("alter")
    run_ok("topics", "create", topic, "-b", broker.bootstrap)
    run_ok("topics", "alter-config", topic, "--set", "retention.ms=7000",
           "--set", "cleanup.policy=compact", "-b", broker.bootstrap)
    assert _config_value(broker, "topic", topic, "retention.ms") == "7000"
    assert _config_value(broker, "topic", topic, "cleanup.policy") == "compact"
    run_ok("configs", "alter", "topic", topic, "--delete", "retention.ms", "-b",
           broker.bootstrap)
    assert _config_value(broker, "topic", topic, "retention.ms") == "604800000"

    run_ok("topics", "add-partitions", topic, "--partitions", "4", "-b", broker.bootstrap)
    assert _partition_count(broker, topic) == 4


def test_every_topic_change_reports_json(broker):
    topic = unique_topic("json")
    created = run_json("topics", "create", topic, "-p", "2", "--config", "retention.ms=9000",
                       "-b", broker.bootstrap)
    assert created == {"topic": topic, "created": True, "partitions": 2,
                       "replication_factor": 1, "configs": {"retention.ms": "9000"}}
    assert run_json("topics", "create", topic, "--if-not-exists", "-b", broker.bootstrap) == {
        "topic": topic, "created": False}
    assert run_json("topics", "alter-config", topic, "--set", "retention.ms=8000", "--delete",
                    "cleanup.policy", "-b", broker.bootstrap) == {
        "topic": topic, "set": {"retention.ms": "8000"}, "deleted": ["cleanup.policy"]}
    assert run_json("configs", "alter", "topic", topic, "--set", "retention.ms=7000", "-b",
                    broker.bootstrap) == {"resource_type": "topic", "name": topic,
                                          "set": {"retention.ms": "7000"}, "deleted": []}
    assert _config_value(broker, "topic", topic, "retention.ms") == "7000"
    assert run_json("topics", "add-partitions", topic, "-p", "3", "-b", broker.bootstrap) == {
        "topic": topic, "partitions": 3}
    assert run_json("produce", topic, "-b", broker.bootstrap, stdin=b"a\nb\n") == {
        "topic": topic, "delivered": 2}
    assert run_json("topics", "delete", topic, "-b", broker.bootstrap) == {"deleted": [topic]}
    assert topic not in {row["topic"] for row in run_json("topics", "list", "-b",
                                                          broker.bootstrap)}


def test_broker_configs_describe_and_alter(broker):
    cluster = run_json("cluster", "info", "-b", broker.bootstrap)
    broker_id = str(cluster["brokers"][0]["id"])
    rows = run_json("configs", "describe", "broker", broker_id, "-b", broker.bootstrap)
    assert "log.retention.ms" in {row["name"] for row in rows}
    run_ok("configs", "alter", "broker", broker_id, "--set", "log.cleaner.backoff.ms=16000",
           "-b", broker.bootstrap)
    assert _config_value(broker, "broker", broker_id, "log.cleaner.backoff.ms") == "16000"


def test_cluster_info_counts_topics(broker):
    topic = unique_topic("cluster")
    before = run_json("cluster", "info", "-b", broker.bootstrap)
    run_ok("topics", "create", topic, "-b", broker.bootstrap)
    after = run_json("cluster", "info", "-b", broker.bootstrap)
    assert after["topics_count"] == before["topics_count"] + 1
    assert after["cluster_id"] == before["cluster_id"] and after["cluster_id"]
    assert [b["port"] for b in after["brokers"]] == [broker.port]
    assert after["controller_id"] == after["brokers"][0]["id"]


def test_bootstrap_server_from_environment(broker):
    env = {**os.environ, "HEADRACE_BOOTSTRAP_SERVER": broker.bootstrap}
    topic = unique_topic("env")
    result = run("topics", "create", topic, env=env)
    assert result.returncode == 0, result.stderr
    assert topic in run("topics", "list", env=env).stdout.decode()


def test_user_errors_are_one_line(broker):
    topic = unique_topic("errors")
    run_ok("topics", "create", topic, "-b", broker.bootstrap)
    assert_user_error(run("topics", "create", topic, "-b", broker.bootstrap),
                      "TOPIC_ALREADY_EXISTS")
    assert_user_error(run("topics", "describe", unique_topic("missing"), "-b",
                          broker.bootstrap), "unknown topic")
    assert_user_error(run("topics", "create", unique_topic("bad"), "--config", "nonsense=1",
                          "-b", broker.bootstrap), "INVALID_CONFIG")
    assert_user_error(run("topics", "create", unique_topic("bad"), "--config", "novalue",
                          "-b", broker.bootstrap), "expected key=value")
    assert_user_error(run("topics", "alter-config", topic, "-b", broker.bootstrap),
                      "nothing to change")
    assert_user_error(run("configs", "describe", "topic", unique_topic("missing"), "-b",
                          broker.bootstrap), "UNKNOWN_TOPIC_OR_PART")


def test_create_if_not_exists_is_idempotent(broker):
    topic = unique_topic("idempotent")
    run_ok("topics", "create", topic, "-p", "2", "-b", broker.bootstrap)
    run_ok("topics", "create", topic, "-p", "5", "--if-not-exists", "-b", broker.bootstrap)
    assert _partition_count(broker, topic) == 2


def test_unreachable_broker_fails_within_the_request_timeout():
    with socket.socket() as listener:  # a port nobody answers on once the socket is closed
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    bootstrap = f"127.0.0.1:{port}"
    for command in (["topics", "list"], ["consume", "t"]):
        result = run(*command, "-b", bootstrap, "--request-timeout-ms", "500")
        assert_user_error(result, f"cannot reach a broker at {bootstrap} within 500 ms")
    result = run("produce", "t", "-b", bootstrap, "--request-timeout-ms", "500", stdin=b"x\n")
    assert_user_error(result, "cannot reach a broker")
