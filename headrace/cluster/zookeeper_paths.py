"""Kafka's znode paths in ZooKeeper mode, as Kafka 3.x lays them out (core's ``ZkData.scala``).

Owns path names only (relative to the ``zookeeper.connect`` chroot); the JSON held at each path
is encoded by ``zookeeper_records`` (topics, partition states, controller) and, for broker
registrations and the cluster id, by ``zookeeper_session``. Pure constants and functions;
thread-safe.
"""

from __future__ import annotations

BROKERS = "/brokers"
BROKER_IDS = "/brokers/ids"
TOPICS = "/brokers/topics"
BROKER_SEQUENCE_ID = "/brokers/seqid"
CONTROLLER = "/controller"
CONTROLLER_EPOCH = "/controller_epoch"
CONFIG = "/config"
CONFIG_CHANGES = "/config/changes"
CONFIG_CHANGE_PREFIX = "config_change_"
CONFIG_TOPICS = "/config/topics"
CONFIG_BROKERS = "/config/brokers"
ADMIN = "/admin"
DELETE_TOPICS = "/admin/delete_topics"
PREFERRED_REPLICA_ELECTION = "/admin/preferred_replica_election"
REASSIGN_PARTITIONS = "/admin/reassign_partitions"
ISR_CHANGE_NOTIFICATION = "/isr_change_notification"
ISR_CHANGE_PREFIX = "isr_change_"
CLUSTER = "/cluster"
CLUSTER_ID = "/cluster/id"
LATEST_PRODUCER_ID_BLOCK = "/latest_producer_id_block"
LOG_DIR_EVENT_NOTIFICATION = "/log_dir_event_notification"
CONSUMERS = "/consumers"

# Persistent paths a Kafka broker creates at start-up when missing (``ZkData.PersistentZkPaths``).
PERSISTENT_PATHS = (
    CONSUMERS,
    BROKER_IDS,
    TOPICS,
    CONFIG_CHANGES,
    DELETE_TOPICS,
    BROKER_SEQUENCE_ID,
    ISR_CHANGE_NOTIFICATION,
    LATEST_PRODUCER_ID_BLOCK,
    LOG_DIR_EVENT_NOTIFICATION,
    CONFIG_TOPICS,
    "/config/clients",
    "/config/users",
    CONFIG_BROKERS,
    "/config/ips",
)


def broker_id_path(broker_id: int) -> str:
    """``/brokers/ids/<id>``: the broker's ephemeral registration."""
    return f"{BROKER_IDS}/{broker_id}"


def topic_path(topic: str) -> str:
    """``/brokers/topics/<t>``: the topic's replica assignment."""
    return f"{TOPICS}/{topic}"


def topic_partitions_path(topic: str) -> str:
    return f"{TOPICS}/{topic}/partitions"


def partition_path(topic: str, partition: int) -> str:
    return f"{TOPICS}/{topic}/partitions/{partition}"


def partition_state_path(topic: str, partition: int) -> str:
    """``/brokers/topics/<t>/partitions/<p>/state``: leader, leader epoch, ISR."""
    return f"{TOPICS}/{topic}/partitions/{partition}/state"


def topic_config_path(topic: str) -> str:
    """``/config/topics/<t>``: the topic's config overrides."""
    return f"{CONFIG_TOPICS}/{topic}"


def broker_config_path(entity: str) -> str:
    """``/config/brokers/<id>`` (``<default>`` for the cluster-wide default)."""
    return f"{CONFIG_BROKERS}/{entity}"


def config_change_path_prefix() -> str:
    """Prefix for the sequential ``/config/changes/config_change_<seq>`` notifications."""
    return f"{CONFIG_CHANGES}/{CONFIG_CHANGE_PREFIX}"


def delete_topic_path(topic: str) -> str:
    """``/admin/delete_topics/<t>``: a pending topic deletion."""
    return f"{DELETE_TOPICS}/{topic}"


def isr_change_path_prefix() -> str:
    return f"{ISR_CHANGE_NOTIFICATION}/{ISR_CHANGE_PREFIX}"
