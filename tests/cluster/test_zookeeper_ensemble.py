"""The local ZooKeeper ensemble: a real quorum of three JVMs that keeps serving without one node;
a single node runs standalone."""

from __future__ import annotations

from kazoo.client import KazooClient

from headrace.cluster.zookeeper_ensemble import SERVING_MODES, ZooKeeperEnsemble
from tests.cluster.conftest import ZOOKEEPER_CONNECT_TIMEOUT_S

RETRY = {"max_tries": -1, "delay": 0.1, "max_delay": 1.0, "deadline": ZOOKEEPER_CONNECT_TIMEOUT_S}


def _client_of_node(ensemble: ZooKeeperEnsemble, node: int) -> KazooClient:
    """A client of one node only, retrying (bounded) through a leader election."""
    client = KazooClient(hosts=f"{ensemble.host}:{ensemble.ports[node].client_port}",
                         connection_retry=RETRY, command_retry=RETRY)
    client.start(timeout=ZOOKEEPER_CONNECT_TIMEOUT_S)
    return client


def test_three_nodes_form_one_quorum_that_survives_losing_its_leader(
        zookeeper_ensemble, zookeeper_chroot):
    modes = {node: zookeeper_ensemble.mode(node) for node in zookeeper_ensemble.node_ids}
    assert sorted(modes.values()) == ["follower", "follower", "leader"]
    leader = next(node for node, mode in modes.items() if mode == "leader")
    survivors = [node for node in zookeeper_ensemble.node_ids if node != leader]
    writer, reader = (_client_of_node(zookeeper_ensemble, node) for node in survivors)
    try:
        # one ensemble: what one node accepted, another node serves
        writer.create(zookeeper_chroot + "/before", b"1", makepath=True)
        reader.sync(zookeeper_chroot + "/before")
        assert reader.get(zookeeper_chroot + "/before")[0] == b"1"

        zookeeper_ensemble.kill(leader)
        writer.retry(writer.create, zookeeper_chroot + "/after", b"2")
        reader.retry(reader.sync, zookeeper_chroot + "/after")
        assert reader.retry(reader.get, zookeeper_chroot + "/after")[0] == b"2"
        assert reader.retry(reader.get, zookeeper_chroot + "/before")[0] == b"1"
    finally:
        writer.stop()
        reader.stop()
        if leader not in zookeeper_ensemble.pids:
            zookeeper_ensemble.restart(leader)
    assert zookeeper_ensemble.mode(leader) in SERVING_MODES


def test_a_paused_follower_answers_nothing_while_the_others_serve(zookeeper_ensemble,
                                                                  zookeeper_chroot):
    follower = next(node for node in zookeeper_ensemble.node_ids
                    if zookeeper_ensemble.mode(node) == "follower")
    other = next(node for node in zookeeper_ensemble.node_ids if node != follower)
    client = _client_of_node(zookeeper_ensemble, other)
    zookeeper_ensemble.pause(follower)
    try:
        assert zookeeper_ensemble.mode(follower) is None
        client.retry(client.create, zookeeper_chroot + "/while-paused", b"1", makepath=True)
    finally:
        zookeeper_ensemble.resume(follower)
        client.stop()
    zookeeper_ensemble.wait_until_all_serve()
    assert zookeeper_ensemble.mode(follower) in SERVING_MODES


def test_a_single_node_runs_standalone_and_stops_by_pid(tmp_path):
    ensemble = ZooKeeperEnsemble(tmp_path, size=1).start()
    try:
        assert ensemble.mode(1) == "standalone"
        client = _client_of_node(ensemble, 1)
        client.create("/x", b"y")
        assert client.get("/x")[0] == b"y"
        client.stop()
        pid = ensemble.pids[1]
    finally:
        ensemble.stop()
    assert ensemble.pids == {}
    assert not _process_exists(pid)


def _process_exists(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ", 1)[1][0] != "Z"
    except FileNotFoundError:
        return False
