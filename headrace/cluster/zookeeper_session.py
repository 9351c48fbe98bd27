"""The broker's one ZooKeeper session (kazoo) and its registration at ``/brokers/ids/<id>``.

Owns: parsing ``zookeeper.connect`` (``host:port,...[/chroot]``, ZooKeeper's connect-string
rules) and creating the chroot when missing (as Kafka does, through a short-lived client
without the chroot); the ``KazooClient`` with ``zookeeper.session.timeout.ms`` and
``zookeeper.connection.timeout.ms``; the session's state changes as ``SessionEvent``s; Kafka's
start-up znodes (``zookeeper_paths.PERSISTENT_PATHS``), the cluster id at ``/cluster/id``
(created on first start), broker id generation from ``/brokers/seqid``; and the broker's
ephemeral registration (JSON version 5, ``zookeeper_records.encode_broker_registration``),
created again on every new session. The broker epoch (KIP-380) is the registration znode's
czxid: it grows with every registration, so the controller can tell a restarted broker apart.

A registration that finds ``/brokers/ids/<id>`` held by another live session fails as Kafka's
does (``checkedEphemeralCreate``: NodeExists); one left by this client's own previous, expired
session is deleted and created again (Kafka's KAFKA-7165 workaround).

Threads: kazoo calls its state listener on its own connection thread, where no ZooKeeper call
may block. The listener only queues the state; the session's one event thread
(``zookeeper-session-events``) re-registers after a new session and then calls the listeners
added with ``add_listener(callback)`` with a ``SessionEvent``. Listeners run on that thread:
a broker hands the event to its event loop with ``loop.call_soon_threadsafe`` and never touches
broker state there. ``start``, ``register_broker`` and the other calls block on the network:
from asyncio, call them in an executor. ``register_broker`` and the event thread's
re-registration are serialised by a lock.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import queue
import threading
from collections.abc import Callable

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NodeExistsError, NoNodeError
from kazoo.handlers.threading import KazooTimeoutError

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster.zookeeper_connect import parse_zookeeper_connect
from headrace.cluster.zookeeper_records import (
    BrokerRegistration,
    decode_cluster_id,
    encode_broker_registration,
    encode_cluster_id,
)
from headrace.errors import KafkaError

log = logging.getLogger(__name__)

NO_BROKER_EPOCH = -1
# kazoo retries connecting forever (max_tries -1) with this back-off, as ZooKeeper's Java client
# does; a session that expires meanwhile is replaced by a new one when a server answers again.
CONNECTION_RETRY = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0}
# A request that fails with ConnectionLoss (e.g. while the ensemble elects a new leader) is
# retried until the session timeout has passed, as Kafka's retryRequestUntilConnected does
# (bounded here: past the session timeout the session is gone anyway).
COMMAND_RETRY = {"max_tries": -1, "delay": 0.1, "backoff": 2, "max_delay": 1.0}
EVENT_THREAD_STOP_TIMEOUT_MS = 5000


class ZooKeeperClientError(KafkaError):
    """ZooKeeper could not be reached in time, or a znode operation the broker needs failed."""


class BrokerIdAlreadyRegistered(ZooKeeperClientError):
    """``/brokers/ids/<id>`` is held by another live session: another broker has this id."""


class SessionEvent(enum.Enum):
    SUSPENDED = "suspended"  # connection lost; the session (and its ephemerals) may survive
    RECONNECTED = "reconnected"  # the same session is back
    EXPIRED = "expired"  # the session is gone: its ephemeral znodes and watches too
    NEW_SESSION = "new_session"  # connected with a new session, registration redone
    REGISTRATION_FAILED = "registration_failed"  # a new session could not re-register


def _hex(session_id: int | None) -> str:
    return f"0x{session_id or 0:x}"


class ZooKeeperSession:
    """One kazoo client for the broker's lifetime. ``start()``, then ``register_broker``;
    ``stop()`` closes the session, which deletes the registration at once."""

    def __init__(self, connect: str, session_timeout_ms: int,
                 connection_timeout_ms: int | None = None) -> None:
        self.connect = parse_zookeeper_connect(connect)
        self.session_timeout_ms = session_timeout_ms
        self.connection_timeout_ms = connection_timeout_ms or session_timeout_ms
        self.client = KazooClient(hosts=self.connect.connect_string,
                                  timeout=session_timeout_ms / 1000,
                                  connection_retry=dict(CONNECTION_RETRY),
                                  command_retry={**COMMAND_RETRY,
                                                 "deadline": session_timeout_ms / 1000})
        self._listeners: list[Callable[[SessionEvent], None]] = []
        self._states: queue.Queue[str | None] = queue.Queue()
        self._event_thread: threading.Thread | None = None
        self._registration_lock = threading.Lock()
        self._registration: BrokerRegistration | None = None
        self._session_id: int | None = None
        self._own_session_ids: set[int] = set()
        self.broker_epoch = NO_BROKER_EPOCH

    # --- session -------------------------------------------------------------------------

    @property
    def session_id(self) -> int | None:
        client_id = self.client.client_id
        return client_id[0] if client_id else None

    def add_listener(self, callback: Callable[[SessionEvent], None]) -> None:
        """``callback(event)`` on the session's event thread after every state change."""
        self._listeners.append(callback)

    def start(self) -> None:
        """Create the chroot if missing, connect within zookeeper.connection.timeout.ms."""
        if self.connect.chroot is not None:
            self._create_chroot()
        self._connect(self.client)
        self._session_id = self.session_id
        self._own_session_ids.add(self._session_id)
        self.client.add_listener(self._states.put)
        self._event_thread = threading.Thread(target=self._run_events, daemon=True,
                                              name="zookeeper-session-events")
        self._event_thread.start()

    def stop(self) -> None:
        """Close the session (its ephemeral znodes go at once) and stop the event thread."""
        self.client.remove_listener(self._states.put)
        self._states.put(None)
        if self._event_thread is not None:
            self._event_thread.join(EVENT_THREAD_STOP_TIMEOUT_MS / 1000)
        with contextlib.suppress(KazooException):
            self.client.stop()
        self.client.close()

    def _connect(self, client: KazooClient) -> None:
        try:
            client.start(timeout=self.connection_timeout_ms / 1000)
        except KazooTimeoutError:
            raise ZooKeeperClientError(
                f"Timed out waiting for connection to ZooKeeper at {self.connect.hosts} "
                f"within zookeeper.connection.timeout.ms={self.connection_timeout_ms}") from None

    def _create_chroot(self) -> None:
        chroot_client = KazooClient(hosts=self.connect.hosts,
                                    timeout=self.session_timeout_ms / 1000)
        self._connect(chroot_client)
        try:
            chroot_client.ensure_path(self.connect.chroot)
        finally:
            chroot_client.stop()
            chroot_client.close()

    def _run_events(self) -> None:
        while (state := self._states.get()) is not None:
            for event in self._events_for(state):
                for listener in list(self._listeners):
                    try:
                        listener(event)
                    except Exception:
                        log.exception("ZooKeeper session listener failed on %s", event)

    def _events_for(self, state: str) -> list[SessionEvent]:
        if state == KazooState.SUSPENDED:
            log.warning("ZooKeeper connection of session %s lost", _hex(self._session_id))
            return [SessionEvent.SUSPENDED]
        if state == KazooState.LOST:
            log.warning("ZooKeeper session %s expired", _hex(self._session_id))
            return [SessionEvent.EXPIRED]
        session_id = self.session_id
        if session_id is None or session_id == self._session_id:
            log.info("ZooKeeper session %s reconnected", _hex(session_id))
            return [SessionEvent.RECONNECTED]
        log.info("new ZooKeeper session %s (was %s)", _hex(session_id), _hex(self._session_id))
        self._session_id = session_id
        self._own_session_ids.add(session_id)
        try:
            self._register_again()
        except (KafkaError, KazooException) as error:
            log.error("re-registering the broker after a new ZooKeeper session failed: %s",
                      error)
            return [SessionEvent.NEW_SESSION, SessionEvent.REGISTRATION_FAILED]
        return [SessionEvent.NEW_SESSION]

    # --- Kafka's start-up znodes ---------------------------------------------------------

    def ensure_persistent_paths(self) -> None:
        """Kafka's persistent znodes (``ZkData.PersistentZkPaths``), created when missing."""
        for path in paths.PERSISTENT_PATHS:
            self.client.retry(self.client.ensure_path, path)

    def create_or_get_cluster_id(self, proposed_cluster_id: str) -> str:
        """The cluster id at ``/cluster/id``, creating it with ``proposed_cluster_id`` first."""
        try:
            self.client.retry(self.client.create, paths.CLUSTER_ID,
                              encode_cluster_id(proposed_cluster_id), makepath=True)
            return proposed_cluster_id
        except NodeExistsError:
            data, _ = self.client.retry(self.client.get, paths.CLUSTER_ID)
            return decode_cluster_id(data)

    def generate_broker_sequence_id(self) -> int:
        """The next version of ``/brokers/seqid`` (1, 2, ...), as Kafka's
        ``generateBrokerSequenceId``; add reserved.broker.max.id for a broker id."""
        try:
            return self.client.retry(self.client.set, paths.BROKER_SEQUENCE_ID, b"", -1).version
        except NoNodeError:
            self.client.retry(self.client.ensure_path, paths.BROKER_SEQUENCE_ID)
            return self.client.retry(self.client.set, paths.BROKER_SEQUENCE_ID, b"", -1).version

    # --- registration --------------------------------------------------------------------

    def register_broker(self, registration: BrokerRegistration) -> int:
        """Create the ephemeral ``/brokers/ids/<id>``; keep it across new sessions. Returns
        the broker epoch (the znode's czxid)."""
        with self._registration_lock:
            self._registration = registration
            self.broker_epoch = self._create_registration(registration)
        log.info("registered broker %d at %s with endpoints %s, czxid (broker epoch): %d",
                 registration.broker_id, paths.broker_id_path(registration.broker_id),
                 ",".join(registration.endpoints), self.broker_epoch)
        return self.broker_epoch

    def _register_again(self) -> None:
        with self._registration_lock:
            if self._registration is not None:
                self.broker_epoch = NO_BROKER_EPOCH
                self.broker_epoch = self._create_registration(self._registration)
                log.info("re-registered broker %d, czxid (broker epoch): %d",
                         self._registration.broker_id, self.broker_epoch)

    def _create_registration(self, registration: BrokerRegistration) -> int:
        path = paths.broker_id_path(registration.broker_id)
        data = encode_broker_registration(registration)
        try:
            _, stat = self.client.retry(self.client.create, path, data, ephemeral=True,
                                        makepath=True, include_data=True)
            return stat.czxid
        except NodeExistsError:
            return self._registration_after_node_exists(path, data)

    def _registration_after_node_exists(self, path: str, data: bytes) -> int:
        try:
            _, stat = self.client.retry(self.client.get, path)
        except NoNodeError:  # went away while we looked: create it again
            _, stat = self.client.retry(self.client.create, path, data, ephemeral=True,
                                        include_data=True)
            return stat.czxid
        session_id = self.session_id
        if stat.ephemeralOwner == session_id:
            return stat.czxid
        if stat.ephemeralOwner in self._own_session_ids:  # our own expired session's znode
            self.client.retry(self.client.delete, path, stat.version)
            _, stat = self.client.retry(self.client.create, path, data, ephemeral=True,
                                        include_data=True)
            return stat.czxid
        raise BrokerIdAlreadyRegistered(
            f"Error while creating ephemeral at {path}, node already exists and owner "
            f"'{_hex(stat.ephemeralOwner)}' does not match current session '{_hex(session_id)}' "
            "(KeeperErrorCode = NodeExists): another broker is registered with this broker.id")
