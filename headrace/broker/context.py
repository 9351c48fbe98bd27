"""What a request handler sees: the request header, the broker's state, and the clock.

Owns ``RequestContext`` (one per request) and ``RawResponse`` (a response made of bytes and
file slices, written with sendfile). A context lives for one request on the event loop
thread; it is not shared between threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headrace.protocol import wire
from headrace.protocol.wire import RequestHeader


@dataclass(frozen=True, slots=True)
class RawResponse:
    """A response body already encoded: ``parts`` are bytes or storage FileSlices, sent in
    order after the response header; ``size_bytes`` is their total length."""

    parts: tuple[Any, ...]
    size_bytes: int


@dataclass(slots=True)
class RequestContext:
    header: RequestHeader
    broker: Any  # headrace.broker.state.BrokerState
    now_ms: int
    client_host: str = ""

    @property
    def api_version(self) -> int:
        return self.header.api_version

    @property
    def response_class(self) -> type:
        return wire.response_class(self.header.api_key, self.header.api_version)

    def respond(self, values: dict[str, Any]) -> Any:
        """The kio response of this request's version built from plain values."""
        return wire.build(self.response_class, values)
