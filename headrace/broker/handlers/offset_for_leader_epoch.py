"""OffsetForLeaderEpoch (key 23), versions 2-4 (Kafka 4.x's; KIP-896 removed 0-1): the end
offset of a leader epoch, as this partition's leader knows it (KIP-101, KIP-279, KIP-320).

For each partition, as Kafka's ``Partition.lastOffsetForLeaderEpoch`` (always asked of the
leader: followers truncating by epoch, consumers detecting log truncation):

* ``current_leader_epoch`` (-1: no check) against the partition's leader epoch first, for a
  partition hosted here: older is FENCED_LEADER_EPOCH, newer UNKNOWN_LEADER_EPOCH;
* then the leader: NOT_LEADER_OR_FOLLOWER when another broker leads it,
  UNKNOWN_TOPIC_OR_PARTITION when the cluster has no such partition, KAFKA_STORAGE_ERROR when
  its log is offline;
* then ``Log.leader_epoch_cache.end_offset_for(leader_epoch)``: the largest epoch <= the one
  asked and the offset where it ends (the log end offset for the latest epoch, else the start
  offset of the next epoch); -1/-1 (UNDEFINED, no error) when the cache knows no answer.

``replica_id`` (v3+: a follower's broker id, -1 a consumer, -2 a debugging tool) changes
nothing here: Kafka answers every caller from the leader only. A single node leads every
partition it holds at epoch 0 (what Metadata advertises), so its epoch check is against 0.
Errors leave ``leader_epoch`` and ``end_offset`` at -1.

Event loop thread; the epoch cache is read under its own lock, safe against appends.
"""

from __future__ import annotations

from headrace.broker.cluster_service import check_current_leader_epoch
from headrace.errors import KafkaError, NotLeaderOrFollower

API_KEY = 23
MIN_VERSION = 2
MAX_VERSION = 4

UNDEFINED_EPOCH = -1
UNDEFINED_EPOCH_OFFSET = -1
SINGLE_NODE_LEADER_EPOCH = 0


def _leader_log(broker, topic: str, partition):
    """The partition's log when this broker leads it at the epoch the caller names."""
    index, current = partition.partition, partition.current_leader_epoch
    cluster = broker.cluster
    if cluster is None:
        log = broker.log_manager.get_log(topic, index)
        check_current_leader_epoch(topic, index, current, SINGLE_NODE_LEADER_EPOCH)
        return log
    try:
        log = broker.log_manager.get_log(topic, index)
    except NotLeaderOrFollower:
        if cluster.hosts_replica(topic, index):  # a follower checks the epoch first
            cluster.check_leader_epoch(topic, index, current)
        raise
    cluster.check_leader_epoch(topic, index, current)
    return log


def _end_offset(broker, topic: str, partition) -> dict:
    index = partition.partition
    try:
        log = _leader_log(broker, topic, partition)
        epoch, end_offset = log.leader_epoch_cache.end_offset_for(partition.leader_epoch)
    except KafkaError as error:
        return {"error_code": error.code, "partition": index, "leader_epoch": UNDEFINED_EPOCH,
                "end_offset": UNDEFINED_EPOCH_OFFSET}
    if end_offset == UNDEFINED_EPOCH_OFFSET:
        epoch = UNDEFINED_EPOCH
    return {"error_code": 0, "partition": index, "leader_epoch": epoch,
            "end_offset": end_offset}


async def handle(ctx, request):
    return ctx.respond({
        "throttle_time": 0,
        "topics": [{"topic": topic.topic,
                    "partitions": [_end_offset(ctx.broker, topic.topic, partition)
                                   for partition in topic.partitions]}
                   for topic in request.topics],
    })
