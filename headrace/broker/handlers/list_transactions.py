"""ListTransactions (key 66), versions 0-1: the transactional ids this coordinator holds,
filtered by state names (unknown names are listed back in ``unknown_state_filters``),
producer ids and, v1+, by running longer than ``duration_filter`` ms. While a
``__transaction_state`` partition loads: COORDINATOR_LOAD_IN_PROGRESS. Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.transaction_messages import ListTransactionsRequest

API_KEY = 66
MIN_VERSION = 0
MAX_VERSION = 1


async def handle(ctx, request):
    response = await ctx.broker.transactions.call(ListTransactionsRequest(
        tuple(request.state_filters), tuple(request.producer_id_filters),
        getattr(request, "duration_filter", -1)))
    return ctx.respond({
        "throttle_time": 0, "error_code": response.error_code,
        "unknown_state_filters": list(response.unknown_state_filters),
        "transaction_states": [
            {"transactional_id": t.transactional_id, "producer_id": t.producer_id,
             "transaction_state": t.transaction_state} for t in response.transactions]})
