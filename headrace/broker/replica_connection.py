"""One asyncio wire connection from a follower to a partition leader: ``ReplicaConnection``.

Owns the socket of a replica fetcher (``headrace.broker.replica_fetcher``): requests are
kio entities built from plain values and framed by ``headrace.protocol.wire`` (request header
v1, or v2 for flexible versions), one request in flight at a time, each round trip bounded by
``replica.socket.timeout.ms`` (``TimeoutError``); a response announcing more than
``max_response_bytes`` or a negative size, or carrying another correlation id, closes the
connection (``ReplicaConnectionError``): its byte stream can no longer be trusted. The broker
layer may not import ``headrace.client``, so this is the loop-side twin of its blocking
``BrokerConnection``, built on the same sans-I/O codec.

Event loop thread only; one fetcher owns one connection.
"""

from __future__ import annotations

import asyncio
import struct
from typing import Any

from headrace.errors import KafkaError
from headrace.protocol import wire

FRAME_LENGTH_BYTES = 4
READ_BUFFER_LIMIT_BYTES = 4 * 1024 * 1024
_INT32 = struct.Struct(">i")


class ReplicaConnectionError(KafkaError):
    """The leader answered something a follower cannot use; the connection is closed."""


class ReplicaConnection:
    def __init__(self, host: str, port: int, client_id: str, socket_timeout_ms: int,
                 max_response_bytes: int) -> None:
        self.host, self.port = host, port
        self._client_id = client_id
        self._timeout_s = socket_timeout_ms / 1000
        self._max_response_bytes = max_response_bytes
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation_id = 0

    @property
    def is_open(self) -> bool:
        return self._writer is not None and not self._writer.is_closing()

    async def open(self) -> None:
        # The reader's buffer limit is its flow-control mark: at asyncio's 64 KiB a response
        # of megabytes pauses and resumes the socket every few reads.
        self._reader, self._writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port, limit=READ_BUFFER_LIMIT_BYTES),
            self._timeout_s)

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._reader = self._writer = None

    async def request(self, api_key: int, api_version: int, values: dict[str, Any]) -> Any:
        """Send one request and return its decoded response body; OSError (incl.
        TimeoutError) or ReplicaConnectionError close the connection."""
        try:
            return await asyncio.wait_for(self._round_trip(api_key, api_version, values),
                                          self._timeout_s)
        except BaseException:
            self.close()
            raise

    async def _round_trip(self, api_key: int, api_version: int, values: dict[str, Any]) -> Any:
        if not self.is_open:
            raise ConnectionError(f"no connection to {self.host}:{self.port}")
        self._correlation_id += 1
        body = wire.build(wire.request_class(api_key, api_version), values)
        self._writer.write(wire.encode_request(api_key, api_version, self._correlation_id,
                                               self._client_id, body))
        await self._writer.drain()
        (size,) = _INT32.unpack(await self._reader.readexactly(FRAME_LENGTH_BYTES))
        if not 0 <= size <= self._max_response_bytes:
            raise ReplicaConnectionError(f"response of {size} bytes announced by "
                                         f"{self.host}:{self.port}; at most "
                                         f"{self._max_response_bytes} accepted")
        frame = await self._reader.readexactly(size)
        try:
            correlation_id, response = wire.decode_response(api_key, api_version, frame)
        except Exception as error:  # kio's decode errors: the stream is not Kafka's
            raise ReplicaConnectionError(f"undecodable response from {self.host}:{self.port}: "
                                         f"{error!r}") from None
        if correlation_id != self._correlation_id:
            raise ReplicaConnectionError(f"response {correlation_id} out of order (expected "
                                         f"{self._correlation_id})")
        return response
