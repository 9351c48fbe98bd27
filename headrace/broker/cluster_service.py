"""The broker side of cluster mode: metadata from ZooKeeper, the partitions served here, and
the answers Metadata, DescribeCluster and FindCoordinator give from them.

Owns ``ClusterService`` (``BrokerState.cluster``; None for a single node, whose code paths do
not change). At start it sets the ZooKeeper watches (``cluster.metadata_cache``), waits for
the first complete snapshot and its application (``cluster.replica_manager``: stray logs
deleted, logs of led partitions created), then puts ``cluster.served_logs.ServedLogs`` in
``BrokerState.log_manager`` so every handler routes as Kafka's brokers do
(NOT_LEADER_OR_FOLLOWER for a partition led elsewhere). The group coordinator is told which
``__consumer_offsets`` partitions this broker gains and loses, and loads or unloads their groups.

Answers, as Kafka's ZooKeeper-mode ``MetadataCache``: the live brokers (``/brokers/ids``);
per partition the leader, its epoch, the replicas, the isr, and the replicas whose broker is
not alive (``offline_replicas``); a partition without a live leader answers
LEADER_NOT_AVAILABLE with leader -1. Fetch and ListOffsets carrying a leader epoch are checked
against it (``check_leader_epoch``: FENCED_LEADER_EPOCH / UNKNOWN_LEADER_EPOCH). FindCoordinator names the leader of the group's
``__consumer_offsets`` partition (Kafka's ``partitionFor``: Java's String.hashCode, its
``Utils.abs``, modulo ``offsets.topic.num.partitions``), COORDINATOR_NOT_AVAILABLE while that
partition has no leader or the topic does not exist yet; the first such request creates it.

Topics created from here (Metadata's auto-creation, the offsets topic) are written to ZooKeeper
as Kafka's AdminZkClient writes them (``cluster.topic_admin.create_topic_assignment``); the
controller then elects their leaders. The offsets topic gets ``offsets.topic.replication.factor``
replicas (3 by default): while fewer brokers are alive it is not created and FindCoordinator
answers COORDINATOR_NOT_AVAILABLE (Kafka's creation fails with INVALID_REPLICATION_FACTOR the
same way); auto-created topics get ``default.replication.factor`` replicas, and Metadata answers
the creation's error (INVALID_REPLICATION_FACTOR when too few brokers are alive) or
LEADER_NOT_AVAILABLE once it is written, as Kafka's ``AutoTopicCreationManager.createTopicsInZk``.

Replication's follower side runs here too: ``fetchers`` (``broker.replica_fetcher``) copy the
partitions the replica manager hands them, and ``leader_throttle``
(``broker.replication_quota``) holds back throttled followers' fetches of partitions led here.

On SIGTERM the server calls ``controlled_shutdown`` before stopping: the controller is asked to
move this broker's leaderships away (``cluster.controlled_shutdown``).

Thread-safety: event loop thread; blocking ZooKeeper calls run in the default executor.
"""

from __future__ import annotations

import asyncio
import logging

from kazoo.exceptions import KazooException

from headrace.broker.replica_fetcher import ReplicaFetcherManager
from headrace.broker.replication_quota import LeaderReplicationThrottle
from headrace.cluster.controlled_shutdown import ControlledShutdownPolicy, shut_down_controlled
from headrace.cluster.leader_replicas import LeaderReplicas
from headrace.cluster.metadata_cache import ClusterMetadata, MetadataCache, MetadataWatcher
from headrace.cluster.replica_manager import ReplicaManager
from headrace.cluster.served_logs import ServedLogs
from headrace.cluster.topic_admin import create_topic_assignment
from headrace.cluster.zookeeper_records import NO_LEADER
from headrace.cluster.zookeeper_session import ZooKeeperClientError
from headrace.coordinator.records import OFFSETS_TOPIC_NAME, partition_for_group
from headrace.errors import (
    CoordinatorNotAvailable,
    FencedLeaderEpoch,
    KafkaError,
    LeaderNotAvailable,
    TopicAlreadyExists,
    UnknownLeaderEpoch,
)

log = logging.getLogger(__name__)

FIRST_APPLY_TIMEOUT_MS = 30_000
NO_LEADER_EPOCH = -1  # Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH: no check asked


def check_current_leader_epoch(topic: str, partition: int, current_leader_epoch: int,
                               leader_epoch: int) -> None:
    """Kafka's ``checkCurrentLeaderEpoch``: -1 asks no check; older than ``leader_epoch`` is
    FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH."""
    if current_leader_epoch == NO_LEADER_EPOCH:
        return
    if current_leader_epoch < leader_epoch:
        raise FencedLeaderEpoch(f"{topic}-{partition}: epoch {current_leader_epoch} is "
                                f"older than the leader's {leader_epoch}")
    if current_leader_epoch > leader_epoch:
        raise UnknownLeaderEpoch(f"{topic}-{partition}: epoch {current_leader_epoch} is "
                                 f"newer than the leader's {leader_epoch}")


class ClusterService:
    def __init__(self, state, zk) -> None:
        self._state = state
        self.zk = zk  # the membership's kazoo client
        self.broker_id: int = state.node_id
        self.cache = MetadataCache()
        self._watcher = MetadataWatcher(zk, asyncio.get_running_loop(), self.cache)
        self.local_logs = state.log_manager
        self.leader_replicas = LeaderReplicas(
            self.broker_id, zk, state.clock, state.config.get_int("replica.lag.time.max.ms"),
            state.run_append, state.appended.notify, self.local_logs.initial_high_watermark)
        self.replicas = ReplicaManager(self.broker_id, self.local_logs, self.cache,
                                       state.run_append, self.leader_replicas)
        self.fetchers = ReplicaFetcherManager(state, self.cache, self.local_logs)
        self.leader_throttle = LeaderReplicationThrottle(self.broker_id, state.config, self.cache)
        self.replicas.fetchers = self.fetchers
        self._creating: dict[str, asyncio.Task] = {}

    async def start(self) -> None:
        """Read the cluster's metadata, bring the local logs in step, then route requests."""
        try:
            await asyncio.get_running_loop().run_in_executor(None, self._watcher.start)
        except KazooException as error:
            raise ZooKeeperClientError(f"reading the cluster metadata failed: ZooKeeper "
                                       f"unavailable ({error!r})") from None
        self.replicas.start()
        try:
            await asyncio.wait_for(self.replicas.applied_once.wait(),
                                   FIRST_APPLY_TIMEOUT_MS / 1000)
        except TimeoutError:
            log.warning("the cluster metadata was not applied within %d ms; going on",
                        FIRST_APPLY_TIMEOUT_MS)
        self._state.log_manager = ServedLogs(self.local_logs, self.cache, self.replicas)

    def has_complete_view(self, metadata: ClusterMetadata) -> bool:
        """Whether ``metadata`` is a view clients may be answered from: the cluster id, this
        broker among the live brokers, and a live controller."""
        return (metadata.cluster_id is not None and self.broker_id in metadata.brokers
                and metadata.controller_id in metadata.brokers)

    async def wait_for_complete_view(self, timeout_ms: int) -> None:
        """Until the cache holds a complete view (``has_complete_view``), after this broker
        registered and its controller candidate started; ZooKeeperClientError past
        ``timeout_ms`` (zookeeper.connection.timeout.ms)."""
        if not await self.cache.wait_until(self.has_complete_view, timeout_ms):
            metadata = self.metadata
            raise ZooKeeperClientError(
                f"no complete cluster view from ZooKeeper within "
                f"zookeeper.connection.timeout.ms={timeout_ms} (live brokers "
                f"{sorted(metadata.brokers)}, controller {metadata.controller_id})")

    def follow_offsets_leadership(self, groups) -> None:
        """Hand the group service every change of the offsets partitions led here."""
        self.replicas.listeners.append(groups.leadership_changed)
        groups.leadership_changed(self.replicas.served, frozenset())

    async def controlled_shutdown(self) -> bool:
        """Before stopping: have the controller move this broker's leaderships away
        (``cluster.controlled_shutdown``, bounded by Kafka's controlled.shutdown.* configs)."""
        policy = ControlledShutdownPolicy.from_config(self._state.config)
        return await asyncio.get_running_loop().run_in_executor(
            None, shut_down_controlled, self.zk, self.broker_id,
            self._state.membership.broker_epoch, policy)

    async def stop(self) -> None:
        await self.replicas.stop()
        await self.fetchers.stop()
        self._watcher.stop()

    @property
    def metadata(self) -> ClusterMetadata:
        return self.cache.current

    @property
    def controller_id(self) -> int:
        return self.metadata.controller_id

    # --- Metadata / DescribeCluster ------------------------------------------------------

    def live_brokers(self) -> list[dict]:
        return [{"node_id": b.broker_id, "host": b.host, "port": b.port, "rack": b.rack}
                for _, b in sorted(self.metadata.brokers.items())]

    def partition_metadata(self, topic: str, index: int) -> dict:
        metadata = self.metadata
        cluster_topic = metadata.topics.get(topic)
        replicas = list(cluster_topic.replicas[index]) if cluster_topic else []
        state = metadata.states.get((topic, index))
        offline = [r for r in replicas if r not in metadata.brokers]
        leader = state.leader if state is not None else NO_LEADER
        answer = {"error_code": 0, "partition_index": index, "leader_id": leader,
                  "leader_epoch": state.leader_epoch if state is not None else -1,
                  "replica_nodes": replicas, "isr_nodes": list(state.isr) if state else [],
                  "offline_replicas": offline}
        if leader == NO_LEADER or leader not in metadata.brokers:
            answer.update(error_code=LeaderNotAvailable.code, leader_id=NO_LEADER)
        return answer

    # --- leader epochs (KIP-320) ----------------------------------------------------------

    def check_leader_epoch(self, topic: str, partition: int, current_leader_epoch: int) -> None:
        """Kafka's ``Partition.checkCurrentLeaderEpoch`` for Fetch (v9+) and ListOffsets
        (v4+): -1 asks no check; an older epoch than this leader's is FENCED_LEADER_EPOCH,
        a newer one UNKNOWN_LEADER_EPOCH (this broker has not seen it yet). Both make the
        client refresh its metadata."""
        state = self.metadata.states.get((topic, partition))
        leader_epoch = state.leader_epoch if state is not None else NO_LEADER_EPOCH
        check_current_leader_epoch(topic, partition, current_leader_epoch, leader_epoch)

    def hosts_replica(self, topic: str, partition: int) -> bool:
        """Whether this broker is one of the partition's assigned replicas."""
        cluster_topic = self.metadata.topics.get(topic)
        return (cluster_topic is not None and 0 <= partition < cluster_topic.partition_count
                and self.broker_id in cluster_topic.replicas[partition])

    # --- FindCoordinator --------------------------------------------------------------------

    def group_coordinator(self, group_id: str) -> dict:
        """The broker leading the group's offsets partition, or COORDINATOR_NOT_AVAILABLE
        (creating the offsets topic when it does not exist yet)."""
        metadata = self.metadata
        if OFFSETS_TOPIC_NAME not in metadata.topics:
            self.create_topic_soon(OFFSETS_TOPIC_NAME, self._offsets_topic_partitions(),
                                   "offsets.topic.replication.factor",
                                   self._offsets_topic_configs())
            raise CoordinatorNotAvailable(f"{OFFSETS_TOPIC_NAME} is being created")
        partition = partition_for_group(group_id, metadata.topics[OFFSETS_TOPIC_NAME]
                                        .partition_count)
        leader = metadata.leader_of(OFFSETS_TOPIC_NAME, partition)
        endpoint = metadata.brokers.get(leader)
        if endpoint is None:
            raise CoordinatorNotAvailable(
                f"{OFFSETS_TOPIC_NAME}-{partition} has no live leader")
        return {"node_id": endpoint.broker_id, "host": endpoint.host, "port": endpoint.port}

    def _offsets_topic_partitions(self) -> int:
        return self._state.config.get_int("offsets.topic.num.partitions")

    def _offsets_topic_configs(self) -> dict[str, str]:
        return {"cleanup.policy": "compact",
                "segment.bytes": self._state.config.get("offsets.topic.segment.bytes")}

    # --- topic creation through ZooKeeper ---------------------------------------------------

    def create_topic_soon(self, name: str, partitions: int, replication_config: str,
                          configs: dict[str, str]) -> None:
        """Start writing the topic's assignment unless already under way (idempotent)."""
        if name in self._creating:
            return
        task = asyncio.get_running_loop().create_task(
            self.create_topic(name, partitions, replication_config, configs))
        self._creating[name] = task
        task.add_done_callback(lambda _task: self._creating.pop(name, None))

    async def create_topic(self, name: str, partitions: int, replication_config: str,
                           configs: dict[str, str]) -> KafkaError | None:
        """Write the assignment znode with ``replication_config``'s replication factor; the
        controller then elects the leaders. The error that prevented it, if any
        (TOPIC_ALREADY_EXISTS is no failure here)."""
        replication_factor = self._state.config.get_int(replication_config)
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, create_topic_assignment, self.zk, name, partitions, replication_factor,
                configs)
            log.info("created topic %s (%d partitions, replication factor %d) in ZooKeeper",
                     name, partitions, replication_factor)
        except TopicAlreadyExists:
            pass
        except KafkaError as error:
            log.warning("creating topic %s (%s=%d) failed: %s", name, replication_config,
                        replication_factor, error)
            return error
        return None
