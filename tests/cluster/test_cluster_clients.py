"""Three real broker processes coordinated through a real ZooKeeper, used by unmodified clients:
partitions spread over the brokers, produce and consume by librdkafka, kafka-python and
aiokafka, NOT_LEADER_OR_FOLLOWER from a broker that does not lead, a consumer group that
survives a SIGKILL of its coordinator's broker, stray logs removed at start-up, controlled
shutdown on SIGTERM, and Spark reading and writing across the brokers.

One ZooKeeper ensemble (``zookeeper_ensemble``) and one three-broker cluster under a chroot of
its own serve the whole module (JVM and broker starts
cost seconds); each test uses topics and groups of its own. Waits are on observed states,
bounded in time (``wait_until``).
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections import Counter, defaultdict

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from headrace.errors import (
    FencedLeaderEpoch,
    LeaderNotAvailable,
    NotLeaderOrFollower,
    UnknownLeaderEpoch,
    UnknownTopicOrPartition,
)
from tests.broker.raw_client import RawClient
from tests.cluster import cluster_helpers
from tests.conftest import BrokerProcess, stop_brokers
from tests.spark.conftest import spark  # noqa: F401 -- the SparkSession fixture

# Three brokers, ZooKeeper and a client on a shared 2-core machine: waits get twice the helpers'
# bound (still bounded; nothing here is timed).
WAIT_TIMEOUT_S = 2 * cluster_helpers.WAIT_TIMEOUT_S
wait_until = functools.partial(cluster_helpers.wait_until, timeout_s=WAIT_TIMEOUT_S)
BROKER_IDS = (1, 2, 3)
SESSION_TIMEOUT_MS = 4000  # a SIGKILLed broker leaves ZooKeeper this long after
OFFSETS_PARTITIONS = 6
RECORDS_PER_PARTITION = 25
METADATA_KEY, PRODUCE_KEY, FETCH_KEY, LIST_OFFSETS_KEY, FIND_COORDINATOR_KEY = 3, 0, 1, 2, 10
DESCRIBE_CONFIGS_KEY = 32
DESCRIBE_PRODUCERS_KEY = 61


class Cluster:
    """Three broker processes sharing one ZooKeeper chroot."""

    def __init__(self, base_dir, connect: str) -> None:
        self.connect = connect
        self.brokers = {}
        for broker_id in BROKER_IDS:
            data_dir = base_dir / f"broker-{broker_id}"
            data_dir.mkdir()
            self.brokers[broker_id] = BrokerProcess(data_dir, {
                "broker.id": str(broker_id), "zookeeper.connect": connect,
                "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
                "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
                # RF=1 flows: the group's offsets on one broker, as this module's topics
                "offsets.topic.replication.factor": "1",
                "group.initial.rebalance.delay.ms": "0",
                "controlled.shutdown.retry.backoff.ms": "100",
            })

    @property
    def bootstrap(self) -> str:
        return ",".join(broker.bootstrap for broker in self.brokers.values())

    def start(self) -> None:
        for broker in self.brokers.values():
            broker.start()
        wait_until(lambda: all(len(self.metadata(b).brokers) == len(BROKER_IDS)
                               for b in BROKER_IDS), "every broker to see the three")

    def stop(self) -> None:
        stop_brokers(self.brokers.values())

    def metadata(self, broker_id: int, topics: list[str] | None = None, version: int = 12):
        values = {"topics": None if topics is None else [{"name": t} for t in topics],
                  "allow_auto_topic_creation": False,
                  "include_topic_authorized_operations": False}
        with RawClient(self.brokers[broker_id].bootstrap) as client:
            return client.request(METADATA_KEY, version, values)

    def leaders(self, broker_id: int, topic: str) -> dict[int, int] | None:
        """partition -> leader as ``broker_id`` reports it; None while one has no leader."""
        answer = self.metadata(broker_id, [topic])
        partitions = answer.topics[0].partitions
        if answer.topics[0].error_code or not partitions:
            return None
        if any(p.error_code or p.leader_id < 0 for p in partitions):
            return None
        return {p.partition_index: p.leader_id for p in partitions}

    def wait_for_leaders(self, topic: str) -> dict[int, int]:
        """Every broker reports a leader for every partition (the same ones); those."""
        def agreed():
            views = [self.leaders(b, topic) for b in BROKER_IDS
                     if self.brokers[b].process.poll() is None]
            return views[0] if views and None not in views and all(
                v == views[0] for v in views) else None
        return wait_until(agreed, f"every broker to report leaders of {topic}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper_ensemble):
    connect = f"{zookeeper_ensemble.connect_string}/clients-{uuid.uuid4().hex[:8]}"  # brokers create it
    cluster = Cluster(tmp_path_factory.mktemp("cluster"), connect)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def create_topic(cluster: Cluster, partitions: int) -> tuple[str, dict[int, int]]:
    name = f"spread-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=WAIT_TIMEOUT_S)
    return name, cluster.wait_for_leaders(name)


def keyed_records(partitions: int) -> list[tuple[int, bytes, bytes]]:
    return [(p, b"k%d" % p, b"p%d-r%d" % (p, i))
            for i in range(RECORDS_PER_PARTITION) for p in range(partitions)]


def assert_every_record_in_order(records: list[tuple[int, bytes]], partitions: int) -> None:
    by_partition = defaultdict(list)
    for partition, value in records:
        by_partition[partition].append(value)
    expected = {p: [b"p%d-r%d" % (p, i) for i in range(RECORDS_PER_PARTITION)]
                for p in range(partitions)}
    assert dict(by_partition) == expected


# --- placement and routing ---------------------------------------------------------------


def test_twelve_partitions_are_led_four_by_each_broker(cluster):
    _topic, leaders = create_topic(cluster, 12)
    assert Counter(leaders.values()) == {1: 4, 2: 4, 3: 4}
    described = cluster.metadata(1)
    assert sorted(b.node_id for b in described.brokers) == list(BROKER_IDS)
    assert described.controller_id in BROKER_IDS


def test_a_broker_that_does_not_lead_answers_not_leader_or_follower(cluster):
    topic, leaders = create_topic(cluster, 3)
    partition, leader = next(iter(leaders.items()))
    other = next(b for b in BROKER_IDS if b != leader)
    with RawClient(cluster.brokers[other].bootstrap) as client:
        produced = client.request(PRODUCE_KEY, 9, {
            "transactional_id": None, "acks": 1, "timeout_ms": 5000,
            "topic_data": [{"name": topic, "partition_data": [
                {"index": partition, "records": _one_batch()}]}]})
        fetched = client.request(FETCH_KEY, 12, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{
                "partition": partition, "current_leader_epoch": -1, "fetch_offset": 0,
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [],
            "rack_id": ""})
        listed = client.request(LIST_OFFSETS_KEY, 5, {
            "replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
                {"partition_index": partition, "current_leader_epoch": -1,
                 "timestamp": -1}]}]})
    assert produced.responses[0].partition_responses[0].error_code == NotLeaderOrFollower.code
    assert fetched.responses[0].partitions[0].error_code == NotLeaderOrFollower.code
    assert listed.topics[0].partitions[0].error_code == NotLeaderOrFollower.code
    unknown = cluster.metadata(other, [f"absent-{uuid.uuid4().hex[:8]}"])
    assert unknown.topics[0].error_code == UnknownTopicOrPartition.code


def test_describe_producers_answers_on_the_leader_and_not_leader_or_follower_elsewhere(cluster):
    topic, leaders = create_topic(cluster, 3)
    partition, leader = next(iter(leaders.items()))
    other = next(b for b in BROKER_IDS if b != leader)
    request = {"topics": [{"name": topic, "partition_indexes": [partition]}]}
    codes = {}
    for broker_id in (leader, other):
        with RawClient(cluster.brokers[broker_id].bootstrap) as client:
            answer = client.request(DESCRIBE_PRODUCERS_KEY, 0, request)
        codes[broker_id] = answer.topics[0].partitions[0].error_code
    assert codes == {leader: 0, other: NotLeaderOrFollower.code}


def leader_and_epoch(cluster: Cluster, topic: str, partition: int) -> tuple[int, int]:
    answer = cluster.metadata(1, [topic])
    found = next(p for p in answer.topics[0].partitions if p.partition_index == partition)
    return found.leader_id, found.leader_epoch


def fetch_and_list_errors(cluster: Cluster, broker_id: int, topic: str,
                          leader_epoch: int) -> tuple[int, int]:
    """(Fetch v12's, ListOffsets v5's) error for partition 0 asked at ``leader_epoch``."""
    with RawClient(cluster.brokers[broker_id].bootstrap) as client:
        fetched = client.request(FETCH_KEY, 12, {
            "replica_id": -1, "max_wait_ms": 0, "min_bytes": 1, "max_bytes": 1 << 20,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "current_leader_epoch": leader_epoch, "fetch_offset": 0,
                "last_fetched_epoch": -1, "log_start_offset": -1,
                "partition_max_bytes": 1 << 20}]}], "forgotten_topics_data": [],
            "rack_id": ""})
        listed = client.request(LIST_OFFSETS_KEY, 5, {
            "replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
                {"partition_index": 0, "current_leader_epoch": leader_epoch,
                 "timestamp": -1}]}]})
    return (int(fetched.responses[0].partitions[0].error_code),
            int(listed.topics[0].partitions[0].error_code))


def test_a_stale_or_unknown_leader_epoch_is_refused_by_the_leader(cluster):
    topic, _ = create_topic(cluster, 1)
    leader, epoch = leader_and_epoch(cluster, topic, 0)
    wait_until(lambda: fetch_and_list_errors(cluster, leader, topic, epoch) == (0, 0),
               "the leader to serve its partition")
    assert fetch_and_list_errors(cluster, leader, topic, -1) == (0, 0)  # no check asked
    assert fetch_and_list_errors(cluster, leader, topic, epoch + 1) == (
        UnknownLeaderEpoch.code, UnknownLeaderEpoch.code)
    cluster.brokers[leader].restart()  # offline, then led again: a later epoch
    cluster.wait_for_leaders(topic)
    _, new_epoch = leader_and_epoch(cluster, topic, 0)
    assert new_epoch > epoch
    wait_until(lambda: fetch_and_list_errors(cluster, leader, topic, new_epoch) == (0, 0),
               "the leader to serve its partition again")
    assert fetch_and_list_errors(cluster, leader, topic, epoch) == (
        FencedLeaderEpoch.code, FencedLeaderEpoch.code)


def _one_batch() -> bytes:
    from headrace.protocol.records import build_batch
    return bytes(build_batch([(b"k", b"v", (), 0)]))


def test_metadata_auto_creates_a_topic_through_zookeeper(cluster):
    topic = f"auto-{uuid.uuid4().hex[:8]}"
    with RawClient(cluster.brokers[2].bootstrap) as client:
        first = client.request(METADATA_KEY, 12, {
            "topics": [{"name": topic}], "allow_auto_topic_creation": True,
            "include_topic_authorized_operations": False})
    assert first.topics[0].error_code == LeaderNotAvailable.code  # as Kafka's ZooKeeper mode
    leaders = cluster.wait_for_leaders(topic)
    assert len(leaders) == 1  # num.partitions


def test_added_partitions_are_served_by_their_leaders(cluster):
    topic, _ = create_topic(cluster, 3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_partitions([NewPartitions(topic, 6)]).values():
        future.result(timeout=WAIT_TIMEOUT_S)
    leaders = wait_until(lambda: (view := cluster.wait_for_leaders(topic)) and len(view) == 6
                         and view, "six partitions with leaders")
    assert set(leaders.values()) == set(BROKER_IDS)
    produce_values(cluster, topic, [b"v%d" % p for p in range(6)], 6)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": topic,
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(6)])
    try:
        assert sorted(_poll(consumer, 6)) == [(p, b"v%d" % p) for p in range(6)]
    finally:
        consumer.close()


def test_cluster_describe_counts_partitions_and_leaders_per_broker(cluster):
    from tests.cli.cli_runner import run_json

    topic, leaders = create_topic(cluster, 12)
    create_topic(cluster, 2)  # counts span topics
    described = run_json("cluster", "describe", "-b", cluster.brokers[3].bootstrap)
    assert [b["id"] for b in described["brokers"]] == list(BROKER_IDS)
    assert described["controller_id"] in BROKER_IDS
    assert sum(b["controller"] for b in described["brokers"]) == 1
    everything = {name: cluster.wait_for_leaders(name) for name in
                  [t.name for t in cluster.metadata(1).topics]}
    expected = Counter(leader for view in everything.values() for leader in view.values())
    assert {b["id"]: b["leaders"] for b in described["brokers"]} == {
        broker_id: expected[broker_id] for broker_id in BROKER_IDS}
    assert {b["id"]: b["partitions"] for b in described["brokers"]} == {
        broker_id: expected[broker_id] for broker_id in BROKER_IDS}  # RF=1: replica = leader
    topic_rows = run_json("topics", "describe", topic, "-b", cluster.brokers[1].bootstrap)
    assert {row["partition"]: (row["leader"], row["replicas"], row["isr"])
            for row in topic_rows["partitions"]} == {
        p: (leader, [leader], [leader]) for p, leader in leaders.items()}


def test_a_topic_config_change_reaches_every_broker_and_the_leaders_logs(cluster):
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource, ResourceType

    topic, leaders = create_topic(cluster, 3)
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", "123456", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(timeout=WAIT_TIMEOUT_S)

    def retention_ms_on(broker_id: int) -> str:
        with RawClient(cluster.brokers[broker_id].bootstrap) as client:
            answer = client.request(DESCRIBE_CONFIGS_KEY, 4, {
                "resources": [{"resource_type": 2, "resource_name": topic,
                               "configuration_keys": ["retention.ms"]}],
                "include_synonyms": False, "include_documentation": False})
        return answer.results[0].configs[0].value

    wait_until(lambda: all(retention_ms_on(b) == "123456" for b in BROKER_IDS),
               "every broker to describe the new retention.ms")
    for partition, leader in leaders.items():  # the leader's own log runs with it
        log_config = cluster.brokers[leader].data_dir / "__topic_configs" / topic
        wait_until(lambda path=log_config: "retention.ms=123456" in path.read_text(),
                   f"{topic}-{partition}'s leader to apply retention.ms")


# --- clients ---------------------------------------------------------------------------------


def test_librdkafka_produces_and_consumes_across_the_brokers(cluster):
    topic, _ = create_topic(cluster, 12)
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for partition, key, value in keyed_records(12):
        producer.produce(topic, value, key, partition=partition)
    assert producer.flush(WAIT_TIMEOUT_S) == 0
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": topic,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(12)])
    try:
        received = _poll(consumer, 12 * RECORDS_PER_PARTITION)
    finally:
        consumer.close()
    assert_every_record_in_order(received, 12)


def _poll(consumer: Consumer, count: int) -> list[tuple[int, bytes]]:
    received: list[tuple[int, bytes]] = []
    def more():
        for message in consumer.consume(100, timeout=0.5):
            assert message.error() is None, message.error()
            received.append((message.partition(), message.value()))
        return len(received) >= count
    wait_until(more, f"{count} records")
    return received


def test_kafka_python_produces_and_consumes_across_the_brokers(cluster):
    from kafka import KafkaConsumer, KafkaProducer
    from kafka import TopicPartition as KafkaPythonPartition

    topic, _ = create_topic(cluster, 12)
    producer = KafkaProducer(bootstrap_servers=cluster.bootstrap.split(","))
    for partition, key, value in keyed_records(12):
        producer.send(topic, value, key, partition=partition)
    producer.flush(WAIT_TIMEOUT_S)
    producer.close()
    consumer = KafkaConsumer(bootstrap_servers=cluster.bootstrap.split(","),
                             enable_auto_commit=False, auto_offset_reset="earliest")
    consumer.assign([KafkaPythonPartition(topic, p) for p in range(12)])
    received: list[tuple[int, bytes]] = []
    def more():
        for messages in consumer.poll(timeout_ms=500).values():
            received.extend((m.partition, m.value) for m in messages)
        return len(received) >= 12 * RECORDS_PER_PARTITION
    try:
        wait_until(more, "every record through kafka-python")
    finally:
        consumer.close()
    assert_every_record_in_order(received, 12)


def test_aiokafka_produces_and_consumes_across_the_brokers(cluster):
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
    from aiokafka import TopicPartition as AioPartition

    topic, _ = create_topic(cluster, 12)

    async def round_trip() -> list[tuple[int, bytes]]:
        producer = AIOKafkaProducer(bootstrap_servers=cluster.bootstrap)
        await producer.start()
        try:
            for partition, key, value in keyed_records(12):
                await producer.send(topic, value, key, partition=partition)
            await producer.flush()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=cluster.bootstrap,
                                    enable_auto_commit=False, auto_offset_reset="earliest")
        await consumer.start()
        received: list[tuple[int, bytes]] = []
        try:
            consumer.assign([AioPartition(topic, p) for p in range(12)])
            async def drain() -> None:
                while len(received) < 12 * RECORDS_PER_PARTITION:
                    for messages in (await consumer.getmany(timeout_ms=500)).values():
                        received.extend((m.partition, m.value) for m in messages)
            await asyncio.wait_for(drain(), WAIT_TIMEOUT_S)
        finally:
            await consumer.stop()
        return received

    assert_every_record_in_order(asyncio.run(round_trip()), 12)


# --- a consumer group across the brokers ---------------------------------------------------


def coordinator_of(cluster: Cluster, group: str) -> int:
    """The coordinator's broker id, as FindCoordinator answers it (waiting while none)."""
    def found():
        with RawClient(cluster.brokers[1].bootstrap) as client:
            answer = client.request(FIND_COORDINATOR_KEY, 3, {"key": group, "key_type": 0})
        return answer.node_id if answer.error_code == 0 else None
    return wait_until(found, f"a coordinator for {group}")


def produce_values(cluster: Cluster, topic: str, values: list[bytes], partitions: int) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "linger.ms": 5})
    for index, value in enumerate(values):
        producer.produce(topic, value, partition=index % partitions)
    assert producer.flush(WAIT_TIMEOUT_S) == 0


def consume_values(consumer: Consumer, count: int) -> list[bytes]:
    return [value for _, value in _poll(consumer, count)]


def group_consumer(cluster: Cluster, group: str, topic: str) -> Consumer:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group,
                         "auto.offset.reset": "earliest", "enable.auto.commit": False,
                         "session.timeout.ms": 10_000, "topic.metadata.refresh.interval.ms": 500})
    consumer.subscribe([topic])
    return consumer


def restart_after_session_expiry(cluster: Cluster, broker_id: int) -> None:
    """SIGKILL ``broker_id``, wait until the others no longer list it, start it again."""
    cluster.brokers[broker_id].kill()
    survivor = next(b for b in BROKER_IDS if b != broker_id)
    wait_until(lambda: broker_id not in {b.node_id for b in cluster.metadata(survivor).brokers},
               f"broker {broker_id}'s registration to expire")
    cluster.brokers[broker_id].start()


def test_consumer_group_survives_a_sigkill_of_its_coordinators_broker(cluster):
    topic, _ = create_topic(cluster, 6)
    group = f"group-{uuid.uuid4().hex[:8]}"
    first, second, third = ([b"%s-%d" % (name, i) for i in range(30)]
                            for name in (b"first", b"second", b"third"))
    produce_values(cluster, topic, first, 6)
    consumer = group_consumer(cluster, group, topic)
    try:
        assert sorted(consume_values(consumer, len(first))) == sorted(first)
        consumer.commit(asynchronous=False)
        coordinator = coordinator_of(cluster, group)
        restart_after_session_expiry(cluster, coordinator)
        cluster.wait_for_leaders(topic)
        produce_values(cluster, topic, second, 6)
        assert sorted(consume_values(consumer, len(second))) == sorted(second)
        consumer.commit(asynchronous=False)
    finally:
        consumer.close()
    produce_values(cluster, topic, third, 6)
    resumed = group_consumer(cluster, group, topic)
    try:
        assert sorted(consume_values(resumed, len(third))) == sorted(third)
        assert resumed.consume(100, timeout=1.0) == []  # nothing before the committed offsets
    finally:
        resumed.close()


# --- local logs follow the cluster ---------------------------------------------------------


def test_logs_of_a_topic_deleted_while_its_broker_was_down_are_removed_at_start(cluster):
    topic, leaders = create_topic(cluster, 3)
    broker_id = leaders[0]
    directory = cluster.brokers[broker_id].data_dir / f"{topic}-0"
    wait_until(directory.is_dir, f"{directory} to be created")
    cluster.brokers[broker_id].stop()
    admin = AdminClient({"bootstrap.servers": ",".join(
        cluster.brokers[b].bootstrap for b in BROKER_IDS if b != broker_id)})
    for future in admin.delete_topics([topic]).values():
        future.result(timeout=WAIT_TIMEOUT_S)
    wait_until(lambda: all(cluster.metadata(b, [topic]).topics[0].error_code
                           == UnknownTopicOrPartition.code
                           for b in BROKER_IDS if b != broker_id), f"{topic} to be deleted")
    mark = cluster.brokers[broker_id].log_bytes()
    cluster.brokers[broker_id].start()
    assert not directory.exists()
    assert f"deleting the local logs of topic {topic}" in cluster.brokers[broker_id].log_text(mark)


def test_sigterm_shuts_down_through_the_controller(cluster):
    topic, leaders = create_topic(cluster, 3)
    broker_id = leaders[0]
    broker = cluster.brokers[broker_id]
    mark = broker.log_bytes()
    assert broker.stop() == 0
    assert "controlled shutdown succeeded" in broker.log_text(mark)
    survivor = next(b for b in BROKER_IDS if b != broker_id)
    offline = wait_until(lambda: [p for p in cluster.metadata(survivor, [topic]).topics[0]
                                  .partitions if p.partition_index == 0
                                  and p.error_code == LeaderNotAvailable.code],
                         "the stopped broker's single-replica partition to go offline")
    assert offline[0].leader_id == -1
    broker.start()
    cluster.wait_for_leaders(topic)


# --- Spark --------------------------------------------------------------------------------


def test_spark_writes_and_reads_a_topic_spread_over_the_brokers(cluster, spark):  # noqa: F811
    from pyspark.sql import Row

    topic, leaders = create_topic(cluster, 6)
    assert set(leaders.values()) == set(BROKER_IDS)
    rows = [Row(value=b"v%d" % i, partition=i % 6) for i in range(60)]
    (spark.createDataFrame(rows, "value binary, partition int").write.format("headrace")
     .option("kafka.bootstrap.servers", cluster.bootstrap).option("topic", topic)
     .mode("append").save())
    read = (spark.read.format("headrace").option("kafka.bootstrap.servers", cluster.bootstrap)
            .option("subscribe", topic).option("startingOffsets", "earliest")
            .option("endingOffsets", "latest").load().collect())
    assert sorted((row.partition, row.value) for row in read) == sorted(
        (row.partition, row.value) for row in rows)
