"""InitProducerId (key 22), versions 0-6: producer ids for idempotent and transactional
producers.

Without a ``transactional_id`` every call allocates a fresh producer id with epoch 0 from the
broker's persisted allocator, as Kafka does. With one, the transaction coordinator answers
(``broker.transactions``): the id's producer id with its epoch bumped, fencing older
producers; an ongoing transaction is aborted first (CONCURRENT_TRANSACTIONS, the client
retries); a ``transaction_timeout_ms`` above ``transaction.max.timeout.ms`` is
INVALID_TRANSACTION_TIMEOUT; v3+ carry the producer's current id and epoch (PRODUCER_FENCED
when stale). Event loop thread; the allocator persists a block of 1000 ids at a time, and
taking the first id of a new block (an fsync) runs on a worker thread here.
"""

from __future__ import annotations

import asyncio

from headrace.coordinator.transaction_messages import InitProducerIdRequest
from headrace.protocol.wire import milliseconds

API_KEY = 22
MIN_VERSION = 0
MAX_VERSION = 6


def _answer(ctx, error_code: int, producer_id: int, producer_epoch: int):
    return ctx.respond({
        "error_code": error_code, "producer_id": producer_id, "producer_epoch": producer_epoch,
        "ongoing_txn_producer_id": -1, "ongoing_txn_producer_epoch": -1,
    })


async def handle(ctx, request):
    if request.transactional_id is not None:
        response = await ctx.broker.transactions.call(InitProducerIdRequest(
            request.transactional_id, milliseconds(request.transaction_timeout),
            getattr(request, "producer_id", -1), getattr(request, "producer_epoch", -1)))
        return _answer(ctx, response.error_code, response.producer_id, response.producer_epoch)
    allocator = ctx.broker.producer_ids
    producer_id = allocator.next_id_without_io()
    if producer_id is None:
        producer_id = await asyncio.to_thread(allocator.next_id)
    return _answer(ctx, 0, producer_id, 0)
