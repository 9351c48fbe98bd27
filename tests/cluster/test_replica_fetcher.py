"""Followers copying their leaders (``headrace.broker.replica_fetcher``), with three real broker
processes on a real ZooKeeper: a follower's log becomes the leader's byte for byte, idempotent
and transactional batches and markers included; a follower whose log diverged while it led an
older epoch truncates by leader epoch (KIP-101), not to its high watermark; a follower left
below the leader's log start restarts its log there; OffsetForLeaderEpoch
answers on a cluster's leader and followers; a throttled follower catches up within its
follower.replication.throttled.rate, by the quota's own accounting.

One ZooKeeper ensemble and one three-broker cluster serve the module; each test has topics of
its own, and a test that stops brokers starts them again. Waits are on observed states, bounded
in time (``wait_until``).
"""

from __future__ import annotations

import functools
import logging
import re
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from headrace.protocol import records as record_codec
from tests.broker.raw_client import RawClient
from tests.cluster import cluster_helpers
from tests.conftest import BrokerProcess, stop_brokers
from tests.record_reading import iter_headers, iter_records

WAIT_TIMEOUT_S = 2 * cluster_helpers.WAIT_TIMEOUT_S
wait_until = functools.partial(cluster_helpers.wait_until, timeout_s=WAIT_TIMEOUT_S)
BROKER_IDS = (1, 2, 3)
SESSION_TIMEOUT_MS = 4000
PRODUCE, LIST_OFFSETS, METADATA, CREATE_TOPICS, INIT_PRODUCER_ID = 0, 2, 3, 19, 22
OFFSET_FOR_LEADER_EPOCH, WRITE_TXN_MARKERS, DELETE_RECORDS = 23, 27, 21
NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = 6, 74, 75
THROTTLE_BYTES_PER_SECOND = 1_000_000
THROTTLE_WINDOW_NUM = 3  # rate over at least 2 s: a burst is judged over that much
THROTTLED_FETCH_MAX_BYTES = 100_000
CATCH_UP_BYTES = 6_000_000


class Cluster:
    """Three broker processes sharing one ZooKeeper chroot."""

    def __init__(self, base_dir: Path, connect: str) -> None:
        self.brokers: dict[int, BrokerProcess] = {}
        for broker_id in BROKER_IDS:
            data_dir = base_dir / f"broker-{broker_id}"
            data_dir.mkdir()
            self.brokers[broker_id] = BrokerProcess(data_dir, {
                "broker.id": str(broker_id), "zookeeper.connect": connect,
                "zookeeper.session.timeout.ms": str(SESSION_TIMEOUT_MS),
                "offsets.topic.num.partitions": "3",
                "replica.fetch.backoff.ms": "100",
                "replica.lag.time.max.ms": "2000",
                "auto.leader.rebalance.enable": "false",
                "controlled.shutdown.max.retries": "1",
                "controlled.shutdown.retry.backoff.ms": "100",
                "transaction.partition.verification.enable": "false",
                # the divergence test elects a replica the controller dropped from the ISR
                "unclean.leader.election.enable": "true",
                # replication quotas judged over at least 2 s (Kafka: 11 windows, 10 s)
                "replication.quota.window.num": str(THROTTLE_WINDOW_NUM),
            })

    @property
    def bootstrap(self) -> str:
        return ",".join(b.bootstrap for b in self.brokers.values())

    def start(self) -> None:
        for broker in self.brokers.values():
            broker.start()
        self.wait_for_brokers()

    def wait_for_brokers(self) -> None:
        wait_until(lambda: all(self.live_brokers(b) == set(BROKER_IDS) for b in BROKER_IDS),
                   "every broker to see the three")

    def stop(self) -> None:
        stop_brokers(self.brokers.values())

    def request(self, broker_id: int, api_key: int, version: int, values: dict):
        with RawClient(self.brokers[broker_id].bootstrap) as client:
            return client.request(api_key, version, values)

    def live_brokers(self, broker_id: int) -> set[int]:
        answer = self.request(broker_id, METADATA, 12, {
            "topics": [], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False})
        return {b.node_id for b in answer.brokers}

    def partition(self, broker_id: int, topic: str):
        """Partition 0 of ``topic`` as ``broker_id``'s Metadata has it, None while leaderless."""
        answer = self.request(broker_id, METADATA, 12, {
            "topics": [{"name": topic}], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False})
        partitions = answer.topics[0].partitions
        if answer.topics[0].error_code or not partitions or partitions[0].error_code:
            return None
        return partitions[0]

    def wait_for_leader(self, topic: str, leader: int, on: tuple[int, ...] = BROKER_IDS):
        """Until every broker in ``on`` reports ``leader`` for partition 0; its epoch."""
        def agreed():
            views = [self.partition(b, topic) for b in on]
            if all(v is not None and v.leader_id == leader for v in views):
                return views[0].leader_epoch + 1  # truthy for epoch 0
            return None
        return wait_until(agreed, f"{leader} to lead {topic} on {on}") - 1

    def create_topic(self, replicas: list[int], **configs: str) -> str:
        name = f"repl-{uuid.uuid4().hex[:10]}"
        controller = wait_until(lambda: self.controller() in BROKER_IDS and self.controller(),
                                "a controller")
        answer = self.request(controller, CREATE_TOPICS, 7, {
            "timeout": 30000, "validate_only": False, "topics": [{
                "name": name, "num_partitions": -1, "replication_factor": -1,
                "assignments": [{"partition_index": 0, "broker_ids": replicas}],
                "configs": [{"name": k.replace("_", "."), "value": v}
                            for k, v in configs.items()]}]})
        assert answer.topics[0].error_code == 0, answer.topics[0]
        self.wait_for_leader(name, replicas[0],
                             tuple(b for b in BROKER_IDS if self.is_running(b)))
        return name

    def is_running(self, broker_id: int) -> bool:
        process = self.brokers[broker_id].process
        return process is not None and process.poll() is None

    def log_bytes(self, broker_id: int, topic: str) -> bytes:
        """The partition's segment files on ``broker_id``'s disk, in offset order."""
        directory = self.brokers[broker_id].data_dir / f"{topic}-0"
        return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))

    def wait_for_identical_logs(self, topic: str, broker_ids: tuple[int, ...]) -> bytes:
        def identical():
            logs = [self.log_bytes(b, topic) for b in broker_ids]
            return logs[0] if logs[0] and all(log == logs[0] for log in logs) else None
        return wait_until(identical, f"the logs of {topic} on {broker_ids} to be identical")

    def produce(self, broker_id: int, topic: str, values: list, acks: int = 1,
                producer_id: int = -1, base_sequence: int = -1) -> None:
        """One batch per entry of ``values``: a value, or a list of values; with a
        ``producer_id``, transactional batches (epoch 0) from ``base_sequence`` on."""
        now_ms = int(time.time() * 1000)
        with RawClient(self.brokers[broker_id].bootstrap) as client:
            for value in values:
                batch_values = value if isinstance(value, list) else [value]
                batch = record_codec.build_batch(
                    [(b"k", v, [], now_ms) for v in batch_values], producer_id=producer_id,
                    producer_epoch=0 if producer_id >= 0 else -1, base_sequence=base_sequence,
                    transactional=producer_id >= 0)
                request = {
                    "transactional_id": f"txn-{topic}" if producer_id >= 0 else None,
                    "acks": acks, "timeout": 30000, "topic_data": [
                        {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}
                assert _produce_error(client, request) == 0

    def controller(self) -> int:
        answer = self.request(BROKER_IDS[0], METADATA, 12, {
            "topics": [], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False})
        return answer.controller_id

    def high_watermark(self, broker_id: int, topic: str) -> int:
        answer = self.request(broker_id, LIST_OFFSETS, 7, {
            "replica_id": -1, "isolation_level": 0, "topics": [{"name": topic, "partitions": [
                {"partition_index": 0, "current_leader_epoch": -1, "timestamp": -1}]}]})
        return answer.topics[0].partitions[0].offset

    def offset_for_leader_epoch(self, broker_id: int, topic: str, current: int, epoch: int):
        answer = self.request(broker_id, OFFSET_FOR_LEADER_EPOCH, 4, {
            "replica_id": -1, "topics": [{"topic": topic, "partitions": [
                {"partition": 0, "current_leader_epoch": current, "leader_epoch": epoch}]}]})
        partition = answer.topics[0].partitions[0]
        return partition.error_code, partition.leader_epoch, partition.end_offset


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper_ensemble):
    connect = f"{zookeeper_ensemble.connect_string}/replicas-{uuid.uuid4().hex[:8]}"
    cluster = Cluster(tmp_path_factory.mktemp("cluster"), connect)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def librdkafka_consumer(cluster: Cluster, topic: str) -> tuple[Consumer, list[str]]:
    """A consumer assigned partition 0 from offset 0, and the protocol lines it logs."""
    handler = _Lines()
    logger = logging.getLogger(f"librdkafka-{topic}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"g-{topic}",
                         "enable.auto.commit": False, "debug": "protocol,fetch",
                         "topic.metadata.refresh.interval.ms": 1000, "logger": logger})
    consumer.assign([TopicPartition(topic, 0, 0)])
    return consumer, handler.lines


def consume(consumer: Consumer, count: int) -> list:
    messages: list = []
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while len(messages) < count and time.monotonic() < deadline:
        message = consumer.poll(0.5)
        if message is not None and message.error() is None:
            messages.append(message)
    return messages


def _produce_error(client: RawClient, request: dict) -> int:
    """The partition's error code; NOT_LEADER_OR_FOLLOWER, which a new leader answers until
    it serves the partition, is retried as clients retry it (bounded)."""
    deadline = time.monotonic() + WAIT_TIMEOUT_S
    while True:
        answer = client.request(PRODUCE, 9, request)
        error = answer.responses[0].partition_responses[0].error_code
        if error != NOT_LEADER_OR_FOLLOWER or time.monotonic() > deadline:
            return error
        time.sleep(cluster_helpers.POLL_INTERVAL_S)


def new_producer_id(cluster: Cluster, broker_id: int, taken: set[int]) -> int:
    """A producer id not in ``taken`` (ids are not allocated cluster-wide yet)."""
    for _ in range(len(taken) + 1):
        producer_id = cluster.request(broker_id, INIT_PRODUCER_ID, 4, {
            "transactional_id": None, "transaction_timeout": 60000, "producer_id": -1,
            "producer_epoch": -1}).producer_id
        if producer_id not in taken:
            return producer_id
    raise AssertionError(f"broker {broker_id} allocated only producer ids in {taken}")


def values_at(log: bytes) -> dict[int, bytes]:
    return {record.offset: record.value for record in iter_records(log)}


# --- copying ---------------------------------------------------------------------------------


def test_followers_copy_the_leaders_log_byte_for_byte(cluster):
    topic = cluster.create_topic([1, 2, 3])
    idempotent = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True,
                           "linger.ms": 5})
    for n in range(200):
        idempotent.produce(topic, key=b"k%d" % (n % 7), value=b"idempotent-%d" % n, partition=0)
    assert idempotent.flush(WAIT_TIMEOUT_S) == 0
    # Transactions are not coordinated in a cluster yet: a transaction's batches and markers
    # are written to the leader as a producer and its coordinator would write them.
    producer_id = new_producer_id(
        cluster, 1, {h.producer_id for _, h in iter_headers(cluster.log_bytes(1, topic))})
    for sequence, commit in ((0, True), (20, False)):
        values = [b"txn-%d-%d" % (commit, n) for n in range(20)]
        cluster.produce(1, topic, [values], acks=-1, producer_id=producer_id,
                        base_sequence=sequence)
        answer = cluster.request(1, WRITE_TXN_MARKERS, 1, {"markers": [{
            "producer_id": producer_id, "producer_epoch": 0, "transaction_result": commit,
            "coordinator_epoch": 0, "topics": [{"name": topic, "partition_indexes": [0]}]}]})
        assert answer.markers[0].topics[0].partitions[0].error_code == 0

    log = cluster.wait_for_identical_logs(topic, BROKER_IDS)
    headers = [header for _, header in iter_headers(log, verify_crc=True)]
    assert sum(1 for r in iter_records(log)) == 200 + 40 + 2  # two markers
    assert any(h.producer_id >= 0 and not h.is_transactional for h in headers)
    assert sum(1 for h in headers if h.is_control) == 2
    assert any(h.is_transactional and not h.is_control for h in headers)


def test_offset_for_leader_epoch_is_answered_by_the_leader_only(cluster):
    topic = cluster.create_topic([2, 3, 1])
    epoch = cluster.wait_for_leader(topic, 2)
    cluster.produce(2, topic, [b"a", b"b", b"c"])
    assert cluster.offset_for_leader_epoch(2, topic, epoch, epoch) == (0, epoch, 3)
    assert cluster.offset_for_leader_epoch(2, topic, epoch + 1, epoch)[0] == UNKNOWN_LEADER_EPOCH
    # A follower checks the epoch first, then answers that it does not lead.
    assert cluster.offset_for_leader_epoch(3, topic, epoch, epoch)[0] == NOT_LEADER_OR_FOLLOWER
    assert cluster.offset_for_leader_epoch(3, topic, epoch + 1, epoch)[0] == UNKNOWN_LEADER_EPOCH
    if epoch > 0:
        assert cluster.offset_for_leader_epoch(3, topic, epoch - 1, epoch)[0] == \
            FENCED_LEADER_EPOCH


# --- truncation by leader epoch ----------------------------------------------------------------


def test_a_diverged_follower_truncates_by_epoch_not_to_its_high_watermark(cluster):
    """KIP-101's divergence: broker 1 leads epoch E and appends offsets 10..19 that broker 2
    never copies; broker 2 then leads epoch E' > E and appends its own offsets 10..14. Broker 1
    comes back with a high watermark of 20: truncating to it would keep its 10..14 and differ
    from the leader for ever; by epoch it truncates to 10 and copies the leader's."""
    topic = cluster.create_topic([1, 2], unclean_leader_election_enable="true")
    cluster.produce(1, topic, [b"both-%d" % n for n in range(10)])
    cluster.wait_for_identical_logs(topic, (1, 2))
    cluster.brokers[2].kill()
    wait_until(lambda: 2 not in cluster.live_brokers(3), "broker 2's session to expire")
    cluster.produce(1, topic, [b"old-epoch-%d" % n for n in range(10)])
    wait_until(lambda: cluster.high_watermark(1, topic) == 20, "broker 1's HW to reach 20")
    consumer, client_log = librdkafka_consumer(cluster, topic)
    try:
        assert len(consume(consumer, 20)) == 20
        cluster.brokers[1].stop()  # clean: its high watermark checkpoint says 20
        try:
            cluster.brokers[2].start()
            new_epoch = cluster.wait_for_leader(topic, 2, on=(2, 3))
            cluster.produce(2, topic, [b"new-epoch-%d" % n for n in range(5)])
            # KIP-320: the consumer sees the new epoch and validates its position with the
            # new leader before it fetches again.
            port = cluster.brokers[2].port
            wait_until(lambda: consumer.poll(0.1) is None and any(
                "OffsetForLeaderEpoch" in line and f":{port}/" in line for line in client_log),
                "librdkafka's OffsetForLeaderEpoch to the new leader")
        finally:
            cluster.brokers[1].start()
            cluster.wait_for_brokers()
    finally:
        consumer.close()
    cluster.wait_for_leader(topic, 2)
    log = cluster.wait_for_identical_logs(topic, (1, 2))
    values = values_at(log)
    assert [values[o] for o in range(15)] == (
        [b"both-%d" % n for n in range(10)] + [b"new-epoch-%d" % n for n in range(5)])
    assert cluster.offset_for_leader_epoch(2, topic, new_epoch, 0)[1:] == (0, 10)


# --- out of range -----------------------------------------------------------------------------


def test_a_follower_below_the_leaders_log_start_restarts_its_log_there(cluster):
    """Kafka's fetchOffsetAndTruncate: broker 3 was down while the leader's log start moved
    past its log end (DeleteRecords); its fetch from 0 is out of range, so it empties its log
    and starts it at the leader's log start."""
    topic = cluster.create_topic([1, 2, 3])
    cluster.brokers[3].kill()
    try:
        wait_until(lambda: 3 not in cluster.live_brokers(1), "broker 3's session to expire")
        cluster.produce(1, topic, [b"r%d" % n for n in range(10)])
        wait_until(lambda: cluster.high_watermark(1, topic) == 10, "broker 1's HW at 10")
        deleted = cluster.request(1, DELETE_RECORDS, 2, {"timeout": 30000, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "offset": 8}]}]})
        assert deleted.topics[0].partitions[0].error_code == 0
        assert deleted.topics[0].partitions[0].low_watermark == 8
    finally:
        cluster.brokers[3].start()
        cluster.wait_for_brokers()
    directory = cluster.brokers[3].data_dir / f"{topic}-0"
    wait_until(lambda: values_at(cluster.log_bytes(3, topic)) == {8: b"r8", 9: b"r9"},
               "broker 3 to hold offsets 8 and 9 only")
    assert sorted(p.name for p in directory.glob("*.log")) == ["00000000000000000008.log"]


# --- throttling ---------------------------------------------------------------------------------


def test_a_throttled_follower_catches_up_within_its_rate(cluster):
    topic = cluster.create_topic([1, 2, 3],
                                 follower_replication_throttled_replicas="0:3")
    line = throttled_catch_up(cluster, topic, {
        "follower.replication.throttled.rate": str(THROTTLE_BYTES_PER_SECOND)},
        cluster.brokers[3], "broker 3", "the follower")
    assert_within_rate(line)


def test_a_leader_throttles_a_follower_catching_up_within_its_rate(cluster):
    topic = cluster.create_topic([1, 2, 3], leader_replication_throttled_replicas="0:1")
    set_broker_config(cluster, 1, "leader.replication.throttled.rate",
                      str(THROTTLE_BYTES_PER_SECOND))
    try:
        line = throttled_catch_up(cluster, topic, {}, cluster.brokers[1], "follower 3",
                                  "the leader")
    finally:
        set_broker_config(cluster, 1, "leader.replication.throttled.rate", None)
    assert_within_rate(line)


def throttled_catch_up(cluster: Cluster, topic: str, follower_overrides: dict[str, str],
                       accountant: BrokerProcess, who: str, quota: str) -> re.Match:
    """Broker 3 stopped while CATCH_UP_BYTES go to leader 1, then started again with
    ``follower_overrides`` (and small fetches) until its log is the leader's; the line in which
    ``accountant`` reports ``quota``'s accounting when ``who`` caught up. Broker 3 is restarted
    with its own settings afterwards."""
    follower = cluster.brokers[3]
    follower.stop()
    saved = dict(follower.overrides)
    follower.overrides.update(follower_overrides)
    follower.overrides["replica.fetch.max.bytes"] = str(THROTTLED_FETCH_MAX_BYTES)
    try:
        value = b"x" * 10_000
        cluster.produce(1, topic, [value] * (CATCH_UP_BYTES // len(value)))
        mark = accountant.log_bytes()
        follower.start()
        cluster.wait_for_identical_logs(topic, (1, 3))
        return wait_until(lambda: re.search(
            rf"{who} caught up with {topic}-0 under {quota} replication quota: window rate "
            r"(\d+) bytes/s \(bound (\d+)\), (\d+) bytes recorded, throttled (\d+) ms",
            accountant.log_text(mark)), f"{quota}'s quota accounting")
    finally:
        follower.stop()
        follower.overrides = saved
        follower.start()
        cluster.wait_for_brokers()


def set_broker_config(cluster: Cluster, broker_id: int, name: str, value: str | None) -> None:
    """A dynamic config of one broker set (or deleted: None) with librdkafka's admin client."""
    operation = AlterConfigOpType.SET if value is not None else AlterConfigOpType.DELETE
    resource = ConfigResource(ResourceType.BROKER, str(broker_id), incremental_configs=[
        ConfigEntry(name, value or "", incremental_operation=operation)])
    admin = AdminClient({"bootstrap.servers": cluster.brokers[broker_id].bootstrap})
    admin.incremental_alter_configs([resource])[resource].result(WAIT_TIMEOUT_S)


def assert_within_rate(line: re.Match) -> None:
    """The quota's own accounting when the throttled replica caught up: throttling engaged,
    and the windowed rate near its bound (one fetch of THROTTLED_FETCH_MAX_BYTES over the
    2 s minimum window is the most it may overshoot by)."""
    rate, bound, recorded, throttled_ms = (int(g) for g in line.groups())
    assert bound == THROTTLE_BYTES_PER_SECOND
    assert recorded >= CATCH_UP_BYTES
    assert throttled_ms > 0
    assert rate <= 1.5 * bound
