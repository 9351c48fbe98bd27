"""A broker process in cluster mode against a real three-node ensemble: its registration (Kafka's
JSON), the cluster id from /cluster/id, session expiry after SIGKILL, restart, a duplicate
broker.id, broker ids generated from /brokers/seqid, and losing the ZooKeeper node it talks to."""

from __future__ import annotations

import json
import os
import re
import selectors
import subprocess
import time

from headrace.storage.config import parse_properties_text
from tests.broker.raw_client import RawClient
from tests.cluster.conftest import ZNODE_TIMEOUT_S, synced, wait_for_znode

DESCRIBE_CLUSTER = 60


def _described_cluster_id(bootstrap: str) -> str:
    """The cluster id in the broker's DescribeCluster answer (raw: independent of whether its
    metadata lists any broker yet)."""
    with RawClient(bootstrap) as client:
        response = client.request(DESCRIBE_CLUSTER, 0,
                                  {"include_cluster_authorized_operations": False})
    assert response.error_code == 0
    return response.cluster_id


def test_broker_registers_kafka_json_expires_on_sigkill_and_returns_on_restart(
        cluster_brokers, zookeeper_client, zookeeper_chroot):
    broker, path = cluster_brokers.start_registered(zookeeper_client, 1)
    data, stat = zookeeper_client.get(path)
    registration = json.loads(data)
    assert registration.pop("timestamp").isdigit()
    assert registration == {
        "version": 5, "host": "127.0.0.1", "port": broker.port,
        "endpoints": [f"PLAINTEXT://127.0.0.1:{broker.port}"], "jmx_port": -1,
        "listener_security_protocol_map": {"PLAINTEXT": "PLAINTEXT"}, "features": {}}
    assert stat.ephemeralOwner != 0

    cluster_json = json.loads(zookeeper_client.get(zookeeper_chroot + "/cluster/id")[0])
    assert cluster_json["version"] == "1"
    meta = parse_properties_text((broker.data_dir / "meta.properties").read_text())
    assert meta == {"version": "0", "broker.id": "1", "cluster.id": cluster_json["id"]}
    assert _described_cluster_id(broker.bootstrap) == cluster_json["id"]

    broker.kill()  # no clean shutdown: the znode goes when the session expires
    wait_for_znode(zookeeper_client, path, present=False)
    broker.start()
    wait_for_znode(zookeeper_client, path)
    _, restarted = zookeeper_client.get(path)
    assert restarted.czxid > stat.czxid  # a new broker epoch


def test_a_clean_shutdown_deregisters_at_once(cluster_brokers, zookeeper_client):
    broker, path = cluster_brokers.start_registered(zookeeper_client, 2)
    assert broker.stop() == 0
    assert zookeeper_client.exists(synced(zookeeper_client, path)) is None


def test_a_second_broker_with_a_registered_id_exits_with_one_line(
        cluster_brokers, zookeeper_client):
    first, path = cluster_brokers.start_registered(zookeeper_client, 1)
    _, owner = zookeeper_client.get(path)
    second = cluster_brokers.process(1)
    try:
        second.start()  # may return once its port accepts, before it registers and fails
    except RuntimeError:
        pass
    assert second.process.wait(timeout=ZNODE_TIMEOUT_S) == 2
    last_line = second.log_text().strip().splitlines()[-1]
    assert re.fullmatch(r"headrace broker: Error while creating ephemeral at /brokers/ids/1, "
                        r"node already exists .*NodeExists.*", last_line), last_line
    assert "Traceback" not in second.log_text()
    _, still = zookeeper_client.get(synced(zookeeper_client, path))
    assert still.ephemeralOwner == owner.ephemeralOwner
    assert first.process.poll() is None


def test_without_broker_id_one_is_generated_and_kept_in_meta_properties(
        cluster_brokers, zookeeper_client, zookeeper_chroot):
    broker, path = cluster_brokers.start_registered(zookeeper_client, -1)
    assert path.endswith("/brokers/ids/1001")  # /brokers/seqid version 1 + 1000
    meta = parse_properties_text((broker.data_dir / "meta.properties").read_text())
    assert meta["broker.id"] == "1001"
    broker.stop()
    broker.start()  # the stored id, not the next sequence number
    wait_for_znode(zookeeper_client, path)
    ids_path = synced(zookeeper_client, zookeeper_chroot + "/brokers/ids")
    assert zookeeper_client.get_children(ids_path) == ["1001"]


def test_losing_the_zookeeper_node_of_its_session_keeps_the_registration(
        cluster_brokers, zookeeper_ensemble, zookeeper_client):
    broker, path = cluster_brokers.start_registered(
        zookeeper_client, 3, **{"zookeeper.session.timeout.ms": "6000"})
    _, before = zookeeper_client.get(path)
    node = zookeeper_ensemble.node_serving_session(before.ephemeralOwner)
    assert node is not None
    log_mark = broker.log_bytes()
    zookeeper_ensemble.kill(node)
    try:
        _wait_for_log(broker, log_mark, f"ZooKeeper session 0x{before.ephemeralOwner:x} "
                                        "reconnected")
        _, after = zookeeper_client.retry(zookeeper_client.get, path)
        assert (after.czxid, after.ephemeralOwner) == (before.czxid, before.ephemeralOwner)
        assert zookeeper_ensemble.node_serving_session(before.ephemeralOwner) not in (None, node)
    finally:
        zookeeper_ensemble.restart(node)


def _wait_for_log(broker, since_byte: int, text: str) -> None:
    """Follow the broker's log (``tail -F``, bounded by ``ZNODE_TIMEOUT_S``) until ``text``."""
    follower = subprocess.Popen(
        ["tail", "-c", f"+{since_byte + 1}", "-F", str(broker.log_path)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + ZNODE_TIMEOUT_S
    seen = b""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(follower.stdout, selectors.EVENT_READ)
            while text.encode() not in seen:
                remaining_s = deadline - time.monotonic()
                if remaining_s <= 0 or not selector.select(remaining_s):
                    raise AssertionError(f"{text!r} not logged within {ZNODE_TIMEOUT_S} s")
                seen += os.read(follower.stdout.fileno(), 65536)
    finally:
        follower.kill()
        follower.wait()
