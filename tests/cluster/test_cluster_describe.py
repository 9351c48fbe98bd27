"""``headrace cluster describe``'s partition health counts on real broker processes and a real
ZooKeeper: none while every broker is up; after a SIGKILL of one broker its RF=1 partition is
offline, the RF=3 partitions it replicated are under-replicated (it left their ISR) and, as
their topic asks min.insync.replicas=3, under min ISR too."""

from __future__ import annotations

from datetime import timedelta

from tests.broker.raw_client import RawClient
from tests.cli.cli_runner import run_json
from tests.cluster.cluster_helpers import (
    close,
    partition_state,
    topic_states,
    wait_until,
    zookeeper_client,
)
from tests.cluster.test_reassignment_brokers import metadata_brokers

CREATE_TOPICS = 19
REQUEST_TIMEOUT = timedelta(seconds=30)
HEALTH_COUNTS = ("offline_partitions", "under_replicated_partitions", "under_min_isr_partitions")


def create_topic(bootstrap: str, name: str, replicas: dict[int, list[int]], configs: dict[str, str]) -> int:
    topic = {"name": name, "num_partitions": -1, "replication_factor": -1,
             "configs": [{"name": k, "value": v} for k, v in configs.items()],
             "assignments": [{"partition_index": p, "broker_ids": r} for p, r in replicas.items()]}
    with RawClient(bootstrap) as client:
        return client.request(CREATE_TOPICS, 7, {"timeout": REQUEST_TIMEOUT, "validate_only": False,
                                                 "topics": [topic]}).topics[0].error_code


def health(bootstrap: str) -> tuple[int, int, int]:
    described = run_json("cluster", "describe", "--bootstrap-server", bootstrap)
    return tuple(described[name] for name in HEALTH_COUNTS)


def test_describe_counts_offline_under_replicated_and_under_min_isr_partitions(cluster_brokers):
    brokers = {b: cluster_brokers.start(b) for b in (1, 2, 3)}
    zk = zookeeper_client(cluster_brokers.zookeeper_connect)
    try:
        wait_until(lambda: all(metadata_brokers(b) == {1, 2, 3} for b in brokers.values()),
                   "every broker sees the three")
        survivor = brokers[1].bootstrap
        created = [create_topic(b.bootstrap, "health", {0: [1, 2, 3], 1: [2, 3, 1]},
                                {"min.insync.replicas": "3"}) for b in brokers.values()]
        assert 0 in created  # the controller created it; the others answered NOT_CONTROLLER
        created = [create_topic(b.bootstrap, "lonely", {0: [3]}, {}) for b in brokers.values()]
        assert 0 in created
        wait_until(lambda: topic_states(zk, "health", 2) and topic_states(zk, "lonely", 1), "states")
        assert health(survivor) == (0, 0, 0)
        brokers[3].kill()
        wait_until(lambda: partition_state(zk, "lonely", 0).leader == -1
                   and all(3 not in partition_state(zk, "health", p).isr for p in (0, 1)),
                   "broker 3 out of the ISRs")
        wait_until(lambda: health(survivor) == (1, 2, 2), "the counts after the kill")
    finally:
        close(zk)
