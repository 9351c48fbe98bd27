"""DeleteRecords (api key 21): advance partitions' log start offsets.

Per partition, as Kafka's ReplicaManager/Partition.deleteRecordsOnLeader: offset -1 means the
high watermark; a negative offset or one beyond the high watermark is OFFSET_OUT_OF_RANGE; a
topic whose cleanup.policy lacks "delete" is POLICY_VIOLATION; an unknown topic or partition
is UNKNOWN_TOPIC_OR_PARTITION. The answer's low watermark is the log start offset afterwards
(-1 on error). On a single node there are no replicas to wait for, so the timeout is unused;
in a cluster the leader answers once every replica on a live broker reports a log start at
or past the offset (Kafka's DelayedDeleteRecords: the low watermark, followers report theirs
in their fetches), REQUEST_TIMED_OUT after the request's timeout.
Runs on the event loop thread; ``Log.delete_records_before`` runs on the broker's append
thread.
"""

from __future__ import annotations

import asyncio
from typing import Any

from headrace.errors import KafkaError, OffsetOutOfRange, PolicyViolation, error_for_code
from headrace.protocol import wire

API_KEY = 21
MIN_VERSION = 0
MAX_VERSION = 2

HIGH_WATERMARK_OFFSET = -1
UNKNOWN_LOW_WATERMARK = -1


async def _delete_before(broker: Any, log: Any, requested_offset: int) -> int:
    where = f"{log.topic}-{log.partition}"
    if not log.config.delete_enabled:
        raise PolicyViolation(
            f"Records of partition {where} can not be deleted due to the configured policy"
        )
    high_watermark = log.high_watermark
    offset = high_watermark if requested_offset == HIGH_WATERMARK_OFFSET else requested_offset
    if offset < 0:
        raise OffsetOutOfRange(f"The offset {offset} for partition {where} should not be negative.")
    if offset > high_watermark:
        raise OffsetOutOfRange(
            f"The offset {offset} for partition {where} should not be larger than the high "
            f"watermark {high_watermark}"
        )
    return await broker.run_append(log.delete_records_before, offset)


async def _partition_result(broker: Any, topic: str, partition: Any,
                            timeout_ms: int) -> dict[str, Any]:
    result = {"partition_index": partition.partition_index, "error_code": 0}
    try:
        log = broker.log_manager.get_log(topic, partition.partition_index)
        low_watermark = await _delete_before(broker, log, partition.offset)
        if broker.cluster is not None:
            await _replicated(broker.cluster.leader_replicas, log, low_watermark, timeout_ms)
        result["low_watermark"] = low_watermark
    except KafkaError as error:
        result.update(low_watermark=UNKNOWN_LOW_WATERMARK, error_code=error.code)
    return result


async def _replicated(replication, log: Any, offset: int, timeout_ms: int) -> None:
    leader = replication.leaders.get((log.topic, log.partition))
    if leader is None or not leader.replicated:
        return
    code = await replication.wait_for_low_watermark(log.topic, log.partition, offset,
                                                    timeout_ms)
    if code:
        raise error_for_code(code, f"the replicas of {log.topic}-{log.partition} did not "
                                   f"delete the records below {offset}")


async def handle(ctx, request):
    timeout_ms = wire.milliseconds(request.timeout)
    results = iter(await asyncio.gather(*(  # every partition waits for its replicas at once
        _partition_result(ctx.broker, topic.name, partition, timeout_ms)
        for topic in request.topics for partition in topic.partitions)))
    topics = [{"name": topic.name, "partitions": [next(results) for _ in topic.partitions]}
              for topic in request.topics]
    return ctx.respond({"throttle_time": 0, "topics": topics})
