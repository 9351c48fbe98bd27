"""broker.scheduling.note_broker_request: the broker's hint reaches the word storage's cleaner
spans read (``storage/cooperative_spans.h``), across the two extensions.

The word is read back through the capsule ``headrace.storage._segment_io`` exports, the one
the broker's extension imports at init. A niced span pausing on that hint is tested in
tests/storage/test_segment_io_spans.py.
"""

from __future__ import annotations

import ctypes
import time

from headrace.broker.scheduling import note_broker_request
from headrace.storage import _segment_io

_capsule_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_capsule_pointer.restype = ctypes.c_void_p
_capsule_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
NOTES = 3


def _broker_request_ns() -> int:
    """The word the spans load: CLOCK_MONOTONIC of the latest noted request, 0 for none."""
    address = _capsule_pointer(_segment_io.broker_request_ns,
                               b"headrace.storage._segment_io.broker_request_ns")
    return ctypes.c_int64.from_address(address).value


def test_a_noted_request_stores_its_monotonic_time_in_the_word_the_spans_read():
    for _ in range(NOTES):
        before_ns = time.monotonic_ns()  # CLOCK_MONOTONIC, the clock the spans compare with
        note_broker_request()
        after_ns = time.monotonic_ns()
        assert before_ns <= _broker_request_ns() <= after_ns
