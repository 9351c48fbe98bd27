"""The leader side of replication, driven by raw followers: a real broker process leads
partitions whose other replicas are ids of no running broker, and a raw wire client fetches
for them with their replica id (Fetch v12's ``replica_id``), so each test decides when each
follower has which records: the high watermark, what consumers see (a waiting consumer
fetch wakes when the high watermark passes new records), when acks=all is answered, ISR
expansion and shrink as the partition state znode shows them, NOT_ENOUGH_REPLICAS before and
after the append, REQUEST_TIMED_OUT, the leader epoch stamped into batches, and the last
replica standing (``cluster.partition_leader``): a leader alone in its ISR keeps every record
it acknowledged through a power cut (broker 2 runs under the power-cut shim,
``tests/power_cut.py``); an offset commit is answered once the offsets topic's followers have
it (the brokers take one offsets partition, which a test creates on broker 1 and a raw
follower), and so are transaction markers (WriteTxnMarkers); DeleteRecords is answered once
the followers on live brokers report log starts past the offset (a raw follower registered as
a broker).

One ZooKeeper ensemble and two brokers under one chroot serve the module: broker 1 keeps
Kafka's replica.lag.time.max.ms (30 s: no follower leaves its ISRs during a test), broker 2 a
short one (its ISRs shrink within a test). Topics are written to ZooKeeper as Kafka's
AdminZkClient writes them, with an explicit assignment naming the raw followers (the
topic admin places replicas on live brokers only). Waits are on observed states, bounded.
"""

from __future__ import annotations

import dataclasses
import functools
import select
import time
import uuid

import pytest

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.coordinator.records import OFFSETS_TOPIC_NAME
from headrace.errors import (
    NotEnoughReplicas,
    NotEnoughReplicasAfterAppend,
    NotLeaderOrFollower,
    RequestTimedOut,
    UnknownLeaderEpoch,
)
from headrace.protocol import records as record_codec
from headrace.protocol import wire
from tests.broker.raw_client import SOCKET_TIMEOUT_S, RawClient
from tests.cluster import cluster_helpers
from tests.conftest import BrokerProcess, stop_brokers
from tests.power_cut import PowerCutBroker, build_shim
from tests.record_reading import iter_records

PRODUCE, FETCH, LIST_OFFSETS, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 2, 8, 9
INIT_PRODUCER_ID, WRITE_TXN_MARKERS, DELETE_RECORDS, METADATA = 22, 27, 21, 3
FETCH_VERSION = 12  # the last version with the replica_id body field
PATIENT_BROKER, IMPATIENT_BROKER = 1, 2
SHORT_LAG_TIME_MS = 1500
WAIT_TIMEOUT_S = 2 * cluster_helpers.WAIT_TIMEOUT_S
wait_until = functools.partial(cluster_helpers.wait_until, timeout_s=WAIT_TIMEOUT_S)
CONSUMER = -1
NO_EPOCH = -1


class LeaderCluster:
    def __init__(self, base_dir, ensemble, shim) -> None:
        chroot = f"/replication-leader-{uuid.uuid4().hex[:8]}"
        connect = ensemble.connect_string + chroot
        self.brokers = {}
        for broker_id, lag_ms in ((PATIENT_BROKER, 30_000), (IMPATIENT_BROKER, SHORT_LAG_TIME_MS)):
            data_dir = base_dir / f"broker-{broker_id}"
            data_dir.mkdir()
            overrides = {
                "broker.id": str(broker_id), "zookeeper.connect": connect,
                "zookeeper.session.timeout.ms": "4000",
                "replica.lag.time.max.ms": str(lag_ms),
                # the raw followers are no brokers: no leadership could move at shutdown
                "controlled.shutdown.enable": "false",
                "offsets.topic.num.partitions": "1",  # the offsets topic a test writes
                # transactions are not coordinated in a cluster yet: a test writes a
                # transaction's batches and markers as producer and coordinator would
                "transaction.partition.verification.enable": "false"}
            self.brokers[broker_id] = (
                BrokerProcess(data_dir, overrides) if broker_id == PATIENT_BROKER
                else PowerCutBroker(data_dir, shim, overrides))
        self.zk = None
        self.connect = connect
        self.topic_ids: dict[str, uuid.UUID] = {}

    def start(self) -> None:
        for broker in self.brokers.values():
            broker.start()
        self.zk = cluster_helpers.zookeeper_client(self.connect)
        wait_until(lambda: sorted(self.zk.get_children(paths.BROKER_IDS)) == ["1", "2"],
                   "both brokers to register")

    def stop(self) -> None:
        if self.zk is not None:
            cluster_helpers.close(self.zk)
        stop_brokers(self.brokers.values())

    def bootstrap(self, broker_id: int) -> str:
        return self.brokers[broker_id].bootstrap

    def create_topic(self, replicas: tuple[int, ...], min_insync_replicas: int,
                     name: str | None = None, configs: dict[str, str] | None = None) -> str:
        """One partition on ``replicas`` (the first leads), as Kafka's AdminZkClient writes
        a topic: config then assignment; then until its leader serves it."""
        name = name or f"replicated-{uuid.uuid4().hex[:10]}"
        configs = {**(configs or {}), "min.insync.replicas": str(min_insync_replicas)}
        assignment = records.TopicAssignment(topic_id=records.new_topic_id(),
                                             partitions={0: replicas})
        transaction = self.zk.transaction()
        transaction.create(paths.topic_config_path(name), records.encode_entity_config(configs))
        transaction.create(paths.topic_path(name), records.encode_topic_assignment(assignment))
        assert not any(isinstance(result, Exception) for result in transaction.commit())
        self.topic_ids[name] = uuid.UUID(bytes=assignment.topic_id)
        wait_until(lambda: self.state(name) is not None, f"{name}'s state")
        wait_until(lambda: list_offset(self.bootstrap(replicas[0]), name) == (0, 0),
                   f"broker {replicas[0]} to serve {name}")
        return name

    def state(self, topic: str) -> records.PartitionState | None:
        return cluster_helpers.partition_state(self.zk, topic, 0)

    def wait_for_isr(self, topic: str, isr: set[int]) -> records.PartitionState:
        return wait_until(lambda: (state := self.state(topic)) is not None
                          and set(state.isr) == isr and state,
                          f"the ISR of {topic} to be {sorted(isr)}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory, zookeeper_ensemble):
    shim = build_shim(tmp_path_factory.mktemp("power-cut-shim"))
    cluster = LeaderCluster(tmp_path_factory.mktemp("leader"), zookeeper_ensemble, shim)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


# --- raw requests ------------------------------------------------------------------------------


def fetch_request(topic: str, offset: int, replica_id: int, leader_epoch: int = NO_EPOCH,
                  max_wait_ms: int = 0, log_start_offset: int = -1) -> dict:
    return {"replica_id": replica_id, "max_wait": max_wait_ms, "min_bytes": 1,
            "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20,
                "current_leader_epoch": leader_epoch, "last_fetched_epoch": -1,
                "log_start_offset": log_start_offset}]}]}


def fetch(bootstrap: str, topic: str, offset: int, replica_id: int,
          leader_epoch: int = NO_EPOCH, log_start_offset: int = -1):
    """One partition's Fetch v12 answer, for a follower (``replica_id`` >= 0) or a consumer."""
    with RawClient(bootstrap) as client:
        answer = client.request(FETCH, FETCH_VERSION, fetch_request(
            topic, offset, replica_id, leader_epoch, log_start_offset=log_start_offset))
    return answer.responses[0].partitions[0]


def fetched_values(partition) -> list[bytes]:
    return [record.value for record in iter_records(partition.records or b"")]


def list_offset(bootstrap: str, topic: str) -> tuple[int, int]:
    """(error code, latest offset) a consumer is told."""
    with RawClient(bootstrap) as client:
        answer = client.request(LIST_OFFSETS, 7, {
            "replica_id": CONSUMER, "isolation_level": 0, "topics": [{
                "name": topic, "partitions": [{"partition_index": 0, "timestamp": -1,
                                               "current_leader_epoch": -1}]}]})
    partition = answer.topics[0].partitions[0]
    return partition.error_code, partition.offset


def produce_request(topic: str, values: list[bytes], acks: int, timeout_ms: int = 30_000,
                    producer_id: int = -1):
    """One batch of ``values``; with a ``producer_id``, a transactional one (epoch 0)."""
    batch = record_codec.build_batch(
        [(b"k", value, [], int(time.time() * 1000)) for value in values],
        producer_id=producer_id, producer_epoch=0 if producer_id >= 0 else -1,
        base_sequence=0 if producer_id >= 0 else -1, transactional=producer_id >= 0)
    return {"acks": acks, "timeout": timeout_ms,
            "transactional_id": f"txn-{topic}" if producer_id >= 0 else None, "topic_data": [
                {"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}


def produce(bootstrap: str, topic: str, values: list[bytes], acks: int, timeout_ms: int = 30_000):
    with RawClient(bootstrap) as client:
        answer = client.request(PRODUCE, 9, produce_request(topic, values, acks, timeout_ms))
    return answer.responses[0].partition_responses[0]


def receive_produce(client: RawClient, correlation_id: int):
    received_id, answer = wire.decode_response(PRODUCE, 9, client.receive_frame())
    assert received_id == correlation_id
    return answer.responses[0].partition_responses[0]


def answered(client: RawClient) -> bool:
    """Whether a response is waiting on ``client``'s socket now."""
    return bool(select.select([client.sock], [], [], 0)[0])


def join_isr(cluster: LeaderCluster, topic: str, leader: int, followers: tuple[int, ...],
             offset: int = 0) -> None:
    """The raw followers fetch at ``offset`` (the log end) until the leader has added them
    all to the ISR (one proposal at a time)."""
    def joined() -> bool:
        for follower in followers:
            assert fetch(cluster.bootstrap(leader), topic, offset, follower).error_code == 0
        state = cluster.state(topic)
        return state is not None and set(state.isr) == {leader, *followers}
    wait_until(joined, f"{list(followers)} to join the ISR of {topic}")


# --- tests ---------------------------------------------------------------------------------------


def test_acks_all_is_answered_and_consumers_see_records_once_every_isr_follower_has_them(cluster):
    leader = PATIENT_BROKER
    topic = cluster.create_topic((leader, 11, 12), min_insync_replicas=2)
    join_isr(cluster, topic, leader, (11, 12))
    bootstrap = cluster.bootstrap(leader)
    with RawClient(bootstrap) as producer:
        correlation_id = producer.send(PRODUCE, 9, produce_request(topic, [b"a", b"b"], -1))
        # follower 11 copies the records (waiting for the append) and reports them
        copied = wait_until(lambda: fetched_values(fetch(bootstrap, topic, 0, 11)) or None,
                            "the append")
        assert copied == [b"a", b"b"]
        assert fetch(bootstrap, topic, 2, 11).high_watermark == 0  # 12 is still at 0
        consumer_view = fetch(bootstrap, topic, 0, CONSUMER)
        assert (consumer_view.high_watermark, fetched_values(consumer_view)) == (0, [])
        assert list_offset(bootstrap, topic) == (0, 0)
        assert not answered(producer), receive_produce(producer, correlation_id)
        assert fetch(bootstrap, topic, 2, 12).high_watermark == 2
        response = receive_produce(producer, correlation_id)
    assert (response.error_code, response.base_offset) == (0, 0)
    assert fetched_values(fetch(bootstrap, topic, 0, CONSUMER)) == [b"a", b"b"]
    assert list_offset(bootstrap, topic) == (0, 2)


def test_acks_all_times_out_while_a_follower_lags_and_acks_one_does_not_wait(cluster):
    leader = PATIENT_BROKER
    topic = cluster.create_topic((leader, 13, 14), min_insync_replicas=2)
    join_isr(cluster, topic, leader, (13, 14))
    bootstrap = cluster.bootstrap(leader)
    timed_out = produce(bootstrap, topic, [b"x"], acks=-1, timeout_ms=200)
    assert (timed_out.error_code, timed_out.base_offset) == (RequestTimedOut.code, 0)
    written = produce(bootstrap, topic, [b"y"], acks=1)
    assert (written.error_code, written.base_offset) == (0, 1)
    assert list_offset(bootstrap, topic) == (0, 0)  # neither is committed yet


def test_a_waiting_consumer_fetch_returns_once_the_high_watermark_passes_new_records(cluster):
    leader = PATIENT_BROKER
    topic = cluster.create_topic((leader, 17), min_insync_replicas=1)
    join_isr(cluster, topic, leader, (17,))
    bootstrap = cluster.bootstrap(leader)
    with RawClient(bootstrap) as consumer:
        # a long poll far beyond the socket timeout: only a wake-up answers it in time
        correlation_id = consumer.send(FETCH, FETCH_VERSION, fetch_request(
            topic, 0, CONSUMER, max_wait_ms=10 * int(SOCKET_TIMEOUT_S * 1000)))
        assert produce(bootstrap, topic, [b"p"], acks=1).error_code == 0
        assert not answered(consumer)  # appended, but above the high watermark
        assert fetch(bootstrap, topic, 1, 17).high_watermark == 1
        received_id, answer = wire.decode_response(FETCH, FETCH_VERSION,
                                                   consumer.receive_frame())
    assert received_id == correlation_id
    assert fetched_values(answer.responses[0].partitions[0]) == [b"p"]


def test_a_follower_fetching_with_replica_state_of_fetch_v15_joins_the_isr(cluster):
    leader = PATIENT_BROKER
    topic = cluster.create_topic((leader, 18), min_insync_replicas=1)
    with RawClient(cluster.bootstrap(leader)) as follower:
        answer = follower.request(FETCH, 15, {
            "replica_state": {"replica_id": 18, "replica_epoch": -1}, "max_wait": 0,
            "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "rack_id": "", "forgotten_topics_data": [],
            "topics": [{"topic_id": cluster.topic_ids[topic], "partitions": [{
                "partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
                "current_leader_epoch": -1, "last_fetched_epoch": -1,
                "log_start_offset": -1}]}]})
    assert answer.responses[0].partitions[0].error_code == 0
    cluster.wait_for_isr(topic, {leader, 18})


def test_the_leader_stamps_its_leader_epoch_into_appended_batches(cluster):
    leader = PATIENT_BROKER
    topic = cluster.create_topic((leader, 15), min_insync_replicas=1)
    # a later epoch, as a controller's re-election would write it (same leader)
    state = cluster.state(topic)
    epoch = state.leader_epoch + 3
    cluster.zk.set(paths.partition_state_path(topic, 0), records.encode_partition_state(
        dataclasses.replace(state, leader_epoch=epoch)))
    bootstrap = cluster.bootstrap(leader)
    wait_until(lambda: fetch(bootstrap, topic, 0, 15, leader_epoch=epoch).error_code == 0,
               f"the leader to be in epoch {epoch}")
    assert produce(bootstrap, topic, [b"e"], acks=1).error_code == 0
    copied = fetch(bootstrap, topic, 0, 15, leader_epoch=epoch)
    assert copied.error_code == 0
    partition_leader_epoch = int.from_bytes(copied.records[12:16], "big", signed=True)
    assert partition_leader_epoch == epoch


def test_a_fetch_from_a_broker_outside_the_assignment_is_refused(cluster):
    leader = PATIENT_BROKER
    topic = cluster.create_topic((leader, 16), min_insync_replicas=1)
    epoch = cluster.state(topic).leader_epoch
    bootstrap = cluster.bootstrap(leader)
    assert fetch(bootstrap, topic, 0, 99).error_code == NotLeaderOrFollower.code
    assert fetch(bootstrap, topic, 0, 99, leader_epoch=epoch).error_code == \
        UnknownLeaderEpoch.code
    assert set(cluster.state(topic).isr) == {leader}


def test_lagging_followers_leave_the_isr_and_acks_all_then_answers_not_enough_replicas(cluster):
    leader = IMPATIENT_BROKER
    topic = cluster.create_topic((leader, 21, 22), min_insync_replicas=2)
    join_isr(cluster, topic, leader, (21, 22))
    before = cluster.state(topic)
    bootstrap = cluster.bootstrap(leader)
    # a follower at the leader's log end is in sync however long it is silent (Kafka's
    # rule): a record the followers never fetch makes them lag
    assert produce(bootstrap, topic, [b"w"], acks=1).error_code == 0
    shrunk = cluster.wait_for_isr(topic, {leader})
    assert (shrunk.leader, shrunk.leader_epoch) == (before.leader, before.leader_epoch)
    # the last replica standing commits what it flushed: the consumer sees it
    wait_until(lambda: list_offset(bootstrap, topic) == (0, 1), "the high watermark to move")
    refused = produce(bootstrap, topic, [b"z"], acks=-1)
    assert refused.error_code == NotEnoughReplicas.code
    assert fetched_values(fetch(bootstrap, topic, 0, 21)) == [b"w"]  # refused before the append


def test_acks_all_waiting_when_the_isr_shrinks_below_min_insync_is_not_enough_after_append(cluster):
    leader = IMPATIENT_BROKER
    topic = cluster.create_topic((leader, 23), min_insync_replicas=2)
    join_isr(cluster, topic, leader, (23,))
    with RawClient(cluster.bootstrap(leader)) as producer:
        correlation_id = producer.send(PRODUCE, 9, produce_request(topic, [b"late"], -1))
        response = receive_produce(producer, correlation_id)  # 23 never fetches it
    assert (response.error_code, response.base_offset) == (NotEnoughReplicasAfterAppend.code, 0)
    assert set(cluster.state(topic).isr) == {leader}


def test_the_last_replica_standing_keeps_what_it_acknowledged_through_a_power_cut(cluster):
    leader = IMPATIENT_BROKER
    topic = cluster.create_topic((leader, 25), min_insync_replicas=1)
    join_isr(cluster, topic, leader, (25,))
    bootstrap = cluster.bootstrap(leader)
    assert produce(bootstrap, topic, [b"before"], acks=1).error_code == 0
    cluster.wait_for_isr(topic, {leader})  # 25 never fetches it: the leader stands alone
    values = [b"acked-%d" % index for index in range(20)]
    for value in values:
        assert produce(bootstrap, topic, [value], acks=-1).error_code == 0
    epoch = cluster.state(topic).leader_epoch
    cluster.brokers[leader].power_cut()  # only what it fsynced survives
    wait_until(lambda: str(leader) not in cluster.zk.get_children(paths.BROKER_IDS),
               f"broker {leader}'s session to expire")
    cluster.brokers[leader].start()
    wait_until(lambda: (state := cluster.state(topic)).leader == leader
               and state.leader_epoch > epoch, f"broker {leader} to lead {topic} again")
    read = wait_until(lambda: fetched_values(fetch(bootstrap, topic, 0, CONSUMER)) or None,
                      "the records after the cut")
    assert read == [b"before", *values]


def test_an_offset_commit_is_answered_once_the_offsets_topic_followers_have_it(cluster):
    leader = PATIENT_BROKER
    topic = cluster.create_topic((leader, 31), min_insync_replicas=1, name=OFFSETS_TOPIC_NAME,
                                 configs={"cleanup.policy": "compact"})
    join_isr(cluster, topic, leader, (31,))
    committed_topic = cluster.create_topic((leader,), min_insync_replicas=1)
    bootstrap, group = cluster.bootstrap(leader), f"group-{uuid.uuid4().hex[:8]}"
    with RawClient(bootstrap) as committer:
        wait_until(lambda: committer.request(OFFSET_FETCH, 3, {
            "group_id": group, "topics": None}).error_code == 0,
            "the coordinator to load its offsets partition")
        correlation_id = committer.send(OFFSET_COMMIT, 2, {
            "group_id": group, "generation_id_or_member_epoch": -1, "member_id": "",
            "retention_time": -1, "topics": [{"name": committed_topic, "partitions": [{
                "partition_index": 0, "committed_offset": 42, "committed_metadata": ""}]}]})
        wait_until(lambda: fetch(bootstrap, topic, 0, 31).records, "the commit's append")
        assert fetch(bootstrap, topic, 0, 31).high_watermark == 0
        assert not answered(committer)
        assert fetch(bootstrap, topic, 0, CONSUMER).high_watermark == 0
        log_end = _log_end_offset(bootstrap, topic)
        assert fetch(bootstrap, topic, log_end, 31).high_watermark == log_end
        received_id, answer = wire.decode_response(OFFSET_COMMIT, 2, committer.receive_frame())
    assert received_id == correlation_id
    assert answer.topics[0].partitions[0].error_code == 0


def _log_end_offset(bootstrap: str, topic: str) -> int:
    """The leader's log end offset, as a replica is told it (ListOffsets with a replica id)."""
    with RawClient(bootstrap) as client:
        answer = client.request(LIST_OFFSETS, 7, {
            "replica_id": 31, "isolation_level": 0, "topics": [{
                "name": topic, "partitions": [{"partition_index": 0, "timestamp": -1,
                                               "current_leader_epoch": -1}]}]})
    return answer.topics[0].partitions[0].offset


def test_transaction_markers_are_answered_once_the_followers_have_them(cluster):
    leader = PATIENT_BROKER
    topic = cluster.create_topic((leader, 34), min_insync_replicas=1)
    join_isr(cluster, topic, leader, (34,))
    bootstrap = cluster.bootstrap(leader)
    with RawClient(bootstrap) as client:
        producer_id = client.request(INIT_PRODUCER_ID, 4, {
            "transactional_id": None, "transaction_timeout": 60000, "producer_id": -1,
            "producer_epoch": -1}).producer_id
        produced = client.request(PRODUCE, 9, produce_request(topic, [b"t"], 1,
                                                              producer_id=producer_id))
        assert produced.responses[0].partition_responses[0].error_code == 0
        assert fetch(bootstrap, topic, 1, 34).high_watermark == 1
        correlation_id = client.send(WRITE_TXN_MARKERS, 1, {"markers": [{
            "producer_id": producer_id, "producer_epoch": 0, "transaction_result": True,
            "coordinator_epoch": 0, "topics": [{"name": topic, "partition_indexes": [0]}]}]})
        wait_until(lambda: fetch(bootstrap, topic, 1, 34).records, "the marker's append")
        assert not answered(client)
        assert fetch(bootstrap, topic, 2, 34).high_watermark == 2
        received_id, answer = wire.decode_response(WRITE_TXN_MARKERS, 1, client.receive_frame())
    assert received_id == correlation_id
    assert answer.markers[0].topics[0].partitions[0].error_code == 0


def test_delete_records_is_answered_once_live_followers_start_their_logs_past_the_offset(cluster):
    leader = PATIENT_BROKER
    topic = cluster.create_topic((leader, 36), min_insync_replicas=1)
    join_isr(cluster, topic, leader, (36,))
    bootstrap = cluster.bootstrap(leader)
    end = 0
    for value in (b"a", b"b", b"c"):
        end = produce(bootstrap, topic, [value], acks=1).base_offset + 1
    assert fetch(bootstrap, topic, end, 36, log_start_offset=0).high_watermark == end
    with RawClient(bootstrap) as client:  # 36 is no live broker: its log start does not count
        unregistered = client.request(DELETE_RECORDS, 2, {"timeout": 30_000, "topics": [
            {"name": topic, "partitions": [{"partition_index": 0, "offset": 1}]}]})
    assert unregistered.topics[0].partitions[0].low_watermark == 1
    registration = cluster_helpers.register_broker(cluster.connect, 36)  # 36 is alive now
    try:
        wait_until(lambda: 36 in live_brokers(bootstrap), f"broker {leader} to see 36 alive")
        with RawClient(bootstrap) as client:
            correlation_id = client.send(DELETE_RECORDS, 2, {"timeout": 30_000, "topics": [
                {"name": topic, "partitions": [{"partition_index": 0, "offset": 2}]}]})
            wait_until(lambda: list_offset_earliest(bootstrap, topic) == 2,
                       "the leader's log start to move")
            fetch(bootstrap, topic, end, 36, log_start_offset=0)
            assert not answered(client)  # 36's log still starts at 0
            fetch(bootstrap, topic, end, 36, log_start_offset=2)
            received_id, answer = wire.decode_response(DELETE_RECORDS, 2, client.receive_frame())
    finally:
        cluster_helpers.close(registration)
    assert received_id == correlation_id
    partition = answer.topics[0].partitions[0]
    assert (partition.error_code, partition.low_watermark) == (0, 2)


def list_offset_earliest(bootstrap: str, topic: str) -> int:
    with RawClient(bootstrap) as client:
        answer = client.request(LIST_OFFSETS, 7, {
            "replica_id": CONSUMER, "isolation_level": 0, "topics": [{
                "name": topic, "partitions": [{"partition_index": 0, "timestamp": -2,
                                               "current_leader_epoch": -1}]}]})
    return answer.topics[0].partitions[0].offset


def live_brokers(bootstrap: str) -> set[int]:
    """The brokers alive in the view of the broker at ``bootstrap`` (its Metadata)."""
    with RawClient(bootstrap) as client:
        answer = client.request(METADATA, 12, {
            "topics": [], "allow_auto_topic_creation": False,
            "include_topic_authorized_operations": False})
    return {broker.node_id for broker in answer.brokers}
