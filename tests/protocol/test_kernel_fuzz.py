"""A seeded fuzzer over every kernel entry point that parses bytes or column buffers.

Valid record batches (every codec, control batches, headers) are mutated (``mutate``: bit
flips, boundary bytes, truncation, insertion) and, for half the cases, re-sealed with a
correct CRC-32C so that the mutation reaches the record parsers behind the checksum. Each
case goes through scan/decode_columns, decode_arrow, validate_batches,
first_batch_outside_limits, hash_keys, first_keyless_offset, crc32c and murmur3 (protocol),
index_batches, map_batches, filter_batches and append_plain_batch/write_batch (storage's
segment_io) and murmur2 (the Spark encoder). The Spark encoder's column buffers have their
own fuzzer (tests/spark/test_encoder_fuzz.py).

The only outcomes allowed are a result or the documented exceptions (CorruptMessage,
ValueError, OverflowError); a crash fails the run, and under ``make kernel-asan`` so does
any out-of-bounds access or undefined behaviour. A failure names its seed and case index,
and ``replay_case(seed, case)`` rebuilds the input.
"""

from __future__ import annotations

import os
import random
import struct

import crc32c
import numpy as np
import pytest

from headrace.errors import CorruptMessage, InvalidRecord
from headrace.protocol import kernel
from headrace.spark import encoder
from headrace.storage import segment_io
from headrace.storage.segment_io import IndexState, PassScope
from tests.protocol.test_kernel import (
    SNAPPY_RAW,
    Batch,
    Rec,
    check_clean_outcome,
    encode_batch,
    mutate,
    simple_batch,
)

FUZZ_SEED = 20261125
BATCH_CASES = 1500
NOW_MS = 1_700_000_000_000
NO_LIMIT = 2**63 - 1
# max_message_bytes, before/after_max_ms, required codec, compacted, from a client
OPEN_LIMITS = (NO_LIMIT, NO_LIMIT, NO_LIMIT, -1, True, True)
# compacted, check CreateTime timestamps, from a client, now_ms, before/after_max_ms
RECORD_CHECKS = (True, True, True, NOW_MS, NO_LIMIT, NO_LIMIT)
ALL_KEYS = PassScope(0, 1 << 40, 0, 1 << 32)
FRESH_INDEX = IndexState(0, -1, 0, 0, False)
MAP_SLOTS = 64
# per input byte at most 1/7 record of 20 row bytes, offsets, bitmaps; plus keys and values
ARROW_REGION_BYTES_PER_INPUT_BYTE = 16
ARROW_BUFFERS = 9  # each aligned to ARROW_ALIGNMENT_BYTES
EXPECTED_ERRORS = (CorruptMessage, InvalidRecord, kernel.RecordsRejected, ValueError, OverflowError)
CRC_COVERED_FROM = 21  # a v2 batch's CRC-32C covers its bytes from the attributes on
BATCH_LENGTH_AT = 8
LOG_OVERHEAD_BYTES = 12


def seed_logs() -> list[bytes]:
    headers = (("h", b"x"), ("n", None))
    return [
        simple_batch(),
        simple_batch(codec=1) + simple_batch(codec=4),
        encode_batch(Batch(7, [Rec(i, i, b"k%d" % i, b"v" * i, headers) for i in range(6)])),
        simple_batch(codec=SNAPPY_RAW) + simple_batch(codec=2, control=True),
        simple_batch(codec=3, log_append_time=True) + simple_batch(base_offset=103),
    ]


def reseal(buf: bytes) -> bytes:
    """``buf`` with each whole batch's CRC-32C recomputed over its (possibly mutated) bytes."""
    out = bytearray(buf)
    position = 0
    while position + CRC_COVERED_FROM <= len(out):
        (length,) = struct.unpack_from(">i", out, position + BATCH_LENGTH_AT)
        end = position + LOG_OVERHEAD_BYTES + length
        if length < CRC_COVERED_FROM - LOG_OVERHEAD_BYTES or end > len(out):
            break
        crc = crc32c.crc32c(bytes(out[position + CRC_COVERED_FROM:end]))
        struct.pack_into(">I", out, position + CRC_COVERED_FROM - 4, crc)
        position = end
    return bytes(out)


def replay_case(seed: int, case: int) -> bytes:
    """The input of batch case ``case`` of the run seeded ``seed``."""
    rng = random.Random(f"{seed}:{case}")
    logs = seed_logs()
    mutated = mutate(rng, logs[case % len(logs)])
    return reseal(mutated) if rng.random() < 0.5 else mutated


def _expect_clean(call, *args, errors=EXPECTED_ERRORS, **kwargs):
    try:
        return call(*args, **kwargs)
    except errors:
        return None


def _through_decode_arrow(buf: bytes) -> None:
    plan = _expect_clean(kernel.plan_arrow_decode, buf)
    if plan is None:
        return
    # the output is sized by the input, whatever a corrupt header's record count claims
    assert kernel.arrow_region_bytes(plan) <= (
        ARROW_REGION_BYTES_PER_INPUT_BYTE * plan.max_data_bytes
        + ARROW_BUFFERS * kernel.ARROW_ALIGNMENT_BYTES)
    region = np.zeros(kernel.arrow_region_bytes(plan), np.uint8)
    out = kernel.arrow_buffers_in(region, plan)
    _expect_clean(kernel.decode_arrow, buf, plan, out, 0, 1 << 62, verify_crc=False)
    _expect_clean(kernel.decode_arrow, buf, plan, out, 101, 104)


def _through_validation(buf: bytes) -> None:
    summaries = _expect_clean(kernel.validate_batches, buf)
    _expect_clean(kernel.validate_batches, bytearray(buf), RECORD_CHECKS)
    if summaries:
        _expect_clean(kernel.first_batch_outside_limits, summaries, 1 << 20, NOW_MS,
                      NO_LIMIT, NO_LIMIT, True)
    _expect_clean(segment_io.index_batches, buf, 0, len(buf), 0, -1, 64, FRESH_INDEX)
    _expect_clean(segment_io.index_batches, buf, 4096, 4096 + len(buf) // 2, 100, 102, 1,
                  FRESH_INDEX)


def _through_cleaner(buf: bytes) -> None:
    fingerprints = np.zeros(MAP_SLOTS, np.uint64)
    words = np.zeros(MAP_SLOTS, np.uint32)
    built = _expect_clean(segment_io.map_batches, buf, fingerprints, words, ALL_KEYS, 0, 1 << 20,
                          verify_crc=False)
    if built is not None:
        _expect_clean(segment_io.filter_batches, buf, fingerprints, words, ALL_KEYS, 0, NOW_MS,
                      NOW_MS, np.array([102, 105], np.int64), verify_crc=False)


def _through_append(buf: bytes, fd: int) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    appended = _expect_clean(segment_io.append_plain_batch, buf, fd, 500, 7, NO_LIMIT, NO_LIMIT,
                             NOW_MS, OPEN_LIMITS)
    if appended is not None and not appended[2]:
        segment_io.write_batch(buf, fd, 500, 7)  # validated, carries a producer id: written here


def _through_hashes(buf: bytes) -> None:
    assert kernel.crc32c(buf) == crc32c.crc32c(buf)
    encoder.murmur2(buf)
    kernel.murmur3_x64_128(buf, len(buf))


def test_every_batch_entry_point_survives_mutated_batches(tmp_path):
    fd = os.open(tmp_path / "segment.log", os.O_RDWR | os.O_CREAT)
    reached_records = 0
    try:
        for case in range(BATCH_CASES):
            buf = replay_case(FUZZ_SEED, case)
            try:
                check_clean_outcome(buf, verify_crc=case % 2 == 0)
                columns = _expect_clean(kernel.decode_columns, buf, verify_crc=False)
                reached_records += columns.count if columns is not None else 0
                _through_decode_arrow(buf)
                _through_validation(buf)
                _through_cleaner(buf)
                _through_append(buf, fd)
                _through_hashes(buf)
            except Exception as error:
                raise AssertionError(f"seed {FUZZ_SEED} case {case}: {buf.hex()}") from error
    finally:
        os.close(fd)
    assert reached_records > 0  # some mutated inputs still parse: the parsers were reached


@pytest.mark.parametrize("case", range(5))
def test_replay_rebuilds_the_same_input(case):
    assert replay_case(FUZZ_SEED, case) == replay_case(FUZZ_SEED, case)
