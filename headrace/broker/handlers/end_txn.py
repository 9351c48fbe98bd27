"""EndTxn (key 26), versions 0-4: commit or abort a producer's ongoing transaction.

The transaction coordinator stores PrepareCommit / PrepareAbort and answers; the markers then
go to every partition of the transaction, retried until written, and CompleteCommit /
CompleteAbort is stored (until then the id answers CONCURRENT_TRANSACTIONS). A retry of a
completed EndTxn answers NONE; the other outcome INVALID_TXN_STATE. v5 (transaction version
2, an epoch bump per transaction) is not offered. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.transaction_messages import EndTxnRequest

API_KEY = 26
MIN_VERSION = 0
MAX_VERSION = 4


async def handle(ctx, request):
    response = await ctx.broker.transactions.call(EndTxnRequest(
        request.transactional_id, request.producer_id, request.producer_epoch,
        bool(request.committed)))
    return ctx.respond({"throttle_time": 0, "error_code": response.error_code})
