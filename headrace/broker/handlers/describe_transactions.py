"""DescribeTransactions (key 65), version 0: state, producer id and epoch, timeout, start time
and partitions of each transactional id (TRANSACTIONAL_ID_NOT_FOUND for one not held,
INVALID_REQUEST for an empty one, as Kafka's). Event loop thread.
"""

from __future__ import annotations

import datetime

from headrace.coordinator.transaction_messages import DescribeTransactionsRequest

API_KEY = 65
MIN_VERSION = 0
MAX_VERSION = 0

_UNIX_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)


def _start_time(start_ms: int) -> datetime.datetime:
    """kio's non-nullable timestamp for ``start_ms``, -1 (no transaction) included."""
    return _UNIX_EPOCH + datetime.timedelta(milliseconds=start_ms)


def _topics(partitions) -> list[dict]:
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    return [{"topic": topic, "partitions": ids} for topic, ids in by_topic.items()]


async def handle(ctx, request):
    response = await ctx.broker.transactions.call(
        DescribeTransactionsRequest(tuple(request.transactional_ids)))
    return ctx.respond({"throttle_time": 0, "transaction_states": [
        {"error_code": t.error_code, "transactional_id": t.transactional_id,
         "transaction_state": t.transaction_state, "transaction_timeout": t.transaction_timeout_ms,
         "transaction_start_time": _start_time(t.transaction_start_time_ms),
         "producer_id": t.producer_id,
         "producer_epoch": t.producer_epoch, "topics": _topics(t.partitions)}
        for t in response.transactions]})
