"""What request handlers see of the logs in cluster mode: the partitions this broker leads.

Owns ``ServedLogs``, which stands in for the ``LogManager`` in ``BrokerState.log_manager``
when the broker is in a cluster, so every handler routes as Kafka's brokers do without a
change of its own:

* ``get_log(topic, p)``: the local log when this broker leads and holds it
  (``ReplicaManager.served``); NOT_LEADER_OR_FOLLOWER when the cluster has the partition but
  another broker (or none: leader -1) leads it, so clients refresh their metadata and go
  there; UNKNOWN_TOPIC_OR_PARTITION when the cluster has no such topic or partition. Kafka's
  brokers answer every data request (Produce of every version, Fetch, ListOffsets,
  DeleteRecords) with the same code 6 (NOT_LEADER_FOR_PARTITION before Kafka 2.6).
* ``topic(name)`` / ``topics()``: the cluster's topics (id and partition count from
  ZooKeeper), with the local log config when this broker holds the topic, else the topic's
  ZooKeeper overrides over the broker defaults.
* Creating, deleting, extending and reconfiguring topics is the controller's work, through
  ZooKeeper: those calls raise NOT_CONTROLLER here, so no handler changes the local logs
  behind the cluster's back. Everything else (log dirs, maintenance, shutdown) is the log
  manager's, delegated.

Thread-safety: reads an immutable metadata snapshot and the replica manager's ``served``
set, both replaced, never mutated: safe from the loop and the append thread.
"""

from __future__ import annotations

from headrace.cluster.metadata_cache import MetadataCache
from headrace.cluster.replica_manager import ReplicaManager
from headrace.errors import NotController, NotLeaderOrFollower, UnknownTopicOrPartition
from headrace.storage.config import LogConfig
from headrace.storage.manager import TopicInfo

_CONTROLLER_ONLY = ("create_topic", "delete_topic", "add_partitions", "alter_topic_config")


class ServedLogs:
    def __init__(self, log_manager, cache: MetadataCache, replicas: ReplicaManager) -> None:
        self.log_manager = log_manager
        self._cache = cache
        self._replicas = replicas
        self._topics_memo: tuple[object, object, dict[str, TopicInfo]] | None = None

    def get_log(self, topic: str, partition: int):
        if (topic, partition) in self._replicas.served:
            return self.log_manager.get_log(topic, partition)
        metadata = self._cache.current
        cluster_topic = metadata.topics.get(topic)
        if cluster_topic is None or not 0 <= partition < cluster_topic.partition_count:
            raise UnknownTopicOrPartition(f"Unknown topic-partition {topic}-{partition}")
        raise NotLeaderOrFollower(
            f"broker {self._replicas.broker_id} is not the leader of {topic}-{partition} "
            f"(leader: {metadata.leader_of(topic, partition)})")

    def topic(self, name: str) -> TopicInfo:
        """One cluster topic (a fetch by topic id asks for one per request: no full scan)."""
        cluster_topic = self._cache.current.topics.get(name)
        if cluster_topic is None:
            raise UnknownTopicOrPartition(f"Unknown topic {name}")
        try:
            local_topic = self.log_manager.topic(name)
        except UnknownTopicOrPartition:
            local_topic = None
        return self._topic_info(cluster_topic, local_topic)

    def topics(self) -> dict[str, TopicInfo]:
        """The cluster's topics; rebuilt only when the metadata or the local topics change."""
        metadata, local = self._cache.current, self.log_manager.topics()
        memo = self._topics_memo
        if memo is not None and memo[0] is metadata and memo[1] == local:
            return dict(memo[2])
        topics = {name: self._topic_info(cluster_topic, local.get(name))
                  for name, cluster_topic in metadata.topics.items()}
        self._topics_memo = (metadata, local, topics)
        return dict(topics)

    def _topic_info(self, cluster_topic, local_topic: TopicInfo | None) -> TopicInfo:
        """The local log config when this broker holds the topic, else ZooKeeper's overrides
        over the broker defaults."""
        if local_topic is not None:
            config, overrides = local_topic.config, local_topic.overrides
        else:
            overrides = dict(cluster_topic.configs)
            config = LogConfig.from_properties(overrides, self.log_manager.broker_properties)
        return TopicInfo(cluster_topic.name, cluster_topic.topic_id,
                         cluster_topic.partition_count, config, overrides)

    def __getattr__(self, name: str):
        if name in _CONTROLLER_ONLY:
            raise NotController(f"{name} is done by the controller in a cluster")
        return getattr(self.log_manager, name)
