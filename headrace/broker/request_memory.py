"""Broker-wide memory of received requests: ``queued.max.request.bytes`` and large-frame buffers.

Owns ``RequestMemory``: the count of request bytes every connection has received and not yet
finished handling -- partially received frames, frames queued behind the one being handled, and
that one -- and the region pool that all connections' large frames are received into
(``wire.large_frame_region_pool``, shared so that the spare regions kept for reuse are bounded
for the broker, not per connection: at most ``SPARE_LARGE_FRAMES_MAX_BYTES``).

At or above ``queued.max.request.bytes`` (when >= 0) the broker stops reading from every socket
(``KafkaConnection.refresh_reading`` pauses the transport) until handled requests bring the
count under ``RESUME_AT_LIMIT_FRACTION`` of the limit, then every connection resumes. Bytes are
counted as they arrive (a frame's buffer grows with its received bytes, see
``wire.FrameReceiver``), so a client that
announces a large frame and trickles it holds only what it sent. So that frames already started
can always complete and free memory, one connection stays readable while the limit is reached:
the one whose partial frame started first, as long as the count stays below the limit plus
``socket.request.max.bytes``. The count can therefore exceed the limit by at most one request
(as Kafka's non-strict memory pool does) plus the last read of each connection. A partial frame
that does not complete is closed by the idle reaper (``connections.max.idle.ms``, where bytes of
an incomplete frame are not activity), which also frees what it held.

Runs on the event loop thread only; not thread-safe.
"""

from __future__ import annotations

from typing import Protocol

from headrace.protocol import wire

# Large-frame regions kept for reuse, broker-wide. A fresh region costs a page fault per page
# received into it (measured here: ~0.7 ms per MiB against ~0.06 ms for a reused one), so
# frames up to 32 MiB (the largest glibc's malloc reuses, too) get reused regions, while the
# pages kept resident stay within SPARE_LARGE_FRAMES_MAX_BYTES.
SPARE_LARGE_FRAME_REGIONS = 64
SPARE_LARGE_FRAME_MAX_BYTES = 32 * 1024 * 1024
SPARE_LARGE_FRAMES_MAX_BYTES = 64 * 1024 * 1024
# Reading resumes once the count is below this share of the limit, so that a broker working at
# the limit does not pause and resume every connection around each request it handles.
RESUME_AT_LIMIT_FRACTION = 0.75


class Reader(Protocol):
    """A connection whose socket reading ``RequestMemory`` turns on and off."""

    partial_frame_order: int  # when its partial frame started (``RequestMemory``'s), 0: none

    def refresh_reading(self) -> None: ...


class RequestMemory:
    """``limit_bytes`` < 0: unbounded (reading is never paused for memory)."""

    def __init__(self, limit_bytes: int, max_frame_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.max_frame_bytes = max_frame_bytes
        self.held_bytes = 0
        self.large_frame_regions = wire.large_frame_region_pool(
            SPARE_LARGE_FRAME_REGIONS, SPARE_LARGE_FRAME_MAX_BYTES, SPARE_LARGE_FRAMES_MAX_BYTES)
        self.readers: set[Reader] = set()
        self._pause_at_bytes = limit_bytes if limit_bytes >= 0 else float("inf")
        self._resume_below_bytes = limit_bytes * RESUME_AT_LIMIT_FRACTION
        self._frames_started = 0  # partial frames seen starting, numbering their order
        self._limit_reached = False
        self._exempt: Reader | None = None  # the one reader still reading at the limit
        self._exempt_order = 0  # the order of the frame it is exempt for

    def may_read(self, reader: Reader) -> bool:
        return not self._limit_reached or reader is self._exempt

    def add_reader(self, reader: Reader) -> None:
        reader.partial_frame_order = 0
        self.readers.add(reader)

    def remove_reader(self, reader: Reader, held_bytes: int) -> None:
        """``reader`` is gone; what it still held is released."""
        self.readers.discard(reader)
        reader.partial_frame_order = 0
        if reader is self._exempt:
            self._exempt = None
        self.release(held_bytes)

    def received(self, reader: Reader, count_bytes: int, completed_frame: bool,
                 partial_frame: bool) -> None:
        """``count_bytes`` more bytes arrived on ``reader``; whether they completed a frame and
        whether a partial frame remains after them."""
        self.held_bytes += count_bytes
        if partial_frame:
            if completed_frame or not reader.partial_frame_order:
                self._frames_started += 1
                reader.partial_frame_order = self._frames_started
        else:
            reader.partial_frame_order = 0
        if self._limit_reached or self.held_bytes >= self._pause_at_bytes:
            self._update()

    def release(self, count_bytes: int) -> None:
        """A handled request's bytes are free again."""
        self.held_bytes -= count_bytes
        if self._limit_reached:
            self._update()

    def _update(self) -> None:
        if self._limit_reached:
            limit_reached = self.held_bytes >= self._resume_below_bytes
        else:
            limit_reached = self.held_bytes >= self._pause_at_bytes
        exempt = self._oldest_partial() if limit_reached and \
            self.held_bytes < self.limit_bytes + self.max_frame_bytes else None
        self._exempt_order = exempt.partial_frame_order if exempt is not None else 0
        if limit_reached != self._limit_reached:
            self._limit_reached, self._exempt = limit_reached, exempt
            for reader in list(self.readers):
                reader.refresh_reading()
        elif exempt is not self._exempt:
            previous, self._exempt = self._exempt, exempt
            for reader in (previous, exempt):
                if reader is not None:
                    reader.refresh_reading()

    def _oldest_partial(self) -> Reader | None:
        """The reader whose partial frame started first (the current exempt one while the
        frame it is exempt for is still partial: frames starting later are younger)."""
        exempt = self._exempt
        if exempt is not None and exempt.partial_frame_order == self._exempt_order:
            return exempt
        partial = [reader for reader in self.readers if reader.partial_frame_order]
        return min(partial, key=lambda reader: reader.partial_frame_order, default=None)
