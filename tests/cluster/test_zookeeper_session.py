"""The broker's ZooKeeper session against a real ensemble: zookeeper.connect and its chroot,
the connection timeout, the ephemeral registration, its broker epoch, duplicates, and
re-registration after the session expires."""

from __future__ import annotations

import threading

import pytest
from kazoo.client import KazooClient

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster.zookeeper_connect import parse_zookeeper_connect
from headrace.cluster.zookeeper_ensemble import free_ports
from headrace.cluster.zookeeper_records import BrokerRegistration, decode_broker_registration
from headrace.cluster.zookeeper_session import (
    BrokerIdAlreadyRegistered,
    SessionEvent,
    ZooKeeperClientError,
    ZooKeeperSession,
)
from headrace.errors import InvalidConfig
from tests.cluster.conftest import ZNODE_TIMEOUT_S, ZOOKEEPER_CONNECT_TIMEOUT_S, synced

SESSION_TIMEOUT_MS = 4000


@pytest.mark.parametrize("value, hosts, chroot", [
    ("127.0.0.1:2181", "127.0.0.1:2181", None),
    ("a:1,b:2,c:3/kafka", "a:1,b:2,c:3", "/kafka"),
    ("a:1/kafka/prod", "a:1", "/kafka/prod"),
    ("a:1/", "a:1", None),
])
def test_zookeeper_connect_splits_hosts_and_chroot(value, hosts, chroot):
    parsed = parse_zookeeper_connect(value)
    assert (parsed.hosts, parsed.chroot) == (hosts, chroot)


@pytest.mark.parametrize("value", ["", "/kafka", "a:1,,b:2", "a:1/kafka/", "a:1/x//y",
                                   "a:1/x/../y"])
def test_a_bad_zookeeper_connect_is_a_config_error(value):
    with pytest.raises(InvalidConfig, match="zookeeper.connect"):
        parse_zookeeper_connect(value)


def _registration(broker_id: int, port: int = 9092) -> BrokerRegistration:
    return BrokerRegistration(broker_id=broker_id, host="127.0.0.1", port=port,
                              endpoints=(f"PLAINTEXT://127.0.0.1:{port}",),
                              timestamp_ms=1_700_000_000_000)


@pytest.fixture
def open_session(zookeeper_ensemble, zookeeper_chroot):
    sessions = []

    def open_one() -> ZooKeeperSession:
        session = ZooKeeperSession(zookeeper_ensemble.connect_string + zookeeper_chroot,
                                   SESSION_TIMEOUT_MS)
        session.start()
        sessions.append(session)
        return session

    yield open_one
    for session in sessions:
        session.stop()


def test_the_chroot_is_created_at_start(open_session, zookeeper_client, zookeeper_chroot):
    assert zookeeper_client.exists(zookeeper_chroot) is None
    session = open_session()
    assert zookeeper_client.exists(synced(zookeeper_client, zookeeper_chroot)) is not None
    session.ensure_persistent_paths()
    assert set(zookeeper_client.get_children(synced(zookeeper_client, zookeeper_chroot))) >= {
        "brokers", "config", "admin", "isr_change_notification"}
    assert zookeeper_client.exists(zookeeper_chroot + paths.BROKER_SEQUENCE_ID) is not None


def test_no_server_within_the_connection_timeout_is_one_error():
    (port,) = free_ports("127.0.0.1", 1)
    session = ZooKeeperSession(f"127.0.0.1:{port}", session_timeout_ms=6000,
                               connection_timeout_ms=1000)
    with pytest.raises(ZooKeeperClientError, match="zookeeper.connection.timeout.ms=1000"):
        session.start()
    session.client.close()


def test_registration_is_ephemeral_kafka_json_and_its_czxid_is_the_broker_epoch(
        open_session, zookeeper_client, zookeeper_chroot):
    session = open_session()
    epoch = session.register_broker(_registration(3, 9093))
    data, stat = zookeeper_client.get(synced(zookeeper_client, zookeeper_chroot + "/brokers/ids/3"))
    assert epoch == stat.czxid == session.broker_epoch
    assert stat.ephemeralOwner == session.session_id
    assert decode_broker_registration(3, data) == _registration(3, 9093)
    assert session.register_broker(_registration(3, 9093)) == epoch  # ours already: kept


def test_an_id_held_by_another_live_session_is_refused(open_session, zookeeper_client,
                                                       zookeeper_chroot):
    first, second = open_session(), open_session()
    first.register_broker(_registration(1))
    with pytest.raises(BrokerIdAlreadyRegistered, match="NodeExists"):
        second.register_broker(_registration(1, 9999))
    _, stat = zookeeper_client.get(synced(zookeeper_client, zookeeper_chroot + "/brokers/ids/1"))
    assert stat.ephemeralOwner == first.session_id


def test_cluster_id_is_created_once_and_broker_sequence_ids_grow(open_session):
    session = open_session()
    assert session.create_or_get_cluster_id("first-proposal") == "first-proposal"
    assert session.create_or_get_cluster_id("second-proposal") == "first-proposal"
    assert [session.generate_broker_sequence_id() for _ in range(3)] == [1, 2, 3]


def test_after_the_session_expires_a_new_one_registers_again(
        open_session, zookeeper_ensemble, zookeeper_client, zookeeper_chroot):
    session = open_session()
    events: list[SessionEvent] = []
    new_session = threading.Event()

    def on_event(event: SessionEvent) -> None:
        events.append(event)
        if event is SessionEvent.NEW_SESSION:
            new_session.set()

    session.add_listener(on_event)
    old_epoch = session.register_broker(_registration(7))
    old_session_id = session.session_id
    _expire(zookeeper_ensemble, session)
    assert new_session.wait(ZNODE_TIMEOUT_S), f"no new session; events {events}"
    assert SessionEvent.EXPIRED in events
    _, stat = zookeeper_client.get(synced(zookeeper_client, zookeeper_chroot + "/brokers/ids/7"))
    assert stat.ephemeralOwner == session.session_id != old_session_id
    assert stat.czxid == session.broker_epoch > old_epoch


def _expire(ensemble, session: ZooKeeperSession) -> None:
    """Expire a live session as ZooKeeper's own tests do: a second client joins the session
    with its id and password, then closes it."""
    session_id, password = session.client.client_id
    intruder = KazooClient(hosts=ensemble.connect_string, client_id=(session_id, password))
    intruder.start(timeout=ZOOKEEPER_CONNECT_TIMEOUT_S)
    intruder.stop()
    intruder.close()
