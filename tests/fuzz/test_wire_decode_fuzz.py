"""The request decoder in-process (``wire.decode_request``: header, the request pre-pass's C
walker, kio's native reader, the hand-written Produce reader) over the wire fuzzer's
structure-aware cases, many more than a broker round trip allows. Under ``make kernel-asan``
this is the pre-pass walker's fuzz test with the sanitizers watching.

A frame either decodes or raises InvalidRequest (MalformedFrame, FrameTooLarge) or
UnsupportedVersion -- the errors the connection turns into a closed connection; anything
else would be a traceback in the broker. A crash kills the run.
"""

from __future__ import annotations

import struct

from headrace.errors import InvalidRequest, UnsupportedVersion
from headrace.protocol import wire
from tests.fuzz.wire_cases import FRAME_LENGTH_BYTES, case_frame

DECODE_SEED = 11
DECODE_CASES = 20000


def test_decode_request_refuses_malformed_frames_with_kafka_errors():
    decoded = refused = 0
    for index in range(DECODE_CASES):
        case = case_frame(DECODE_SEED, index)
        (declared,) = struct.unpack_from(">i", case.frame)
        if declared < 0 or declared > len(case.frame) - FRAME_LENGTH_BYTES:
            continue  # the frame reader waits for more bytes or refuses the size
        body = case.frame[FRAME_LENGTH_BYTES:FRAME_LENGTH_BYTES + declared]
        try:
            wire.decode_request(body)
            decoded += 1
        except (InvalidRequest, UnsupportedVersion):
            refused += 1
        except Exception as error:
            raise AssertionError(
                f"seed {DECODE_SEED} case {index} {case.mutations}: {body.hex()}") from error
    assert decoded > DECODE_CASES // 10 and refused > DECODE_CASES // 2
