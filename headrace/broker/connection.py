"""One client connection: frames in, requests handled strictly in order, responses out.

Owns ``KafkaConnection``, an ``asyncio.BufferedProtocol``: the socket is read with
``recv_into`` into a ``wire.FrameReceiver`` (limit ``socket.request.max.bytes``), so a large
frame -- a produce request -- lands in its own buffer and is never copied again (its records
reach the log as views of it); whole frames queue up (pipelining)
and one task handles them one at a time, as Kafka does, so responses leave in request order.
Reading pauses while ``MAX_QUEUED_REQUESTS`` frames wait, while the socket's write buffer
is above asyncio's high-water mark, and while the broker's received request bytes are at
``queued.max.request.bytes`` (``request_memory.RequestMemory``, which every received byte is
counted in until its request is handled).

A connection is idle -- closed by the broker after ``connections.max.idle.ms`` -- when no frame
has completed and no request has been handled for that long: bytes of a frame that never
completes are not activity, so trickling a frame a byte at a time does not keep it open.

A malformed frame, a frame over the size limit, or an unsupported (api key, version) other
than ApiVersions closes this connection with one log line; other connections never notice.
An unsupported ApiVersions version is answered with a v0 body carrying UNSUPPORTED_VERSION
and our ranges, as Kafka does, so clients can downgrade.

Responses are kio entities (encoded here) or ``RawResponse``s: bytes written as they are and
storage ``FileSlice``s sent with ``loop.sendfile`` (zero-copy ``os.sendfile`` on the default
selector event loop); slices totalling under ``SENDFILE_MIN_BYTES`` are read with pread and
the whole response goes out in one write (each separate write to a loopback socket is a
segment and a wake-up of the reader, the largest fixed cost of a small fetch), as is every
slice on a loop without native sendfile (uvloop). A slice is first offered to one direct
non-blocking ``os.sendfile`` when the transport has nothing queued; what does not fit in the
socket buffer follows by ``os.sendfile`` each time the socket is writable again (waited for
on a duplicate descriptor, ``writer_fd``, since the transport's own is registered with the
selector); only a slice with transport bytes queued ahead of it goes through
``loop.sendfile``. A sendfile response is written with TCP_CORK set, so its few bytes after
the file data do not leave as a segment of their own. Slices not in the page cache (a consumer
catching up) are first read with ``O_DIRECT`` on a worker thread (``cold_reads``) and sent as
bytes, so the event loop never waits on the disk.

Request handling starts on the stack of ``data_received`` ("eager", as Python 3.12's eager
tasks) and moves to a task only if it has to wait (an append-thread job, a long poll, a full
socket buffer).

Runs on the event loop thread only; not thread-safe.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import struct
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from headrace.broker.cold_reads import IN_MEMORY, cold_slices, read_slices
from headrace.broker.context import RawResponse, RequestContext
from headrace.broker.handlers import HANDLERS
from headrace.broker.request_memory import RequestMemory
from headrace.broker.scheduling import note_broker_request
from headrace.errors import InvalidRequest, UnsupportedVersion
from headrace.protocol import wire

log = logging.getLogger(__name__)

MAX_QUEUED_REQUESTS = 64
SENDFILE_MIN_BYTES = 64 * 1024
TCP_CORK = getattr(socket, "TCP_CORK", None)  # Linux
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


class _Resumed:
    """Awaitable that continues a coroutine started by hand (``coroutine.send(None)``) which
    suspended by yielding ``yielded``: the task running it sees what the coroutine yields,
    and the coroutine sees what the task sends or throws in (cancellation)."""

    __slots__ = ("_coroutine", "_yielded")

    def __init__(self, coroutine, yielded) -> None:
        self._coroutine = coroutine
        self._yielded = yielded

    def __await__(self):
        coroutine, yielded = self._coroutine, self._yielded
        while True:
            try:
                sent = yield yielded
            except GeneratorExit:
                coroutine.close()
                raise
            except BaseException as error:  # noqa: BLE001 -- every throw goes to the coroutine
                try:
                    yielded = coroutine.throw(error)
                except StopIteration as stop:
                    return stop.value
            else:
                try:
                    yielded = coroutine.send(sent)
                except StopIteration as stop:
                    return stop.value


def _resolve(future: asyncio.Future) -> None:
    if not future.done():
        future.set_result(None)


async def _continue(coroutine, yielded):
    return await _Resumed(coroutine, yielded)


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


class KafkaConnection(asyncio.BufferedProtocol):
    def __init__(self, broker: Any, registry: set[KafkaConnection], memory: RequestMemory,
                 on_closed: Callable[[], None] | None = None) -> None:
        self.broker = broker
        self.registry = registry
        self.memory = memory
        self.on_closed = on_closed
        self.reader = wire.FrameReceiver(memory.max_frame_bytes, memory.large_frame_regions)
        self.held_bytes = 0  # received and counted in ``memory``, not yet released
        self.partial_frame_order = 0  # RequestMemory's
        self.queue: deque[bytes | memoryview] = deque()
        self.transport: asyncio.Transport | None = None
        self.socket_fd = -1
        self.writer_fd = -1  # a duplicate of socket_fd, made when a sendfile has to wait
        self.loop: asyncio.AbstractEventLoop | None = None  # known from the first sendfile
        self.sock = None
        self.peer = ""
        self.last_active_monotonic_s = time.monotonic()
        self.worker: asyncio.Task | None = None
        self.reading_paused = False
        self.queue_full = False
        self.closing = False
        self.writable = asyncio.Event()
        self.writable.set()

    # --- asyncio.Protocol ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        self.socket_fd = sock.fileno() if sock is not None else -1
        self.sock = sock if TCP_CORK is not None else None
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        self.registry.add(self)
        self.memory.add_reader(self)
        self.refresh_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self._close_writer_fd()
        self.registry.discard(self)
        self.queue.clear()
        self.memory.remove_reader(self, self.held_bytes)
        self.held_bytes = 0
        if self.on_closed is not None:
            self.on_closed()
        self.writable.set()
        if self.worker is not None and not self.worker.done():
            self.worker.cancel()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.reader.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        note_broker_request()  # the cleaner's spans give way while requests come in
        reader, queue = self.reader, self.queue
        try:
            reader.buffer_updated(nbytes)
        except InvalidRequest as error:
            self.abort(f"bad frame: {error}")
            return
        queued_before = len(queue)
        while (frame := reader.next_frame()) is not None:
            queue.append(frame)
        completed_frame = len(queue) > queued_before
        if completed_frame:
            self.last_active_monotonic_s = time.monotonic()
        self.held_bytes += nbytes
        self.memory.received(self, nbytes, completed_frame, reader.partial_frame_bytes > 0)
        if len(queue) >= MAX_QUEUED_REQUESTS and not self.queue_full:
            self.queue_full = True
            self.refresh_reading()
        if queue and (self.worker is None or self.worker.done()):
            self._start_worker()

    def refresh_reading(self) -> None:
        """Pause or resume reading the socket: paused while this connection's queue is full
        or the broker's request memory does not let it read."""
        paused = self.queue_full or not self.memory.may_read(self)
        if paused == self.reading_paused or self.transport is None or self.closing:
            return
        self.reading_paused = paused
        if paused:
            self.transport.pause_reading()
        else:
            self.transport.resume_reading()

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

    def _start_worker(self) -> None:
        """Run ``_work`` right away on this call stack ("eager" start): most requests finish
        without suspending (inline appends, fetches with data, a writable socket), which
        saves creating a task and a trip around the event loop per request. A ``_work`` that
        suspends continues in a task (``self.worker``) from where it stopped."""
        work = self._work()
        try:
            suspended_at = work.send(None)
        except StopIteration:
            return
        self.worker = asyncio.get_running_loop().create_task(_continue(work, suspended_at))

    async def _work(self) -> None:
        while self.queue and not self.closing:
            frame = self.queue.popleft()
            if self.queue_full and len(self.queue) < MAX_QUEUED_REQUESTS // 2:
                self.queue_full = False
                self.refresh_reading()
            try:
                await self._handle_frame(frame)
            except asyncio.CancelledError:
                raise
            except (InvalidRequest, UnsupportedVersion) as error:
                self.abort(str(error))
            except Exception:
                log.exception("unexpected error handling a request from %s", self.peer)
                self.abort("internal error")
            self._release(4 + len(frame))
            frame = None  # unreferenced, a large frame's buffer can take the next one
            self.last_active_monotonic_s = time.monotonic()

    def _release(self, count_bytes: int) -> None:
        if self.closing:  # connection_lost released everything this connection held
            return
        self.held_bytes -= count_bytes
        self.memory.release(count_bytes)

    async def _handle_frame(self, frame: bytes | memoryview) -> None:
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
        flexible = wire.response_is_flexible(header.api_key, header.api_version)
        header_bytes = wire.response_header_bytes(header, flexible)
        head = _INT32.pack(len(header_bytes) + response.size_bytes) + header_bytes
        parts = response.parts
        loop = self.loop
        if loop is None:  # asked once: each get_running_loop() is a getpid() system call
            loop = self.loop = asyncio.get_running_loop()
        if cold := cold_slices(parts):  # not in the page cache: read off the loop
            parts = await loop.run_in_executor(None, read_slices, parts, cold)
            if self.closing:
                return
        file_bytes = sum(p.length for p in parts if not isinstance(p, IN_MEMORY))
        if file_bytes == 0 and response.size_bytes >= SENDFILE_MIN_BYTES:
            await self._write_all((head, *parts))  # cold data read: no join of large parts
            return
        if file_bytes < SENDFILE_MIN_BYTES:  # one write, so one segment and one wake-up
            await self._write(b"".join([head, *(
                p if isinstance(p, IN_MEMORY) else p.read_bytes() for p in parts)]))
            return
        if parts and isinstance(parts[0], IN_MEMORY):
            head, parts = head + parts[0], parts[1:]  # one write for the header and body start
        if not has_native_sendfile(loop):
            await self._write_all((head, *parts))
            return
        self._set_cork(True)
        try:
            await self._write(head)
            await self._send_parts(parts, loop)
        finally:
            self._set_cork(False)

    async def _write_all(self, parts: tuple[Any, ...]) -> None:
        """Write ``parts`` in order, file slices read with pread (no sendfile)."""
        for part in parts:
            if self.closing:
                return
            await self._write(part if isinstance(part, IN_MEMORY) else part.read_bytes())

    async def _send_parts(self, parts: tuple[Any, ...], loop: asyncio.AbstractEventLoop) -> None:
        for part in parts:
            if self.closing:
                return
            if isinstance(part, IN_MEMORY):
                await self._write(part)
            elif part.length:
                await self.writable.wait()
                sent = self._sendfile_at_once(part)
                if sent == part.length or self.closing or self.transport.is_closing():
                    continue
                if self.transport.get_write_buffer_size() or self.socket_fd < 0:
                    await loop.sendfile(self.transport, _FileAtOffset(part.fd),
                                        part.position + sent, part.length - sent)
                else:
                    await self._sendfile_when_writable(part, sent, loop)

    async def _sendfile_when_writable(self, part: Any, sent: int,
                                      loop: asyncio.AbstractEventLoop) -> None:
        """The rest of ``part`` after its first ``sent`` bytes, by non-blocking ``os.sendfile``
        each time the socket is writable again. The transport has nothing queued and this
        connection writes nothing else meanwhile, so the socket is ours until it is done:
        cheaper than ``loop.sendfile``, which also pauses and resumes reading and waits for
        the transport to drain (several selector changes and callbacks per response)."""
        while sent < part.length and not self.closing:
            await self._socket_writable(loop)
            if self.closing or self.transport.is_closing():
                return
            try:
                sent += os.sendfile(self.socket_fd, part.fd, part.position + sent,
                                    part.length - sent)
            except BlockingIOError:
                continue
            except OSError as error:
                self.abort(f"sending a fetch response failed: {error}")
                return

    async def _socket_writable(self, loop: asyncio.AbstractEventLoop) -> None:
        """Wait until the socket can take more bytes. The transport owns the socket's own
        descriptor in the selector, so the wait is registered on a duplicate of it."""
        if self.writer_fd < 0:
            self.writer_fd = os.dup(self.socket_fd)
        writable = loop.create_future()
        loop.add_writer(self.writer_fd, _resolve, writable)
        try:
            await writable
        finally:
            if self.writer_fd >= 0:
                loop.remove_writer(self.writer_fd)

    def _close_writer_fd(self) -> None:
        """Unregister and close the duplicate descriptor; unregistering first, so a later
        ``remove_writer`` can never name a reused descriptor number."""
        if self.writer_fd >= 0:
            self.loop.remove_writer(self.writer_fd)
            os.close(self.writer_fd)
            self.writer_fd = -1

    def _set_cork(self, corked: bool) -> None:
        """TCP_CORK around a sendfile response: the header, the file data and the few bytes
        after it leave in full segments, the tail not as a segment (and a wake-up of the
        client) of its own."""
        if self.sock is None or self.closing or self.transport.is_closing():
            return
        try:
            self.sock.setsockopt(socket.IPPROTO_TCP, TCP_CORK, 1 if corked else 0)
        except OSError:  # the peer went away; connection_lost follows
            pass

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
