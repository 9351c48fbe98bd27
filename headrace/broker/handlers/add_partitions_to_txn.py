"""AddPartitionsToTxn (key 24), versions 0-3: a transactional producer adds the partitions
it is about to write to its ongoing transaction.

The client form (Kafka's v0-3 fields, named ``v3_and_below_*`` by kio); v4+ are Kafka's
batched broker-to-broker form and are not offered. The transaction coordinator checks the
producer (INVALID_PRODUCER_ID_MAPPING, PRODUCER_FENCED, CONCURRENT_TRANSACTIONS...) and
answers once the transaction's new partitions are stored in ``__transaction_state``; every
partition of the request gets the one outcome. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.transaction_messages import AddPartitionsToTxnRequest

API_KEY = 24
MIN_VERSION = 0
MAX_VERSION = 3


async def handle(ctx, request):
    partitions = tuple((topic.name, index) for topic in request.v3_and_below_topics
                       for index in topic.partitions)
    response = await ctx.broker.transactions.call(AddPartitionsToTxnRequest(
        request.v3_and_below_transactional_id, request.v3_and_below_producer_id,
        request.v3_and_below_producer_epoch, partitions))
    errors = response.partition_errors
    return ctx.respond({"throttle_time": 0, "results_by_topic_v3_and_below": [
        {"name": topic.name, "results_by_partition": [
            {"partition_index": index, "partition_error_code": errors.get((topic.name, index), 0)}
            for index in topic.partitions]}
        for topic in request.v3_and_below_topics]})
