"""InitProducerId (key 22), versions 0-6, for idempotent (non-transactional) producers.

Every call allocates a fresh producer id with epoch 0 from the broker's persisted allocator,
as Kafka does when ``transactional_id`` is null. Transactions are not supported: a request
with a transactional id gets TRANSACTIONAL_ID_AUTHORIZATION_FAILED, a non-retriable error
that tells the client at once. Event loop thread; the allocator persists a block of 1000 ids
at a time, and taking the first id of a new block (an fsync) runs on a worker thread.
"""

from __future__ import annotations

import asyncio

from headrace.errors import TransactionalIdAuthorizationFailed

API_KEY = 22
MIN_VERSION = 0
MAX_VERSION = 6


async def handle(ctx, request):
    if request.transactional_id is not None:
        return ctx.respond({
            "error_code": TransactionalIdAuthorizationFailed.code,
            "producer_id": -1, "producer_epoch": -1,
            "ongoing_txn_producer_id": -1, "ongoing_txn_producer_epoch": -1,
        })
    allocator = ctx.broker.producer_ids
    producer_id = allocator.next_id_without_io()
    if producer_id is None:
        producer_id = await asyncio.to_thread(allocator.next_id)
    return ctx.respond({
        "error_code": 0, "producer_id": producer_id, "producer_epoch": 0,
        "ongoing_txn_producer_id": -1, "ongoing_txn_producer_epoch": -1,
    })
