"""A broker process in cluster mode against a real three-node ensemble: its registration (Kafka's
JSON), the cluster id from /cluster/id, session expiry after SIGKILL, restart, registering again
after its session expired (SIGSTOP past the session timeout), a duplicate
broker.id, broker ids generated from /brokers/seqid, losing the ZooKeeper node it talks to; the
cluster-mode configs checked as Kafka's, and a single-node data directory refused."""

from __future__ import annotations

import json
import os
import re
import selectors
import signal
import subprocess
import time

import pytest

from headrace.broker.config import BrokerConfig
from headrace.errors import InvalidConfig
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


def test_a_broker_whose_session_expired_registers_again(cluster_brokers, zookeeper_client):
    broker, path = cluster_brokers.start_registered(zookeeper_client, 4)
    _wait_for_log(broker, 0, "headrace broker 4 serving on")
    _, before = zookeeper_client.get(path)
    os.kill(broker.pid, signal.SIGSTOP)  # silent past its session timeout: ZooKeeper expires it
    try:
        wait_for_znode(zookeeper_client, path, present=False)
    finally:
        os.kill(broker.pid, signal.SIGCONT)
    wait_for_znode(zookeeper_client, path)
    _, after = zookeeper_client.get(path)
    assert after.czxid > before.czxid and after.ephemeralOwner != before.ephemeralOwner
    assert broker.process.poll() is None


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
    _wait_for_log(broker, 0, "headrace broker 3 serving on")  # start-up over: ZooKeeper too
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


@pytest.mark.parametrize("overrides, message", [
    ({"broker.id": "1001"}, "broker.id must be greater than or equal to -1 and not greater "
                            "than reserved.broker.max.id"),
    ({"broker.id": "1", "zookeeper.connect": "127.0.0.1:2181/headrace/"}, "invalid chroot"),
    ({"broker.id": "1", "zookeeper.session.timeout.ms": "0"}, "Value must be at least 1"),
])
def test_cluster_mode_configs_are_checked_as_kafka_checks_them(overrides, message):
    with pytest.raises(InvalidConfig, match=re.escape(message)):
        BrokerConfig({"zookeeper.connect": "127.0.0.1:2181/headrace", **overrides})


def test_single_node_mode_keeps_any_broker_id():
    assert BrokerConfig({"broker.id": "5000"}).node_id == 5000
    assert BrokerConfig({}).node_id == 1


def test_a_single_node_data_directory_is_refused_in_cluster_mode_in_one_line(
        cluster_brokers, zookeeper_client):
    broker = cluster_brokers.process(1)
    (broker.data_dir / "meta.properties").write_text(
        "version=1\ncluster.id=AAAAAAAAAAAAAAAAAAAAAA\nnode.id=1\n")
    with pytest.raises(RuntimeError, match="exited at start-up"):
        broker.start()
    assert broker.process.returncode == 2
    last_line = broker.log_text().strip().splitlines()[-1]
    assert last_line.startswith("headrace broker: Found unexpected version in ")
    assert "ZK-based brokers that are not migrating only support version 0" in last_line
    assert "Traceback" not in broker.log_text()
    ids_path = synced(zookeeper_client, cluster_brokers.chroot + "/brokers/ids")
    assert zookeeper_client.get_children(ids_path) == []
