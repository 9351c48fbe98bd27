"""Producer id blocks claimed in ZooKeeper (``headrace.cluster.producer_id_blocks``) on a real
ensemble (through the broker's ``ProducerIdAllocator``, which writes no file then): allocators
of different brokers never hand out the same id, the znode holds Kafka's
JSON, a claim racing another writer takes the block after the winner's, and two brokers of a
cluster answer InitProducerId with different ids."""

from __future__ import annotations

import json
import threading

from kazoo.client import KazooClient

from headrace.broker.state import ProducerIdAllocator
from headrace.cluster import zookeeper_paths as paths
from headrace.cluster.producer_id_blocks import (
    PRODUCER_ID_BLOCK_SIZE,
    block_claimer,
    encode_block,
)
from tests.broker.raw_client import RawClient
from tests.cluster.conftest import synced

INIT_PRODUCER_ID_KEY = 22
IDS_PER_THREAD = 30


def chrooted_client(zk: KazooClient, chroot: str) -> KazooClient:
    client = KazooClient(hosts=",".join(f"{host}:{port}" for host, port in zk.hosts)
                         + chroot)
    client.start(timeout=30)
    return client


def test_allocators_of_different_brokers_hand_out_disjoint_ids(zookeeper_client,
                                                               zookeeper_chroot, tmp_path):
    zk = zookeeper_client
    zk.ensure_path(zookeeper_chroot)
    chrooted = chrooted_client(zk, zookeeper_chroot)
    try:
        allocators = [ProducerIdAllocator(tmp_path, claim_block=block_claimer(
                          chrooted, broker_id, block_size_ids=7)) for broker_id in (1, 2, 3)]
        handed_out: list[int] = []
        lock = threading.Lock()

        def take(allocator) -> None:
            for _ in range(IDS_PER_THREAD):
                producer_id = allocator.next_id_without_io()
                if producer_id is None:
                    producer_id = allocator.next_id()
                with lock:
                    handed_out.append(producer_id)

        threads = [threading.Thread(target=take, args=(a,)) for a in allocators]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(handed_out) == 3 * IDS_PER_THREAD
        assert len(set(handed_out)) == len(handed_out)
        recorded = json.loads(zk.get(synced(zk, zookeeper_chroot + paths.LATEST_PRODUCER_ID_BLOCK))[0])
        assert recorded["version"] == 1 and recorded["broker"] in (1, 2, 3)
        assert int(recorded["block_end"]) - int(recorded["block_start"]) == 6
        assert int(recorded["block_end"]) >= max(handed_out)
    finally:
        chrooted.stop()
        chrooted.close()


def test_a_claim_follows_the_block_another_writer_recorded(zookeeper_client, zookeeper_chroot,
                                                          tmp_path):
    zk = zookeeper_client
    path = zookeeper_chroot + paths.LATEST_PRODUCER_ID_BLOCK
    zk.ensure_path(path)
    zk.set(path, encode_block(9, 5000, 5999))
    chrooted = chrooted_client(zk, zookeeper_chroot)
    try:
        allocator = ProducerIdAllocator(tmp_path, claim_block=block_claimer(chrooted, 1))
        assert allocator.next_id_without_io() is None
        assert allocator.next_id() == 6000
        assert allocator.next_id_without_io() == 6001
        assert not list(tmp_path.iterdir())
    finally:
        chrooted.stop()
        chrooted.close()
    recorded = json.loads(zk.get(synced(zk, path))[0])
    assert recorded == {"version": 1, "broker": 1, "block_start": "6000",
                        "block_end": str(6000 + PRODUCER_ID_BLOCK_SIZE - 1)}


def test_two_brokers_answer_init_producer_id_with_different_ids(cluster_brokers,
                                                                zookeeper_client):
    first, _ = cluster_brokers.start_registered(zookeeper_client, 1)
    second, _ = cluster_brokers.start_registered(zookeeper_client, 2)
    ids = []
    for broker in (first, second):
        with RawClient(broker.bootstrap) as client:
            answer = client.request(INIT_PRODUCER_ID_KEY, 4, {
                "transactional_id": None, "transaction_timeout": 60000,
                "producer_id": -1, "producer_epoch": -1})
        assert answer.error_code == 0
        ids.append(answer.producer_id)
    assert ids[0] != ids[1]
