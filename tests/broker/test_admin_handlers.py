"""The admin API handlers called directly, over a real LogManager in a temporary directory.

Each test builds a kio request for a given version, runs the handler, encodes the response
(so every answer is valid on the wire for that version) and checks Kafka's error codes and
the effect on the log manager, the topic config files and the dynamic broker config file.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest

from headrace.broker.config import BrokerConfig
from headrace.broker.context import RequestContext
from headrace.broker.handlers import HANDLERS
from headrace.broker.state import AppendHub, BrokerState, ProducerIdAllocator
from headrace.protocol import wire
from headrace.protocol.records import build_batch
from headrace.storage.clock import ManualClock
from headrace.storage.manager import LogManager

NODE_ID = 1
CREATE_TOPICS, DELETE_TOPICS, DELETE_RECORDS = 19, 20, 21
DESCRIBE_CONFIGS, ALTER_CONFIGS, CREATE_PARTITIONS = 32, 33, 37
INCREMENTAL_ALTER_CONFIGS, DESCRIBE_CLUSTER = 44, 60
TOPIC, BROKER = 2, 4
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

NONE = 0
OFFSET_OUT_OF_RANGE = 1
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_TOPIC_EXCEPTION = 17
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
POLICY_VIOLATION = 44
UNKNOWN_TOPIC_ID = 100
MISMATCHED_ENDPOINT_TYPE = 114


class Admin:
    """A broker state over real files and a way to call the admin handlers on it."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.loop = asyncio.new_event_loop()
        self.clock = ManualClock()
        self.state = self._start()

    def _start(self) -> BrokerState:
        config = BrokerConfig({"log.dirs": str(self.data_dir), "node.id": str(NODE_ID),
                               "listeners": "PLAINTEXT://127.0.0.1:0", "num.partitions": "2"})
        log_manager = LogManager(config.log_dirs, config.properties(), self.clock)
        log_manager.startup()
        config.add_change_listener(log_manager.set_broker_defaults)
        return BrokerState(
            config=config, log_manager=log_manager, clock=self.clock, node_id=NODE_ID,
            cluster_id="test-cluster-id", advertised_host="127.0.0.1", advertised_port=19092,
            producer_ids=ProducerIdAllocator(self.data_dir), appended=AppendHub(self.loop),
        )

    def restart(self) -> None:
        self.state.log_manager.shutdown()
        self.state.append_executor.shutdown()
        self.state = self._start()

    def close(self) -> None:
        self.state.log_manager.shutdown()
        self.state.append_executor.shutdown()
        self.loop.close()

    def call(self, api_key: int, version: int, body: dict):
        request = wire.build(wire.request_class(api_key, version), body)
        header = wire.RequestHeader(api_key, version, 7, "test")
        ctx = RequestContext(header, self.state, self.clock.now_ms(), "127.0.0.1")
        response = self.loop.run_until_complete(HANDLERS[api_key].module.handle(ctx, request))
        frame = wire.encode_response(header, response)
        _, decoded = wire.decode_response(api_key, version, frame[4:])
        return decoded

    def create(self, name: str, partitions: int = 1, configs: dict | None = None,
               version: int = 7, **extra):
        topic = {"name": name, "num_partitions": partitions, "replication_factor": -1,
                 "assignments": [], "configs": [{"name": k, "value": v}
                                                for k, v in (configs or {}).items()]}
        topic.update(extra)
        return self.call(CREATE_TOPICS, version, {"topics": [topic], "timeout": 5000})

    def describe_topic(self, name: str, keys=None, version: int = 4, synonyms: bool = False):
        body = {"resources": [{"resource_type": TOPIC, "resource_name": name,
                               "configuration_keys": keys}],
                "include_synonyms": synonyms, "include_documentation": True}
        return self.call(DESCRIBE_CONFIGS, version, body).results[0]

    def incremental(self, resource_type: int, name: str, ops: list[tuple[str, int, str | None]],
                    validate_only: bool = False):
        configs = [{"name": n, "config_operation": op, "value": v} for n, op, v in ops]
        body = {"resources": [{"resource_type": resource_type, "resource_name": name,
                               "configs": configs}], "validate_only": validate_only}
        return self.call(INCREMENTAL_ALTER_CONFIGS, 1, body).responses[0]


@pytest.fixture
def admin(tmp_path):
    harness = Admin(tmp_path / "data")
    yield harness
    harness.close()


def _values(result) -> dict[str, tuple[str | None, int]]:
    return {c.name: (c.value, c.config_source) for c in result.configs}


# --- CreateTopics ---------------------------------------------------------------------------


def test_create_topics_v7_reports_partitions_replication_and_configs(admin):
    result = admin.create("orders", 3, {"retention.ms": "1000"}).topics[0]
    assert result.error_code == NONE
    assert result.num_partitions == 3 and result.replication_factor == 1
    configs = {c.name: c for c in result.configs}
    assert configs["retention.ms"].value == "1000" and configs["retention.ms"].config_source == 1
    assert configs["segment.bytes"].config_source == 5
    info = admin.state.log_manager.topic("orders")
    assert info.partitions == 3 and result.topic_id == info.topic_id
    assert info.config.retention_ms == 1000


def test_create_topics_defaults_and_old_version(admin):
    result = admin.create("defaulted", -1, version=2).topics[0]
    assert result.error_code == NONE
    assert admin.state.log_manager.topic("defaulted").partitions == 2  # num.partitions


@pytest.mark.parametrize(("name", "message"), [
    ("", "can't be empty"), ("..", "cannot be"), ("a" * 250, "longer than 249"),
    ("bad/name", "contains a character other than"),
])
def test_create_topics_rejects_illegal_names(admin, name, message):
    result = admin.create(name).topics[0]
    assert result.error_code == INVALID_TOPIC_EXCEPTION
    assert message in result.error_message


def test_create_topics_existing_colliding_and_duplicate_names(admin):
    assert admin.create("a.b").topics[0].error_code == NONE
    again = admin.create("a.b").topics[0]
    assert again.error_code == TOPIC_ALREADY_EXISTS and "already exists" in again.error_message
    collision = admin.create("a_b").topics[0]
    assert collision.error_code == INVALID_TOPIC_EXCEPTION and "collides" in collision.error_message
    topic = {"name": "twice", "num_partitions": 1, "replication_factor": 1, "assignments": [],
             "configs": []}
    duplicated = admin.call(CREATE_TOPICS, 7, {"topics": [topic, topic]}).topics
    assert [(t.name, t.error_code) for t in duplicated] == [("twice", INVALID_REQUEST)]
    assert "twice" not in admin.state.log_manager.topics()


@pytest.mark.parametrize(("partitions", "replication", "code"), [
    (0, -1, INVALID_PARTITIONS), (-2, -1, INVALID_PARTITIONS),
    (1, 0, INVALID_REPLICATION_FACTOR), (1, -2, INVALID_REPLICATION_FACTOR),
    (1, 3, INVALID_REPLICATION_FACTOR),
])
def test_create_topics_rejects_bad_counts(admin, partitions, replication, code):
    result = admin.create("counted", partitions, replication_factor=replication).topics[0]
    assert result.error_code == code and result.error_message
    assert "counted" not in admin.state.log_manager.topics()


def test_create_topics_rejects_bad_configs_naming_key_and_value(admin):
    bad_value = admin.create("c1", 1, {"retention.ms": "-5"}).topics[0]
    assert bad_value.error_code == INVALID_CONFIG
    assert "retention.ms" in bad_value.error_message and "-5" in bad_value.error_message
    unknown = admin.create("c2", 1, {"no.such.config": "1"}).topics[0]
    assert unknown.error_code == INVALID_CONFIG and "no.such.config" in unknown.error_message
    null = admin.create("c3", 1, {"cleanup.policy": None}).topics[0]
    assert null.error_code == INVALID_CONFIG
    # config errors come before partition errors, as in Kafka's controller
    both = admin.create("c4", 0, {"retention.ms": "x"}).topics[0]
    assert both.error_code == INVALID_CONFIG


def test_create_topics_manual_assignments(admin):
    placed = admin.create("manual", -1, assignments=[
        {"partition_index": 0, "broker_ids": [NODE_ID]},
        {"partition_index": 1, "broker_ids": [NODE_ID]}]).topics[0]
    assert placed.error_code == NONE and admin.state.log_manager.topic("manual").partitions == 2
    elsewhere = admin.create("m2", -1, assignments=[
        {"partition_index": 0, "broker_ids": [2]}]).topics[0]
    assert elsewhere.error_code == INVALID_REPLICA_ASSIGNMENT
    twice = admin.create("m3", -1, assignments=[
        {"partition_index": 0, "broker_ids": [NODE_ID, NODE_ID]}]).topics[0]
    assert twice.error_code == INVALID_REPLICA_ASSIGNMENT
    gap = admin.create("m4", -1, assignments=[
        {"partition_index": 1, "broker_ids": [NODE_ID]}]).topics[0]
    assert gap.error_code == INVALID_REPLICA_ASSIGNMENT
    with_count = admin.create("m5", 1, assignments=[
        {"partition_index": 0, "broker_ids": [NODE_ID]}]).topics[0]
    assert with_count.error_code == INVALID_REQUEST


def test_create_topics_validate_only_creates_nothing(admin):
    body = {"topics": [{"name": "dry", "num_partitions": 4, "replication_factor": 1,
                        "assignments": [], "configs": []}], "validate_only": True}
    result = admin.call(CREATE_TOPICS, 7, body).topics[0]
    assert result.error_code == NONE and result.num_partitions == 4
    assert "dry" not in admin.state.log_manager.topics()


# --- DeleteTopics ---------------------------------------------------------------------------


def test_delete_topics_by_name_and_by_id(admin):
    admin.create("gone")
    admin.create("gone-too")
    by_name = admin.call(DELETE_TOPICS, 1, {"topic_names": ["gone", "missing"], "timeout": 1000})
    assert [(r.name, r.error_code) for r in by_name.responses] == [
        ("gone", NONE), ("missing", UNKNOWN_TOPIC_OR_PARTITION)]
    topic_id = admin.state.log_manager.topic("gone-too").topic_id
    body = {"topics": [{"name": None, "topic_id": topic_id},
                       {"name": None, "topic_id": uuid.uuid4()}], "timeout": 1000}
    by_id = admin.call(DELETE_TOPICS, 6, body).responses
    assert (by_id[0].name, by_id[0].topic_id, by_id[0].error_code) == ("gone-too", topic_id, NONE)
    assert by_id[1].error_code == UNKNOWN_TOPIC_ID
    assert admin.state.log_manager.topics() == {}


def test_delete_topics_rejects_duplicates_and_ambiguous_states(admin):
    admin.create("kept")
    duplicated = admin.call(DELETE_TOPICS, 6, {"topics": [
        {"name": "kept", "topic_id": None}, {"name": "kept", "topic_id": None}]}).responses
    assert [(r.name, r.error_code) for r in duplicated] == [("kept", INVALID_REQUEST)]
    both = admin.call(DELETE_TOPICS, 6, {"topics": [
        {"name": "kept", "topic_id": uuid.uuid4()}]}).responses[0]
    assert both.error_code == INVALID_REQUEST
    assert "kept" in admin.state.log_manager.topics()


# --- CreatePartitions -----------------------------------------------------------------------


def test_create_partitions_grows_and_rejects_non_increase(admin):
    admin.create("grow", 2)

    def grow(count, validate_only=False, assignments=None, name="grow"):
        body = {"topics": [{"name": name, "count": count, "assignments": assignments}],
                "timeout": 1000, "validate_only": validate_only}
        return admin.call(CREATE_PARTITIONS, 3, body).results[0]

    assert grow(5, validate_only=True).error_code == NONE
    assert admin.state.log_manager.topic("grow").partitions == 2
    assert grow(4).error_code == NONE
    assert admin.state.log_manager.topic("grow").partitions == 4
    assert admin.state.log_manager.get_log("grow", 3).log_end_offset == 0
    same = grow(4)
    assert same.error_code == INVALID_PARTITIONS and "already has 4" in same.error_message
    assert grow(3).error_code == INVALID_PARTITIONS
    assert grow(6, assignments=[{"broker_ids": [NODE_ID]}]).error_code == \
        INVALID_REPLICA_ASSIGNMENT
    assert grow(5, assignments=[{"broker_ids": [9]}]).error_code == INVALID_REPLICA_ASSIGNMENT
    assert grow(5, assignments=[{"broker_ids": [NODE_ID]}]).error_code == NONE
    assert grow(9, name="absent").error_code == UNKNOWN_TOPIC_OR_PARTITION


# --- DeleteRecords --------------------------------------------------------------------------


def _produce(admin: Admin, topic: str, count: int) -> None:
    log = admin.state.log_manager.get_log(topic, 0)
    for index in range(count):
        batch = build_batch([(None, f"v{index}".encode(), (), admin.clock.now_ms())])
        log.append(bytearray(batch), admin.clock.now_ms())


def test_delete_records_moves_log_start_and_checks_range(admin):
    admin.create("records", 2)
    _produce(admin, "records", 5)

    def delete(partition, offset, topic="records"):
        body = {"topics": [{"name": topic, "partitions": [
            {"partition_index": partition, "offset": offset}]}], "timeout": 1000}
        return admin.call(DELETE_RECORDS, 2, body).topics[0].partitions[0]

    moved = delete(0, 3)
    assert (moved.error_code, moved.low_watermark) == (NONE, 3)
    assert admin.state.log_manager.get_log("records", 0).log_start_offset == 3
    beyond = delete(0, 6)
    assert (beyond.error_code, beyond.low_watermark) == (OFFSET_OUT_OF_RANGE, -1)
    assert delete(0, -7).error_code == OFFSET_OUT_OF_RANGE
    to_high_watermark = delete(0, -1)
    assert (to_high_watermark.error_code, to_high_watermark.low_watermark) == (NONE, 5)
    assert delete(9, 0).error_code == UNKNOWN_TOPIC_OR_PARTITION
    assert delete(0, 0, topic="nope").error_code == UNKNOWN_TOPIC_OR_PARTITION


def test_delete_records_refused_on_compact_only_topics(admin):
    admin.create("compacted", 1, {"cleanup.policy": "compact"})
    body = {"topics": [{"name": "compacted", "partitions": [
        {"partition_index": 0, "offset": 0}]}], "timeout": 1000}
    result = admin.call(DELETE_RECORDS, 0, body).topics[0].partitions[0]
    assert result.error_code == POLICY_VIOLATION


# --- DescribeCluster ------------------------------------------------------------------------


def test_describe_cluster(admin):
    response = admin.call(DESCRIBE_CLUSTER, 1, {"include_cluster_authorized_operations": True,
                                                "endpoint_type": 1})
    assert response.error_code == NONE
    assert (response.cluster_id, response.controller_id) == ("test-cluster-id", NODE_ID)
    assert [(b.broker_id, b.host, b.port, b.rack) for b in response.brokers] == [
        (NODE_ID, "127.0.0.1", 19092, None)]
    assert response.cluster_authorized_operations > 0
    controllers = admin.call(DESCRIBE_CLUSTER, 2, {"endpoint_type": 2})
    assert controllers.error_code == MISMATCHED_ENDPOINT_TYPE and controllers.brokers == ()


# --- DescribeConfigs ------------------------------------------------------------------------


def test_describe_topic_configs_sources_synonyms_and_filter(admin):
    admin.create("described", 1, {"retention.ms": "5000"})
    result = admin.describe_topic("described", synonyms=True)
    assert result.error_code == NONE
    configs = {c.name: c for c in result.configs}
    retention = configs["retention.ms"]
    assert (retention.value, retention.config_source, retention.read_only) == ("5000", 1, False)
    assert retention.config_type == 5 and retention.documentation
    assert [(s.name, s.source) for s in retention.synonyms][:2] == [
        ("retention.ms", 1), ("log.retention.hours", 5)]
    assert configs["cleanup.policy"].config_type == 7
    filtered = admin.describe_topic("described", keys=["segment.bytes", "nope"], version=1)
    assert [(c.name, c.value) for c in filtered.configs] == [("segment.bytes", "1073741824")]
    missing = admin.describe_topic("absent")
    assert missing.error_code == UNKNOWN_TOPIC_OR_PARTITION and missing.configs == ()


def test_describe_broker_configs(admin):
    body = {"resources": [{"resource_type": BROKER, "resource_name": str(NODE_ID),
                           "configuration_keys": None}], "include_synonyms": False}
    result = admin.call(DESCRIBE_CONFIGS, 4, body).results[0]
    configs = {c.name: c for c in result.configs}
    assert configs["num.partitions"].value == "2" and configs["num.partitions"].config_source == 4
    assert configs["num.partitions"].read_only
    assert configs["log.retention.bytes"].config_source == 5
    assert not configs["log.retention.bytes"].read_only
    other = {"resources": [{"resource_type": BROKER, "resource_name": "7"}]}
    assert admin.call(DESCRIBE_CONFIGS, 4, other).results[0].error_code == INVALID_REQUEST
    odd_type = {"resources": [{"resource_type": 99, "resource_name": "x"}]}
    assert admin.call(DESCRIBE_CONFIGS, 4, odd_type).results[0].error_code == INVALID_REQUEST


# --- AlterConfigs (legacy) ------------------------------------------------------------------


def test_alter_configs_replaces_all_topic_overrides_live_and_persisted(admin):
    admin.create("legacy", 1, {"retention.ms": "5000", "segment.ms": "60000"})

    def alter(configs, validate_only=False):
        body = {"resources": [{"resource_type": TOPIC, "resource_name": "legacy",
                               "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
                "validate_only": validate_only}
        return admin.call(ALTER_CONFIGS, 2, body).responses[0]

    assert alter({"max.message.bytes": "2000"}, validate_only=True).error_code == NONE
    assert admin.state.log_manager.topic("legacy").overrides["retention.ms"] == "5000"
    assert alter({"max.message.bytes": "2000"}).error_code == NONE
    assert admin.state.log_manager.topic("legacy").overrides == {"max.message.bytes": "2000"}
    assert admin.state.log_manager.get_log("legacy", 0).config.max_message_bytes == 2000
    bad = alter({"max.message.bytes": "-1"})
    assert bad.error_code == INVALID_CONFIG and "max.message.bytes" in bad.error_message
    admin.restart()
    assert admin.state.log_manager.topic("legacy").overrides == {"max.message.bytes": "2000"}
    assert _values(admin.describe_topic("legacy"))["max.message.bytes"] == ("2000", 1)


def test_alter_configs_rejects_duplicates_and_unknown_topics(admin):
    body = {"resources": [{"resource_type": TOPIC, "resource_name": "absent", "configs": [
        {"name": "retention.ms", "value": "1"}]}], "validate_only": False}
    assert admin.call(ALTER_CONFIGS, 0, body).responses[0].error_code == \
        UNKNOWN_TOPIC_OR_PARTITION
    admin.create("dup")
    body = {"resources": [{"resource_type": TOPIC, "resource_name": "dup", "configs": [
        {"name": "retention.ms", "value": "1"}, {"name": "retention.ms", "value": "2"}]}]}
    assert admin.call(ALTER_CONFIGS, 1, body).responses[0].error_code == INVALID_REQUEST


def test_alter_configs_broker_replaces_dynamic_set(admin):
    def alter(configs):
        body = {"resources": [{"resource_type": BROKER, "resource_name": "", "configs": [
            {"name": k, "value": v} for k, v in configs.items()]}], "validate_only": False}
        return admin.call(ALTER_CONFIGS, 2, body).responses[0]

    assert alter({"log.retention.ms": "1000", "log.segment.bytes": "2048"}).error_code == NONE
    assert alter({"log.segment.bytes": "4096"}).error_code == NONE
    assert admin.state.config.get("log.retention.ms") is None
    assert admin.state.config.get("log.segment.bytes") == "4096"
    read_only = alter({"num.partitions": "9"})
    assert (read_only.error_code, read_only.error_message) == (
        INVALID_REQUEST, "Cannot update these configs dynamically: Set(num.partitions)")


# --- IncrementalAlterConfigs ----------------------------------------------------------------


def test_incremental_alter_topic_set_delete_append_subtract(admin):
    admin.create("inc", 1, {"retention.ms": "5000"})
    log_manager = admin.state.log_manager
    assert admin.incremental(TOPIC, "inc", [("segment.ms", SET, "60000"),
                                            ("retention.ms", DELETE, None)]).error_code == NONE
    assert log_manager.topic("inc").overrides == {"segment.ms": "60000"}
    assert admin.incremental(TOPIC, "inc", [("cleanup.policy", APPEND, "compact")]).error_code \
        == NONE
    assert log_manager.get_log("inc", 0).config.cleanup_policy == ("compact", "delete")
    assert admin.incremental(TOPIC, "inc", [("cleanup.policy", SUBTRACT, "delete")]).error_code \
        == NONE
    assert log_manager.topic("inc").config.cleanup_policy == ("compact",)
    not_list = admin.incremental(TOPIC, "inc", [("segment.ms", APPEND, "1")])
    assert not_list.error_code == INVALID_CONFIG and "not LIST" in not_list.error_message
    assert admin.incremental(TOPIC, "inc", [("segment.ms", 9, "1")]).error_code == INVALID_REQUEST
    assert admin.incremental(TOPIC, "inc", [("segment.ms", SET, None)]).error_code == \
        INVALID_REQUEST
    assert admin.incremental(TOPIC, "inc", [("bogus", SET, "1")]).error_code == INVALID_CONFIG
    assert admin.incremental(TOPIC, "inc", [("segment.ms", SET, "1"), ("segment.ms", SET, "2")]
                             ).error_code == INVALID_REQUEST
    dry = admin.incremental(TOPIC, "inc", [("segment.ms", SET, "70000")], validate_only=True)
    assert dry.error_code == NONE and log_manager.topic("inc").overrides["segment.ms"] == "60000"
    assert admin.incremental(TOPIC, "absent", [("segment.ms", SET, "1")]).error_code == \
        UNKNOWN_TOPIC_OR_PARTITION


def test_incremental_alter_broker_configs_apply_to_topics_and_persist(admin):
    admin.create("follows", 1)
    result = admin.incremental(BROKER, str(NODE_ID), [("log.retention.ms", SET, "12345")])
    assert result.error_code == NONE
    assert admin.state.log_manager.get_log("follows", 0).config.retention_ms == 12345
    described = _values(admin.describe_topic("follows"))
    assert described["retention.ms"] == ("12345", 2)  # from a DYNAMIC_BROKER_CONFIG synonym
    cluster_default = {"resources": [{"resource_type": BROKER, "resource_name": "",
                                      "configuration_keys": None}]}
    dynamic_only = admin.call(DESCRIBE_CONFIGS, 4, cluster_default).results[0]
    assert _values(dynamic_only) == {}  # set for this broker, not as the cluster default
    admin.restart()
    assert admin.state.config.get("log.retention.ms") == "12345"
    assert admin.state.log_manager.topic("follows").config.retention_ms == 12345
    appended = admin.incremental(BROKER, "", [("log.cleanup.policy", APPEND, "compact")])
    assert appended.error_code == NONE
    assert admin.state.config.get("log.cleanup.policy") == "delete,compact"
    assert admin.incremental(BROKER, str(NODE_ID), [("log.retention.ms", DELETE, None)]
                             ).error_code == NONE
    assert admin.state.config.get("log.retention.ms") is None
    assert admin.incremental(BROKER, "", [("node.id", SET, "5")]).error_code == INVALID_REQUEST
    assert admin.incremental(BROKER, "abc", [("log.retention.ms", SET, "1")]).error_code == \
        INVALID_REQUEST


def test_stored_dynamic_configs_no_longer_allowed_are_ignored_at_start(admin):
    """Kafka's fromPersistentProps: a stored read-only config (log.retention.hours is not
    dynamic, only log.retention.ms is) or a per-broker config stored as a cluster default is
    dropped at start; the rest of the file applies."""
    (admin.data_dir / "dynamic-broker.properties").write_text(
        "log.retention.hours=1\nlog.segment.bytes=2048\n")
    (admin.data_dir / "dynamic-default-broker.properties").write_text(
        "sasl.kerberos.min.time.before.relogin=5\nlog.retention.bytes=4096\n")
    admin.restart()
    config = admin.state.config
    assert config.dynamic_configs(per_broker=True) == {"log.segment.bytes": "2048"}
    assert config.dynamic_configs(per_broker=False) == {"log.retention.bytes": "4096"}
    assert (config.get("log.retention.hours"), config.get("log.segment.bytes")) == ("168", "2048")
    assert config.get("sasl.kerberos.min.time.before.relogin") == "60000"
