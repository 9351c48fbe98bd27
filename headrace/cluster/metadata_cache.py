"""The broker's view of the cluster, fed by ZooKeeper watches.

Owns ``ClusterMetadata`` (one immutable snapshot: cluster id, controller id, live brokers
with their endpoints, topics with their assignment, topic id and config, partition states
with their znode versions -- a leader's ISR write is conditional on the version it saw),
``MetadataCache`` (the snapshot handlers read, on the event loop) and ``MetadataWatcher``
(the ZooKeeper watches that build the snapshots).

Metadata reaches brokers through ZooKeeper watches, not LeaderAndIsr/UpdateMetadata requests
(the kio codec follows Kafka 4.x schemas, which dropped those ZooKeeper-era controller RPCs;
and a broker that acts only on znodes cannot be misled by a fenced controller, whose writes
fail their ``/controller_epoch`` version check). Watched znodes, laid out as Kafka's
ZkData.scala (3.x) lays them out: ``/brokers/ids`` (children, then each broker's JSON),
``/brokers/topics`` (children), each ``/brokers/topics/<t>`` (the assignment), each
``/brokers/topics/<t>/partitions/<p>/state``, each ``/config/topics/<t>`` (the topic's
config overrides: watching the config znode itself gives the broker what Kafka's
``/config/changes`` notifications point it to), ``/controller`` and ``/cluster/id``. kazoo's
DataWatch/ChildrenWatch re-read and re-arm after every event and after a new session, so a
watch that fires once is never lost.

Thread-safety: watch callbacks run on kazoo's threads (and, for the first read of each watch,
on the thread that set it). They update ``MetadataWatcher``'s private tables under its lock
and hand the event loop one ``call_soon_threadsafe`` per burst of changes; the loop then takes
a snapshot of the tables (``ClusterMetadata``, immutable) and installs it in the
``MetadataCache``. Broker state is never touched from a kazoo thread. Handlers read
``MetadataCache.current`` on the loop thread; the append thread may read it too (a reference
to an immutable object).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError
from kazoo.recipe.watchers import ChildrenWatch, DataWatch

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.cluster.zookeeper_records import NO_LEADER, PartitionState

log = logging.getLogger(__name__)

NO_CONTROLLER = -1
ZERO_TOPIC_ID = uuid.UUID(int=0)


@dataclass(frozen=True, slots=True)
class TopicMetadata:
    name: str
    topic_id: uuid.UUID
    replicas: tuple[tuple[int, ...], ...]  # by partition index
    configs: Mapping[str, str] = field(default_factory=dict)

    @property
    def partition_count(self) -> int:
        return len(self.replicas)


@dataclass(frozen=True, slots=True)
class ClusterMetadata:
    cluster_id: str | None = None
    controller_id: int = NO_CONTROLLER
    brokers: Mapping[int, records.BrokerRegistration] = field(default_factory=dict)
    topics: Mapping[str, TopicMetadata] = field(default_factory=dict)
    states: Mapping[tuple[str, int], PartitionState] = field(default_factory=dict)
    # each state's znode version (its zkVersion): a leader's ISR write is conditional on it
    state_versions: Mapping[tuple[str, int], int] = field(default_factory=dict)

    def leader_of(self, topic: str, partition: int) -> int:
        """The partition's leader, NO_LEADER while it has no state or no leader."""
        state = self.states.get((topic, partition))
        return state.leader if state is not None else NO_LEADER

    def partitions_led_by(self, broker_id: int) -> list[tuple[str, int]]:
        return [key for key, state in self.states.items() if state.leader == broker_id]


# --- Kafka's znode JSON, through the codecs of ``zookeeper_records`` ---------------------------


def parse_topic(name: str, data: bytes) -> TopicMetadata:
    """``/brokers/topics/<t>``: the replicas of partitions 0..n-1 and the topic id."""
    assignment = records.decode_topic_assignment(name, data)
    replicas = tuple(tuple(assignment.partitions.get(index, ()))
                     for index in range(len(assignment.partitions)))
    topic_id = uuid.UUID(bytes=assignment.topic_id) if assignment.topic_id else ZERO_TOPIC_ID
    return TopicMetadata(name, topic_id, replicas)


# --- the loop side --------------------------------------------------------------------------


@dataclass
class MetadataCache:
    """The latest snapshot, and who to tell when it changes. Event loop thread. ``loaded``:
    a complete snapshot was installed (until then ``current`` is empty, not the cluster)."""

    current: ClusterMetadata = field(default_factory=ClusterMetadata)
    loaded: bool = False
    listeners: list[Callable[[ClusterMetadata], None]] = field(default_factory=list)
    _changed: asyncio.Event = field(default_factory=asyncio.Event)

    def install(self, snapshot: ClusterMetadata) -> None:
        self.current = snapshot
        self.loaded = True
        for listener in self.listeners:
            listener(snapshot)
        self._changed.set()
        self._changed = asyncio.Event()

    async def wait_until(self, predicate: Callable[[ClusterMetadata], bool],
                         timeout_ms: int) -> bool:
        """Whether ``predicate`` held for a snapshot installed within ``timeout_ms``."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000
        while not predicate(self.current):
            remaining_s = deadline - loop.time()
            if remaining_s <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining_s)
            except TimeoutError:
                return predicate(self.current)
        return True


# --- the ZooKeeper side -----------------------------------------------------------------------


class MetadataWatcher:
    """Sets the watches and keeps the tables they feed; publishes snapshots to ``cache`` on
    ``loop`` (see the module docstring for threads)."""

    def __init__(self, zk: KazooClient, loop: asyncio.AbstractEventLoop,
                 cache: MetadataCache) -> None:
        self._zk = zk
        self._loop = loop
        self._cache = cache
        self._lock = threading.Lock()
        self._cluster_id: str | None = None
        self._controller_id = NO_CONTROLLER
        self._brokers: dict[int, records.BrokerRegistration] = {}
        self._topics: dict[str, TopicMetadata] = {}
        self._configs: dict[str, dict[str, str]] = {}
        self._states: dict[tuple[str, int], PartitionState] = {}
        self._state_versions: dict[tuple[str, int], int] = {}
        self._watch_tokens: dict[object, object] = {}  # watched key -> its live watch's token
        self._publish_pending = False
        self._started = False
        self._stopped = False

    def start(self) -> None:
        """Blocking (run it off the loop): set every watch and read everything once, then
        publish the first complete snapshot."""
        DataWatch(self._zk, paths.CLUSTER_ID, self._on_cluster_id)
        DataWatch(self._zk, paths.CONTROLLER, self._on_controller)
        ChildrenWatch(self._zk, paths.BROKER_IDS, self._on_broker_ids)
        self._zk.retry(self._zk.ensure_path, paths.TOPICS)
        ChildrenWatch(self._zk, paths.TOPICS, self._on_topic_names)
        with self._lock:
            self._started = True
        self._changed()

    def stop(self) -> None:
        """Watches stop at their next event; nothing more is published."""
        with self._lock:
            self._stopped = True
            self._watch_tokens.clear()

    # --- publishing ---------------------------------------------------------------------

    def _changed(self) -> None:
        """Any thread: schedule one snapshot for the loop unless one is pending already."""
        with self._lock:
            if not self._started or self._stopped or self._publish_pending:
                return
            self._publish_pending = True
        try:
            self._loop.call_soon_threadsafe(self._publish)
        except RuntimeError:  # the loop is closed: the broker is stopping
            pass

    def _publish(self) -> None:
        """Loop thread."""
        with self._lock:
            self._publish_pending = False
            if self._stopped:
                return
            topics = {name: TopicMetadata(a.name, a.topic_id, a.replicas,
                                            MappingProxyType(dict(self._configs.get(name, {}))))
                      for name, a in self._topics.items()}
            snapshot = ClusterMetadata(
                self._cluster_id, self._controller_id, MappingProxyType(dict(self._brokers)),
                MappingProxyType(topics), MappingProxyType(dict(self._states)),
                MappingProxyType(dict(self._state_versions)))
        self._cache.install(snapshot)

    def _watch_is_live(self, key: object, token: object) -> bool:
        with self._lock:
            return not self._stopped and self._watch_tokens.get(key) is token

    def _new_watch_token(self, key: object) -> object | None:
        """A token for a new watch of ``key``; None when ``key`` is watched already."""
        with self._lock:
            if self._stopped or key in self._watch_tokens:
                return None
            token = self._watch_tokens[key] = object()
            return token

    # --- callbacks (kazoo threads) --------------------------------------------------------

    def _on_cluster_id(self, data, _stat, _event=None) -> bool:
        with self._lock:
            self._cluster_id = records.decode_cluster_id(data) if data else None
        self._changed()
        return not self._stopped

    def _on_controller(self, data, _stat, _event=None) -> bool:
        with self._lock:
            self._controller_id = (records.decode_controller_registration(data).broker_id
                                   if data else NO_CONTROLLER)
        self._changed()
        return not self._stopped

    def _on_broker_ids(self, children: list[str]) -> bool:
        """Re-read every live broker's endpoints (a re-registered id may have moved)."""
        brokers = {}
        for child in children:
            try:
                data, _ = self._zk.retry(self._zk.get, paths.broker_id_path(int(child)))
                brokers[int(child)] = records.decode_broker_registration(int(child), data)
            except NoNodeError:  # gone since the children were listed: the next event says so
                continue
            except ValueError as error:  # MalformedZnode
                log.warning("ignoring broker znode %s: %s", child, error)
            except KazooException as error:  # connection lost meanwhile: keep what we knew
                log.warning("reading broker znode %s failed: %r", child, error)
                with self._lock:
                    if int(child) in self._brokers:
                        brokers[int(child)] = self._brokers[int(child)]
        with self._lock:
            self._brokers = brokers
        self._changed()
        return not self._stopped

    def _on_topic_names(self, children: list[str]) -> bool:
        names = set(children)
        with self._lock:
            for gone in set(self._topics) - names:
                self._forget_topic(gone)
        for name in sorted(names):
            token = self._new_watch_token(("topic", name))
            if token is not None:
                DataWatch(self._zk, paths.topic_path(name),
                          lambda data, _stat, _event=None, n=name, t=token: self._on_assignment(n, t, data))
        self._changed()
        return not self._stopped

    def _forget_topic(self, name: str) -> None:
        """Under the lock: drop a deleted topic; its watches stop at their next event."""
        self._topics.pop(name, None)
        self._configs.pop(name, None)
        for key in [key for key in self._states if key[0] == name]:
            del self._states[key]
            self._state_versions.pop(key, None)
        for key in [key for key in self._watch_tokens
                    if key[0] in ("topic", "config") and key[1] == name
                    or key[0] == "state" and key[1][0] == name]:
            del self._watch_tokens[key]

    def _on_assignment(self, name: str, token: object, data: bytes | None) -> bool:
        if not self._watch_is_live(("topic", name), token):
            return False
        if data is None:
            with self._lock:
                self._forget_topic(name)
            self._changed()
            return False
        try:
            assignment = parse_topic(name, data)
        except (ValueError, KeyError, TypeError) as error:
            log.warning("ignoring the assignment of topic %s: %s", name, error)
            return True
        with self._lock:
            previous = self._topics.get(name)
            if previous is not None and previous.topic_id != assignment.topic_id:
                for key in [k for k in self._states if k[0] == name]:
                    del self._states[key]  # re-created: the old states are no more
                    self._state_versions.pop(key, None)
            self._topics[name] = assignment
        config_token = self._new_watch_token(("config", name))
        if config_token is not None:
            DataWatch(self._zk, paths.topic_config_path(name),
                      lambda data, _stat, _event=None, t=config_token: self._on_config(name, t, data))
        for partition in range(assignment.partition_count):
            key = ("state", (name, partition))
            state_token = self._new_watch_token(key)
            if state_token is not None:
                DataWatch(self._zk, paths.partition_state_path(name, partition),
                          lambda data, stat, _event=None, k=key, t=state_token:
                          self._on_state(k, t, data, stat))
        self._changed()
        return True

    def _on_config(self, name: str, token: object, data: bytes | None) -> bool:
        if not self._watch_is_live(("config", name), token):
            return False
        try:
            configs = records.decode_entity_config(data)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            log.warning("ignoring the config of topic %s: %s", name, error)
            return True
        with self._lock:
            self._configs[name] = configs
        self._changed()
        return True

    def _on_state(self, key: tuple, token: object, data: bytes | None, stat=None) -> bool:
        if not self._watch_is_live(key, token):
            return False
        topic_partition = key[1]
        try:
            state = records.decode_partition_state(data) if data is not None else None
        except (ValueError, KeyError, TypeError) as error:
            log.warning("ignoring the state of %s-%d: %s", *topic_partition, error)
            return True
        with self._lock:
            if state is None:
                self._states.pop(topic_partition, None)
                self._state_versions.pop(topic_partition, None)
            else:
                self._states[topic_partition] = state
                if stat is not None:
                    self._state_versions[topic_partition] = stat.version
        self._changed()
        return True
