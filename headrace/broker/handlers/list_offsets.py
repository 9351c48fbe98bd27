"""ListOffsets (key 2), versions 1-7: offsets by time.

Timestamps: -2 earliest (log start offset), -1 latest (log end offset = high watermark =
last stable offset on one node, so read_committed sees the same), -3 the record with the
largest timestamp (v7+), or a time in ms: the first offset whose timestamp is >= it, or
offset -1 / timestamp -1 when there is none. Errors per partition (UNKNOWN_TOPIC_OR_PARTITION).
Event loop thread; ``Log.offset_for_timestamp`` is safe to call concurrently with appends.
"""

from __future__ import annotations

from headrace.errors import KafkaError

API_KEY = 2
MIN_VERSION = 1
MAX_VERSION = 7

EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1


def _partition(manager, topic: str, partition) -> dict:
    index = partition.partition_index
    try:
        log = manager.get_log(topic, index)
        found = log.offset_for_timestamp(partition.timestamp)
    except KafkaError as error:
        return {"partition_index": index, "error_code": error.code, "timestamp": -1,
                "offset": -1, "leader_epoch": -1}
    if found is None:
        offset, timestamp = -1, -1
    else:
        offset, timestamp = found
    if partition.timestamp in (EARLIEST_TIMESTAMP, LATEST_TIMESTAMP):
        timestamp = -1
    return {"partition_index": index, "error_code": 0, "timestamp": timestamp,
            "offset": offset, "leader_epoch": 0}


async def handle(ctx, request):
    manager = ctx.broker.log_manager
    return ctx.respond({
        "throttle_time": 0,
        "topics": [
            {"name": topic.name,
             "partitions": [_partition(manager, topic.name, p) for p in topic.partitions]}
            for topic in request.topics
        ],
    })
