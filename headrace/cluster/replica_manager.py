"""Local logs in step with the cluster: which partitions this broker serves.

Owns ``ReplicaManager``: on every metadata snapshot (``metadata_cache``) it

* deletes, through the log manager's delete path, the local logs of topics the cluster no
  longer has (deleted in ZooKeeper) or has under another topic id (deleted and re-created
  while this broker was away) -- at start-up these are the strays of topics deleted while it
  was down, each logged;
* creates the local logs of partitions whose state names this broker leader
  (``LogManager.create_local_partitions``, with the topic's id and config from ZooKeeper) and
  then serves them: ``served`` is the set of partitions this broker leads and holds a log for;
* creates the logs of partitions assigned here and led by another broker and hands them,
  with their leader and leader epoch, to the replica fetchers (``fetchers.follow``, the
  broker's ``replica_fetcher``): the become-follower path, ``_apply_follower_states``;
* applies changed topic configs (``/config/topics/<t>``) to the local logs;
* tells its listeners ``(gained, lost)`` partitions after each change of ``served`` (the group
  coordinator loads and unloads its ``__consumer_offsets`` partitions on it).

The become-leader path hands the partitions led here, with their logs, to
``leader_replicas.LeaderReplicas`` (leader epoch, ISR, high watermark, acks=all) before they
are served. A partition this broker no longer leads keeps its log (it is still its replica)
but is not served: requests for it answer NOT_LEADER_OR_FOLLOWER (``served_logs.ServedLogs``);
following a leader is the follower path's.

Thread-safety: event loop thread; one applier task applies the latest snapshot at a time,
its log creations and deletions run on the broker's append thread (``run_append``).
``served`` is replaced, never mutated, so other threads (the append thread) may read it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from headrace.cluster.leader_replicas import LeaderReplicas
from headrace.cluster.metadata_cache import ClusterMetadata, MetadataCache
from headrace.cluster.zookeeper_records import NO_LEADER
from headrace.errors import KafkaError
from headrace.storage.config import validate_topic_overrides

log = logging.getLogger(__name__)

Partitions = frozenset[tuple[str, int]]
LeadershipListener = Callable[[Partitions, Partitions], None]


class ReplicaManager:
    def __init__(self, broker_id: int, log_manager, cache: MetadataCache,
                 run_append: Callable[..., Awaitable],
                 leader_replicas: LeaderReplicas | None = None) -> None:
        self.broker_id = broker_id
        self.leader_replicas = leader_replicas
        self._manager = log_manager
        self._cache = cache
        self._run_append = run_append
        self.served: Partitions = frozenset()
        self.listeners: list[LeadershipListener] = []
        self._applied_configs: dict[str, dict[str, str]] = {}
        self._snapshot_waiting = asyncio.Event()
        self._applied: ClusterMetadata | None = None
        self.applied_once = asyncio.Event()
        self._task: asyncio.Task | None = None
        # headrace.broker.replica_fetcher.ReplicaFetcherManager, set by the broker (a layer
        # above): ``async follow({partition: (leader, leader epoch)})``
        self.fetchers = None

    def start(self) -> None:
        self._cache.listeners.append(self._on_snapshot)
        self._task = asyncio.get_running_loop().create_task(self._apply_loop())
        if self.leader_replicas is not None:
            self.leader_replicas.start()
        if self._cache.loaded:
            self._snapshot_waiting.set()

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        if self.leader_replicas is not None:
            await self.leader_replicas.stop()

    def _on_snapshot(self, _snapshot: ClusterMetadata) -> None:
        self._snapshot_waiting.set()

    async def _apply_loop(self) -> None:
        while True:
            await self._snapshot_waiting.wait()
            self._snapshot_waiting.clear()
            snapshot = self._cache.current
            try:
                await self._apply(snapshot)
            except Exception:  # the next snapshot tries again
                log.exception("applying cluster metadata failed")
            self.applied_once.set()

    async def _apply(self, snapshot: ClusterMetadata) -> None:
        await self._delete_topics_not_in(snapshot)
        wanted = {key for key in snapshot.partitions_led_by(self.broker_id)
                  if key[0] in snapshot.topics}
        await self._create_missing_logs(snapshot, wanted)
        await self._apply_follower_states(snapshot)
        await self._apply_configs(snapshot)
        offline = self._manager.offline_partitions()
        local = {key for key in wanted if self._has_log(key) or key in offline}
        self._become_leader(snapshot, {key for key in local if key not in offline})
        self._set_served(frozenset(local))

    def _become_leader(self, snapshot: ClusterMetadata, led: set[tuple[str, int]]) -> None:
        """The leader side of the partitions led here with a log (``leader_replicas``):
        leader epoch, ISR, high watermark; before they are served."""
        if self.leader_replicas is not None:
            self.leader_replicas.apply(snapshot, {key: self._manager.get_log(*key)
                                                  for key in led})

    # --- the become-follower path ---------------------------------------------------------

    def followed_partitions(self, snapshot: ClusterMetadata) -> dict[tuple[str, int],
                                                                     tuple[int, int]]:
        """The partitions this broker follows: assigned here, led by another broker (not
        -1), with (leader, leader epoch)."""
        followed = {}
        offline = self._manager.offline_partitions()
        for key, state in snapshot.states.items():
            topic = snapshot.topics.get(key[0])
            if (topic is None or not 0 <= key[1] < topic.partition_count or key in offline
                    or self.broker_id not in topic.replicas[key[1]]
                    or state.leader in (self.broker_id, NO_LEADER)):
                continue
            followed[key] = (state.leader, state.leader_epoch)
        return followed

    async def _apply_follower_states(self, snapshot: ClusterMetadata) -> None:
        """Create the logs of followed partitions and hand them to the replica fetchers,
        which stop fetching every partition not followed any more (one this broker is about
        to lead among them) before this returns."""
        if self.fetchers is None:
            return
        followed = self.followed_partitions(snapshot)
        await self._create_missing_logs(snapshot, set(followed))
        await self.fetchers.follow(followed)

    def _has_log(self, key: tuple[str, int]) -> bool:
        try:
            self._manager.get_log(*key)
            return True
        except KafkaError:
            return False

    def _set_served(self, served: Partitions) -> None:
        gained, lost = served - self.served, self.served - served
        self.served = served
        if gained or lost:
            log.info("broker %d now leads %d partitions (gained %d, lost %d)", self.broker_id,
                     len(served), len(gained), len(lost))
            for listener in self.listeners:
                listener(frozenset(gained), frozenset(lost))

    async def _delete_topics_not_in(self, snapshot: ClusterMetadata) -> None:
        for name, info in self._manager.topics().items():
            cluster_topic = snapshot.topics.get(name)
            if cluster_topic is not None and cluster_topic.topic_id == info.topic_id:
                continue
            why = ("it is not in the cluster's metadata (deleted, or a stray)"
                   if cluster_topic is None else
                   f"its id {info.topic_id} is not the cluster's {cluster_topic.topic_id}")
            log.warning("deleting the local logs of topic %s: %s", name, why)
            self._set_served(frozenset(key for key in self.served if key[0] != name))
            if self.fetchers is not None:
                await self.fetchers.unfollow_topic(name)
            self._applied_configs.pop(name, None)
            await self._run_append(self._manager.delete_topic, name)

    async def _create_missing_logs(self, snapshot: ClusterMetadata, wanted: set) -> None:
        missing: dict[str, list[int]] = {}
        offline = self._manager.offline_partitions()
        for key in sorted(wanted):
            if not self._has_log(key) and key not in offline:
                missing.setdefault(key[0], []).append(key[1])
        for name, partitions in missing.items():
            topic = snapshot.topics[name]
            try:
                await self._run_append(self._manager.create_local_partitions, name,
                                       topic.topic_id, partitions, topic.partition_count,
                                       dict(topic.configs))
                self._applied_configs[name] = dict(topic.configs)
            except KafkaError as error:
                log.error("cannot create the logs of %s partitions %s: %s", name, partitions,
                          error)

    async def _apply_configs(self, snapshot: ClusterMetadata) -> None:
        local_topics = self._manager.topics()
        for name, topic in snapshot.topics.items():
            configs = dict(topic.configs)
            if name not in local_topics or self._applied_configs.get(name) == configs:
                continue
            try:
                if validate_topic_overrides(dict(configs)) != local_topics[name].overrides:
                    await asyncio.to_thread(self._manager.alter_topic_config, name, configs)
                self._applied_configs[name] = configs
            except KafkaError as error:
                log.error("cannot apply the config of topic %s from ZooKeeper: %s", name, error)
