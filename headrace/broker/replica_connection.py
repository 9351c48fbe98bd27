"""One asyncio wire connection from a follower to a partition leader: ``ReplicaConnection``.

Owns the socket of a replica fetcher (``headrace.broker.replica_fetcher``): requests are
kio entities built from plain values and framed by ``headrace.protocol.wire`` (request header
v1, or v2 for flexible versions), one request in flight at a time, each round trip bounded by
``replica.socket.timeout.ms`` (``TimeoutError``; bounded with ``asyncio.timeout``, never
``asyncio.wait_for``, which on Python 3.11 swallows a cancellation that arrives as the
response does: the fetcher being stopped would carry on for ever); a response announcing more than
``max_response_bytes`` or a negative size, or carrying another correlation id, closes the
connection (``ReplicaConnectionError``): its byte stream can no longer be trusted. The broker
layer may not import ``headrace.client``, so this is the loop-side twin of its blocking
``BrokerConnection``, built on the same sans-I/O codec.

Responses are received straight into buffers (``wire.FrameReceiver`` behind an asyncio
``BufferedProtocol``): a large response -- a Fetch of megabytes -- lands in one pooled region
with no copy in user space, and ``request_frame`` hands it out as a ``memoryview`` that the
fetcher parses without copying (``fetch_response.decode_fetch_response``) and appends from.
The region is reused for a later response only once every view of it is released.

Event loop thread only; one fetcher owns one connection.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from headrace.errors import KafkaError
from headrace.protocol import wire

FRAME_LENGTH_BYTES = 4
KEPT_RESPONSE_REGIONS = 1  # one request in flight: one response region to reuse
_INT32 = struct.Struct(">i")


class ReplicaConnectionError(KafkaError):
    """The leader answered something a follower cannot use; the connection is closed."""


class _ResponseProtocol(asyncio.BufferedProtocol):
    """Receives response frames into a ``wire.FrameReceiver``; wakes the waiting request."""

    def __init__(self, max_response_bytes: int) -> None:
        self.receiver = wire.FrameReceiver(max_response_bytes, wire.large_frame_region_pool(
            KEPT_RESPONSE_REGIONS, max_kept_region_bytes=max_response_bytes))
        self.transport: asyncio.Transport | None = None
        self.error: BaseException | None = None  # set once: the connection is done
        self._waiter: asyncio.Future | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.receiver.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        try:
            self.receiver.buffer_updated(nbytes)
        except (wire.FrameTooLarge, wire.MalformedFrame) as error:
            self._fail(ReplicaConnectionError(f"unusable response: {error}"))
            return
        self._wake()

    def eof_received(self) -> bool:
        self._fail(asyncio.IncompleteReadError(b"", self.receiver.partial_frame_bytes or None))
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or asyncio.IncompleteReadError(b"", None))

    def _fail(self, error: BaseException) -> None:
        if self.error is None:
            self.error = error
        if self.transport is not None:
            self.transport.close()
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def next_frame(self) -> bytes | memoryview:
        while True:
            frame = self.receiver.next_frame()
            if frame is not None:
                return frame
            if self.error is not None:
                raise self.error
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None


class ReplicaConnection:
    def __init__(self, host: str, port: int, client_id: str, socket_timeout_ms: int,
                 max_response_bytes: int) -> None:
        self.host, self.port = host, port
        self._client_id = client_id
        self._timeout_s = socket_timeout_ms / 1000
        self._max_response_bytes = max_response_bytes
        self._transport: asyncio.Transport | None = None
        self._protocol: _ResponseProtocol | None = None
        self._correlation_id = 0

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self._timeout_s):
            self._transport, self._protocol = await loop.create_connection(
                lambda: _ResponseProtocol(self._max_response_bytes), self.host, self.port)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
        self._transport = self._protocol = None

    async def request(self, api_key: int, api_version: int, values: dict[str, Any]) -> Any:
        """Send one request and return its decoded response body; OSError (incl.
        TimeoutError), EOFError or ReplicaConnectionError close the connection."""
        frame = await self.request_frame(api_key, api_version, values)
        try:
            return wire.decode_response(api_key, api_version, frame)[1]
        except Exception as error:  # kio's decode errors: the stream is not Kafka's
            self.close()
            raise ReplicaConnectionError(f"undecodable response from {self.host}:{self.port}: "
                                         f"{error!r}") from None

    async def request_frame(self, api_key: int, api_version: int, values: dict[str, Any]
                            ) -> bytes | memoryview:
        """Send one request and return its response frame (correlation id checked, still
        at its start), undecoded; errors as ``request``."""
        try:
            async with asyncio.timeout(self._timeout_s):
                return await self._round_trip(api_key, api_version, values)
        except BaseException:
            self.close()
            raise

    async def _round_trip(self, api_key: int, api_version: int, values: dict[str, Any]
                          ) -> bytes | memoryview:
        if not self.is_open:
            raise ConnectionError(f"no connection to {self.host}:{self.port}")
        self._correlation_id += 1
        body = wire.build(wire.request_class(api_key, api_version), values)
        self._transport.write(wire.encode_request(api_key, api_version, self._correlation_id,
                                                  self._client_id, body))
        frame = await self._protocol.next_frame()
        if len(frame) < FRAME_LENGTH_BYTES:
            raise ReplicaConnectionError(f"response of {len(frame)} bytes from "
                                         f"{self.host}:{self.port}: no correlation id")
        (correlation_id,) = _INT32.unpack_from(frame)
        if correlation_id != self._correlation_id:
            raise ReplicaConnectionError(f"response {correlation_id} out of order (expected "
                                         f"{self._correlation_id})")
        return frame
