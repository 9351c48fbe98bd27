"""The broker's membership of a ZooKeeper-mode cluster: ``ClusterMembership``.

Owns what a Kafka broker in ZooKeeper mode does with ZooKeeper at start-up and shutdown,
composed from ``headrace.cluster.zookeeper_session``: open the one session
(``zookeeper.connect`` with its chroot, ``zookeeper.session.timeout.ms``,
``zookeeper.connection.timeout.ms``), create Kafka's persistent znodes, take the cluster id
from ``/cluster/id`` (created on the first start of the cluster), settle the broker id
(``broker.id``; else the one in meta.properties; else, with ``broker.id.generation.enable``,
``/brokers/seqid``'s next version + ``reserved.broker.max.id``, as Kafka's KafkaServer), check
and write ``meta.properties``, and, once the listener is bound, register ``/brokers/ids/<id>``.
``leave`` closes the session, which deletes the registration at once.

Without ``zookeeper.connect`` there is no membership (``server.cluster_membership`` returns
None, and kazoo is not imported) and the broker is the single node it always was: every cluster
code path sits behind this object.

``meta.properties`` in cluster mode is Kafka's ZooKeeper-mode version 0 file (first log dir)::

    version=0
    broker.id=<id>
    cluster.id=<22-char id from /cluster/id>

A file of another version (a single-node data directory), another cluster id or another broker
id stops the broker with Kafka's message (``MetaPropertiesEnsemble.verify``).

Thread-safety: ``join``, ``register`` and ``leave`` block on the network: the server runs them
in an executor, one at a time. Session events reach listeners on the session's event thread
(see ``ZooKeeperSession``); hand them to the loop with ``loop.call_soon_threadsafe``.
"""

from __future__ import annotations

import logging
from pathlib import Path

from kazoo.exceptions import KazooException

from headrace.broker.config import BrokerConfig
from headrace.broker.state import (
    META_PROPERTIES_FILE,
    random_cluster_id,
    write_properties_durably,
)
from headrace.cluster.zookeeper_records import BrokerRegistration
from headrace.cluster.zookeeper_session import ZooKeeperClientError, ZooKeeperSession
from headrace.errors import InvalidConfig
from headrace.storage.config import parse_properties_text

log = logging.getLogger(__name__)

ZOOKEEPER_META_PROPERTIES_VERSION = "0"


class ClusterMembership:
    """One broker's session with the cluster's ZooKeeper; ``join`` -> ``register`` ->
    ``leave``."""

    def __init__(self, config: BrokerConfig) -> None:
        self.config = config
        connection_timeout = config.get("zookeeper.connection.timeout.ms")
        self.session = ZooKeeperSession(
            config.get("zookeeper.connect") or "",
            session_timeout_ms=config.get_int("zookeeper.session.timeout.ms"),
            connection_timeout_ms=int(connection_timeout) if connection_timeout else None)
        self.cluster_id: str | None = None
        self.broker_id: int | None = None

    @property
    def broker_epoch(self) -> int:
        return self.session.broker_epoch

    def join(self) -> None:
        """Session, Kafka's znodes, cluster id, broker id, meta.properties (blocking)."""
        self.session.start()
        try:
            self._join_session()
        except KazooException as error:  # e.g. the ensemble went away meanwhile
            self.session.stop()
            raise ZooKeeperClientError(f"joining the cluster through ZooKeeper failed: "
                                       f"{error!r}") from None
        except BaseException:
            self.session.stop()
            raise

    def _join_session(self) -> None:
        self.session.ensure_persistent_paths()
        self.cluster_id = self.session.create_or_get_cluster_id(random_cluster_id())
        meta_path = self.config.log_dirs[0] / META_PROPERTIES_FILE
        stored = _read_zookeeper_meta_properties(meta_path, self.cluster_id)
        self.broker_id = self._broker_id(stored.get("broker.id"), meta_path)
        write_properties_durably(meta_path, {
            "version": ZOOKEEPER_META_PROPERTIES_VERSION,
            "broker.id": str(self.broker_id), "cluster.id": self.cluster_id})

    def register(self, host: str, port: int, now_ms: int) -> int:
        """Register ``/brokers/ids/<id>`` with the bound listener (``now_ms``: its timestamp);
        the broker epoch."""
        endpoint = f"PLAINTEXT://{host}:{port}"
        registration = BrokerRegistration(
            broker_id=self.broker_id, host=host, port=port, endpoints=(endpoint,),
            timestamp_ms=now_ms)
        try:
            return self.session.register_broker(registration)
        except KazooException as error:
            raise ZooKeeperClientError(f"registering broker {self.broker_id} in ZooKeeper "
                                       f"failed: {error!r}") from None

    def leave(self) -> None:
        """Close the session: the registration goes at once."""
        self.session.stop()

    def _broker_id(self, stored: str | None, meta_path: Path) -> int:
        configured = self.config.get_int("broker.id")
        if configured >= 0:
            if stored is not None and int(stored) != configured:
                raise InvalidConfig(
                    f"Stored node id {stored} doesn't match previous node id {configured} in "
                    f"{meta_path}. If you moved your data, make sure your configured node id "
                    "matches. If you intend to create a new node, you should remove all data "
                    "in your data directories.")
            return configured
        if stored is not None:
            return int(stored)
        if not self.config.get_bool("broker.id.generation.enable"):
            raise InvalidConfig("No broker ID found, and broker.id.generation.enable is "
                                "disabled.")
        return (self.session.generate_broker_sequence_id()
                + self.config.get_int("reserved.broker.max.id"))


def _read_zookeeper_meta_properties(path: Path, cluster_id: str) -> dict[str, str]:
    """The stored properties, checked as Kafka's ZooKeeper-mode broker checks them."""
    if not path.exists():
        return {}
    stored = parse_properties_text(path.read_text())
    if stored.get("version", ZOOKEEPER_META_PROPERTIES_VERSION) != ZOOKEEPER_META_PROPERTIES_VERSION:
        raise InvalidConfig(
            f"Found unexpected version in {path}. ZK-based brokers that are not migrating only "
            "support version 0 (which is implicit when the `version` field is missing).")
    if stored.get("cluster.id") not in (None, cluster_id):
        raise InvalidConfig(f"Invalid cluster.id in: {path}. Expected {cluster_id}, but read "
                            f"{stored['cluster.id']}")
    return stored
