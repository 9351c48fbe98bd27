"""A leader cut off from ZooKeeper but not from its clients or followers stops acknowledging
acks=all writes (the case Jepsen found in Kafka in 2013): once ZooKeeper expires its session
the controller elects a follower, the followers leave the old leader for the new one, and the
old leader, which cannot hear any of it, must neither acknowledge a write on its own (it cannot
get its ISR shrink accepted: decision 1's maximal ISR keeps its HW where the followers left it)
nor lose any write acknowledged elsewhere when it returns as a follower.

The whole module runs inside one network namespace (``headrace.faults.namespace``; root, ``ip``
and ``iptables``): a one-node ZooKeeper listening on every address of the namespace's
loopback, and three brokers on 127.0.0.1, broker N reaching ZooKeeper at 127.0.0.(10+N)
only, so one iptables rule (requests from 127.0.0.1 to 127.0.0.(10+N) dropped) isolates that
broker from ZooKeeper and from nothing else. The test's own clients reach ZooKeeper at
127.0.0.10. Code touching the namespace's sockets (clients, kazoo) is created on a thread
inside it (``Namespace.run_inside``).
"""

from __future__ import annotations

import uuid

import pytest

from headrace.cluster.zookeeper_ensemble import ZooKeeperEnsemble
from headrace.errors import NotLeaderOrFollower, RequestTimedOut
from headrace.faults.namespace import Namespace, missing_tools
from headrace.protocol import records as record_codec
from headrace.protocol import wire
from tests.broker.raw_client import RawClient
from tests.cluster.replication.replicated_cluster import (
    BROKER_IDS,
    AckedProducer,
    ReplicatedCluster,
    assert_acked_consumed_once_in_order,
    numbered,
    read_all,
    wait_until,
)

SCENARIO_TIMEOUT_S = 400.0
START_TIMEOUT_S = 180.0
PRODUCE_KEY, PRODUCE_VERSION = 0, 9
ISOLATED_PRODUCE_TIMEOUT_MS = 10_000
REPLICA_LAG_TIME_MAX_MS = 3000
CLIENT_ZOOKEEPER_HOST = "127.0.0.10"
# What an isolated leader may answer an acks=all write: it timed out waiting for followers
# that left, or the broker noticed it no longer leads. Never success.
REFUSALS = {RequestTimedOut.code, NotLeaderOrFollower.code}
ISOLATED_VALUES = (b"to-the-isolated-leader-1", b"to-the-isolated-leader-2")

pytestmark = pytest.mark.skipif(bool(missing_tools()),
                                reason=f"network namespaces need {missing_tools()}")


def zookeeper_host_of(broker_id: int) -> str:
    return f"127.0.0.{10 + broker_id}"


@pytest.fixture(scope="module")
def namespace():
    with Namespace() as created:
        created.create(["127.0.0.1"])
        yield created


@pytest.fixture(scope="module")
def cluster(namespace, tmp_path_factory):
    base_dir = tmp_path_factory.mktemp("isolated")
    ensemble = namespace.run_inside(
        lambda: ZooKeeperEnsemble(base_dir / "zookeeper", size=1, host="0.0.0.0").start(),
        START_TIMEOUT_S)
    port = ensemble.ports[1].client_port
    chroot = f"/isolated-{uuid.uuid4().hex[:8]}"
    cluster = ReplicatedCluster(
        base_dir, f"{CLIENT_ZOOKEEPER_HOST}:{port}{chroot}",
        {"replica.lag.time.max.ms": str(REPLICA_LAG_TIME_MAX_MS)}, namespace=namespace,
        zookeeper_connect_of=lambda b: f"{zookeeper_host_of(b)}:{port}{chroot}")
    try:
        namespace.run_inside(cluster.start, START_TIMEOUT_S)
        yield cluster
    finally:
        cluster.stop()
        ensemble.stop()


def produce_values(topic: str, value: bytes) -> dict:
    """An acks=all Produce request of one record."""
    batch = record_codec.build_batch([(None, value, [], 1_700_000_000_000)])
    return {"acks": -1, "timeout": ISOLATED_PRODUCE_TIMEOUT_MS,
            "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]}


def error_code_of(client: RawClient) -> int:
    """The partition's error code in the Produce answer ``client`` receives next."""
    _, body = wire.decode_response(PRODUCE_KEY, PRODUCE_VERSION, client.receive_frame())
    return body.responses[0].partition_responses[0].error_code


def test_a_leader_isolated_from_zookeeper_acknowledges_nothing_and_loses_nothing(
        cluster, namespace):
    namespace.run_inside(lambda: isolated_leader_scenario(cluster, namespace),
                         SCENARIO_TIMEOUT_S)


def isolated_leader_scenario(cluster: ReplicatedCluster, namespace: Namespace) -> None:
    topic = f"isolated-{uuid.uuid4().hex[:8]}"
    # min.insync.replicas=1, as in 2013: only the ISR rules stand between the isolated leader and
    # acknowledging writes on its own.
    cluster.create_topic(topic, BROKER_IDS, {"min.insync.replicas": "1"})
    before = cluster.wait_for_isr(topic, BROKER_IDS)
    leader = before.leader
    followers = [b for b in BROKER_IDS if b != leader]
    producer = AckedProducer(cluster.bootstrap, topic)
    producer.send(numbered(b"i", 0, 100))
    producer.flush()

    cut = namespace.cut("127.0.0.1", zookeeper_host_of(leader))
    try:
        after = cluster.wait_for_leader(topic, followers, newer_than_epoch=before.leader_epoch)
        cluster.wait_for_metadata_leader(topic, after.leader, after.leader_epoch, followers)
        # The followers follow the new leader now. A client that still believes the old
        # leader leads writes to it directly: the first write leaves the followers behind, so
        # the old leader proposes to shrink its ISR to itself (a write ZooKeeper never gets);
        # the second comes after that proposal. Neither may be acknowledged.
        with RawClient(cluster.brokers[leader].bootstrap) as first, \
                RawClient(cluster.brokers[leader].bootstrap) as second:
            first.send(PRODUCE_KEY, PRODUCE_VERSION, produce_values(topic, ISOLATED_VALUES[0]))
            shrinking = f"shrinking the ISR of {topic}-0"
            wait_until(lambda: shrinking in cluster.brokers[leader].log_path.read_text(),
                       f"broker {leader} to propose an ISR shrink ({shrinking!r} in its log)")
            second.send(PRODUCE_KEY, PRODUCE_VERSION, produce_values(topic, ISOLATED_VALUES[1]))
            error_codes = [error_code_of(first), error_code_of(second)]
        moved = AckedProducer(cluster.bootstrap_of(followers), topic)
        moved.send(numbered(b"i", 100, 200))
        moved.flush()
        assert namespace.dropped_packets(cut) > 0
    finally:
        namespace.heal(cut)

    cluster.wait_for_isr(topic, BROKER_IDS)
    cluster.wait_for_identical_replicas(topic, BROKER_IDS)
    assert set(error_codes) <= REFUSALS, f"the isolated leader answered errors {error_codes}"
    consumed = read_all(cluster.bootstrap, topic, len(producer.acked) + len(moved.acked))
    assert not set(ISOLATED_VALUES) & set(consumed)
    assert_acked_consumed_once_in_order(producer.acked + moved.acked, consumed)
    assert len(producer.acked + moved.acked) == 200
