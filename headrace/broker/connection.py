"""One client connection: frames in, requests handled strictly in order, responses out.

Owns ``KafkaConnection``, an ``asyncio.Protocol``. Bytes received go through a
``wire.FrameReader`` (limit ``socket.request.max.bytes``); whole frames queue up (pipelining)
and one task handles them one at a time, as Kafka does, so responses leave in request order.
Reading pauses while ``MAX_QUEUED_REQUESTS`` frames wait and while the socket's write buffer
is above asyncio's high-water mark.

A malformed frame, a frame over the size limit, or an unsupported (api key, version) other
than ApiVersions closes this connection with one log line; other connections never notice.
An unsupported ApiVersions version is answered with a v0 body carrying UNSUPPORTED_VERSION
and our ranges, as Kafka does, so clients can downgrade.

Responses are kio entities (encoded here) or ``RawResponse``s: bytes written as they are and
storage ``FileSlice``s sent with ``loop.sendfile`` (zero-copy ``os.sendfile`` on the default
selector event loop); slices totalling under ``SENDFILE_MIN_BYTES``, and every slice on a
loop without native sendfile (uvloop), are read with pread and written, which is cheaper
than a sendfile round trip for tiny fetches. A slice is first offered to one direct
non-blocking ``os.sendfile`` when the transport has nothing queued; only what does not fit
in the socket buffer goes through ``loop.sendfile``.

Runs on the event loop thread only; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
import time
from collections import deque
from typing import Any

from headrace.broker.context import RawResponse, RequestContext
from headrace.broker.handlers import HANDLERS
from headrace.errors import InvalidRequest, UnsupportedVersion
from headrace.protocol import wire

log = logging.getLogger(__name__)

MAX_QUEUED_REQUESTS = 64
SENDFILE_MIN_BYTES = 64 * 1024
_INT32 = struct.Struct(">i")


class _FileAtOffset:
    """The file-object face ``loop.sendfile`` needs around a raw descriptor."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def seek(self, position: int, whence: int = 0) -> int:
        return position  # the slice's position is always passed explicitly


def has_native_sendfile(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop.sendfile`` is zero-copy ``os.sendfile`` (the default selector loop);
    uvloop's raises NotImplementedError, so slices are read and written there."""
    return isinstance(loop, asyncio.selector_events.BaseSelectorEventLoop)


def unsupported_api_versions_response(correlation_id: int) -> bytes:
    """ApiVersions v0 body with UNSUPPORTED_VERSION and our ranges, response header v0."""
    body = bytearray(struct.pack(">hi", UnsupportedVersion.code, len(HANDLERS)))
    for handler in HANDLERS.values():
        body += struct.pack(">hhh", handler.api_key, handler.min_version, handler.max_version)
    payload = _INT32.pack(correlation_id) + bytes(body)
    return _INT32.pack(len(payload)) + payload


class KafkaConnection(asyncio.Protocol):
    def __init__(self, broker: Any, registry: set[KafkaConnection]) -> None:
        self.broker = broker
        self.registry = registry
        self.reader = wire.FrameReader(broker.config.get_int("socket.request.max.bytes"))
        self.queue: deque[bytes] = deque()
        self.transport: asyncio.Transport | None = None
        self.socket_fd = -1
        self.peer = ""
        self.last_active_monotonic_s = time.monotonic()
        self.worker: asyncio.Task | None = None
        self.reading_paused = False
        self.closing = False
        self.writable = asyncio.Event()
        self.writable.set()

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        self.socket_fd = sock.fileno() if sock is not None else -1
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.registry.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.registry.discard(self)
        self.writable.set()
        if self.worker is not None and not self.worker.done():
            self.worker.cancel()

    def data_received(self, data: bytes) -> None:
        self.last_active_monotonic_s = time.monotonic()
        self.reader.receive_data(data)
        try:
            while (frame := self.reader.next_frame()) is not None:
                self.queue.append(frame)
        except InvalidRequest as error:
            self.abort(f"bad frame: {error}")
            return
        if len(self.queue) >= MAX_QUEUED_REQUESTS and not self.reading_paused:
            self.transport.pause_reading()
            self.reading_paused = True
        if self.queue and (self.worker is None or self.worker.done()):
            self.worker = asyncio.get_running_loop().create_task(self._work())

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    # --- request processing --------------------------------------------------------------

    @property
    def busy(self) -> bool:
        return bool(self.queue) or (self.worker is not None and not self.worker.done())

    def abort(self, reason: str) -> None:
        if not self.closing:
            log.warning("closing connection from %s: %s", self.peer, reason)
        self.closing = True
        self.queue.clear()
        if self.transport is not None:
            self.transport.abort()

    async def _work(self) -> None:
        while self.queue and not self.closing:
            frame = self.queue.popleft()
            if self.reading_paused and len(self.queue) < MAX_QUEUED_REQUESTS // 2:
                self.transport.resume_reading()
                self.reading_paused = False
            try:
                await self._handle_frame(frame)
            except asyncio.CancelledError:
                raise
            except (InvalidRequest, UnsupportedVersion) as error:
                self.abort(str(error))
            except Exception:
                log.exception("unexpected error handling a request from %s", self.peer)
                self.abort("internal error")
            self.last_active_monotonic_s = time.monotonic()

    async def _handle_frame(self, frame: bytes) -> None:
        header, _ = wire.parse_request_header(frame)
        handler = HANDLERS.get(header.api_key)
        if handler is None or not handler.supports(header.api_version):
            if header.api_key == wire.API_VERSIONS_KEY:
                await self._write(unsupported_api_versions_response(header.correlation_id))
                return
            raise UnsupportedVersion(
                f"api key {header.api_key} version {header.api_version} is not supported"
            )
        request = wire.decode_request(frame)
        broker = self.broker
        context = RequestContext(header, broker, broker.clock.now_ms(), self.peer)
        response = await handler.module.handle(context, request.body)
        if response is None or self.closing:
            return
        if isinstance(response, RawResponse):
            await self._write_raw(header, response)
        else:
            await self._write(wire.encode_response(header, response))

    async def _write(self, data: bytes) -> None:
        await self.writable.wait()
        if not self.closing:
            self.transport.write(data)

    async def _write_raw(self, header: wire.RequestHeader, response: RawResponse) -> None:
        flexible = wire.response_class(header.api_key, header.api_version).__flexible__
        header_bytes = wire.response_header_bytes(header, flexible)
        head = _INT32.pack(len(header_bytes) + response.size_bytes) + header_bytes
        parts = response.parts
        if parts and isinstance(parts[0], bytes | bytearray):
            head, parts = head + parts[0], parts[1:]  # one write for the header and body start
        await self._write(head)
        file_bytes = sum(p.length for p in parts if not isinstance(p, bytes | bytearray))
        loop = asyncio.get_running_loop()
        use_sendfile = file_bytes >= SENDFILE_MIN_BYTES and has_native_sendfile(loop)
        for part in parts:
            if self.closing:
                return
            if isinstance(part, bytes | bytearray):
                await self._write(part)
            elif not use_sendfile:
                await self._write(part.read_bytes())
            elif part.length:
                await self.writable.wait()
                sent = self._sendfile_at_once(part)
                if sent < part.length and not self.closing:
                    await loop.sendfile(self.transport, _FileAtOffset(part.fd),
                                        part.position + sent, part.length - sent)

    def _sendfile_at_once(self, part: Any) -> int:
        """Bytes of ``part`` that one non-blocking ``os.sendfile`` sends right now, when nothing
        is queued in the transport ahead of them (0 otherwise); ``loop.sendfile`` sends the
        rest. Saves the loop's wait-for-drain, pause/resume and writer callbacks for slices
        that fit in the socket buffer."""
        if (self.closing or self.socket_fd < 0 or self.transport.is_closing()
                or self.transport.get_write_buffer_size()):
            return 0  # (a closed socket's descriptor number may already name another file)
        try:
            return os.sendfile(self.socket_fd, part.fd, part.position, part.length)
        except OSError:  # would block, or a failure that loop.sendfile will report
            return 0
