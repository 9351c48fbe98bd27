"""ApiVersions (key 18), versions 0-4: the API table, derived from the handler modules.

Unsupported ApiVersions versions never reach this module: the connection answers them with a
v0 body carrying UNSUPPORTED_VERSION (see connection.py). Stateless; event loop thread.
"""

from __future__ import annotations

API_KEY = 18
MIN_VERSION = 0
MAX_VERSION = 4


async def handle(ctx, request):
    from headrace.broker.handlers import HANDLERS  # the table imports this module

    return ctx.respond({
        "error_code": 0,
        "api_keys": [
            {"api_key": h.api_key, "min_version": h.min_version, "max_version": h.max_version}
            for h in HANDLERS.values()
        ],
        "throttle_time": 0,
        "finalized_features_epoch": -1,
    })
