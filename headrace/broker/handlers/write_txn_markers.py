"""WriteTxnMarkers (key 27), version 1: a transaction coordinator asks this broker, the
leader of the partitions, to write commit or abort markers (broker to broker in a cluster;
this broker's own coordinator writes its markers directly).

Each marker is written through ``Log.append_transaction_marker`` on the append thread, as the
coordinator's own are: INVALID_PRODUCER_EPOCH for an epoch older than the producer's,
TRANSACTION_COORDINATOR_FENCED for an older coordinator epoch, UNKNOWN_TOPIC_OR_PARTITION for
a partition not held here; a marker on ``__consumer_offsets`` also commits or drops the
producer's pending transactional offsets. Kafka's v0 (not flexible) is not offered: kio lacks
it. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.transaction_messages import WriteTxnMarkers

API_KEY = 27
MIN_VERSION = 1
MAX_VERSION = 1


async def handle(ctx, request):
    results = []
    for marker in request.markers:
        partitions = tuple((topic.name, index) for topic in marker.topics
                           for index in topic.partition_indexes)
        partition_errors = await ctx.broker.transactions.write_markers(WriteTxnMarkers(
            0, marker.producer_id, marker.producer_epoch, bool(marker.transaction_result),
            marker.coordinator_epoch, partitions))
        results.append({"producer_id": marker.producer_id, "topics": [
            {"name": topic.name, "partitions": [
                {"partition_index": index, "error_code": partition_errors[(topic.name, index)]}
                for index in topic.partition_indexes]}
            for topic in marker.topics]})
    return ctx.respond({"markers": results})
