"""AddOffsetsToTxn (key 25), versions 0-4: a transactional producer announces it will commit
a consumer group's offsets in its transaction (``send_offsets_to_transaction``).

The transaction coordinator adds the group's ``__consumer_offsets`` partition to the
transaction, with AddPartitionsToTxn's checks and errors. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.transaction_messages import AddOffsetsToTxnRequest

API_KEY = 25
MIN_VERSION = 0
MAX_VERSION = 4


async def handle(ctx, request):
    response = await ctx.broker.transactions.call(AddOffsetsToTxnRequest(
        request.transactional_id, request.producer_id, request.producer_epoch,
        request.group_id))
    return ctx.respond({"throttle_time": 0, "error_code": response.error_code})
