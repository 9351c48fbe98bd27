"""The broker's scheduling hint to the log cleaner, compiled (``_scheduling.c``).

Owns ``note_broker_request()``: the broker's event loop received a request now. While
requests keep coming (one within the last 50 ms), a niced cleaner span (``niceness`` > 0 in
``storage.segment_io.map_span`` / ``filter_span``) pauses 50 us after every 250 us of CPU,
between chunks, so a thread woken on its CPU -- the event loop, the append thread, a
client -- runs at once instead of waiting for the scheduler to preempt the span; an idle
broker's spans never pause. One atomic store into the word storage's C reads
(``storage/cooperative_spans.h``), bound to the C function itself: it runs on every request.

Thread-safety: callable from any thread; one relaxed atomic store.
"""

from __future__ import annotations

from headrace.broker import _scheduling

note_broker_request = _scheduling.note_broker_request
