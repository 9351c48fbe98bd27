"""JoinGroup (key 11), versions 0-9: join or rejoin a classic consumer group.

Translates kio's request into ``coordinator.messages.JoinGroupRequest`` and waits (parked in
the group service) until the rebalance completes. v0 has no rebalance timeout: the session
timeout stands in, as in Kafka. v4+ requires a known member id (MEMBER_ID_REQUIRED
handshake); v5+ carries group.instance.id (static membership); v9 skip_assignment.
Event loop thread.
"""

from __future__ import annotations

from headrace.coordinator.messages import JoinGroupRequest
from headrace.protocol.wire import milliseconds

API_KEY = 11
MIN_VERSION = 0
MAX_VERSION = 9

REQUIRE_KNOWN_MEMBER_ID_VERSION = 4
SKIP_ASSIGNMENT_VERSION = 9  # KIP-814: a static leader rejoining may skip assignment


def _to_coordinator(ctx, request) -> JoinGroupRequest:
    session_timeout_ms = milliseconds(request.session_timeout)
    rebalance_timeout = getattr(request, "rebalance_timeout", None)
    return JoinGroupRequest(
        group_id=request.group_id,
        member_id=request.member_id,
        protocol_type=request.protocol_type,
        protocols=tuple((p.name, bytes(p.metadata)) for p in request.protocols),
        session_timeout_ms=session_timeout_ms,
        rebalance_timeout_ms=(milliseconds(rebalance_timeout) if rebalance_timeout is not None
                              else session_timeout_ms),
        group_instance_id=getattr(request, "group_instance_id", None),
        client_id=ctx.header.client_id or "",
        client_host=ctx.client_host,
        require_known_member_id=ctx.api_version >= REQUIRE_KNOWN_MEMBER_ID_VERSION,
        supports_skip_assignment=ctx.api_version >= SKIP_ASSIGNMENT_VERSION,
    )


async def handle(ctx, request):
    response = await ctx.broker.groups.call(_to_coordinator(ctx, request))
    return ctx.respond({
        "throttle_time": 0,
        "error_code": response.error_code,
        "generation_id": response.generation_id,
        "protocol_type": response.protocol_type,
        "protocol_name": response.protocol_name if ctx.api_version >= 7
        else response.protocol_name or "",
        "leader": response.leader,
        "skip_assignment": response.skip_assignment,
        "member_id": response.member_id,
        "members": [{"member_id": m.member_id, "group_instance_id": m.group_instance_id,
                     "metadata": m.metadata} for m in response.members],
    })
