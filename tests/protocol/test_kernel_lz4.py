"""``kernel.check_lz4_records`` (an lz4 batch inflated by liblz4 and checked in one pass)
answers exactly what the general path answers: ``compression``'s decoders, then
``kernel.check_compressed_records`` over the whole section.

Each seeded case builds a batch of records (some larger than an LZ4 block, so that records
straddle blocks), optionally damages its records section (a byte changed, bytes cut or added),
writes the section as one or more LZ4 frames of varied block sizes, block linking and
checksums (sometimes with a skippable frame between them), and optionally damages the frames
(a byte changed, a cut). The one pass must then return the general path's max timestamp and
header rewrite, raise its error with the same message or record errors, or decline (None)
exactly where the general path finds the data undecodable or larger than the buffer. A
failure names its seed and case.
"""

from __future__ import annotations

import random
import struct

import crc32c
import lz4.frame
import pytest

from headrace.errors import CorruptMessage, InvalidRecord, MessageTooLarge
from headrace.protocol import compression, kernel
from headrace.protocol.batch import ATTRIBUTES_OFFSET, BATCH_HEADER_BYTES, CRC_OFFSET
from headrace.protocol.records import build_batch

NOW_MS = 1_700_000_000_000
SEED = 20261125
CASES = 500
BLOCK_SIZES = (lz4.frame.BLOCKSIZE_MAX64KB, lz4.frame.BLOCKSIZE_MAX256KB,
               lz4.frame.BLOCKSIZE_MAX1MB)
SKIPPABLE_FRAME_MAGIC = 0x184D2A50


def _checks(rng: random.Random) -> tuple:
    """(compacted, check_timestamps, from_client, now_ms, before_max_ms, after_max_ms)."""
    before_max_ms = rng.choice([2**63 - 1, 500, 5000])
    return (rng.random() < 0.3, rng.random() < 0.8, True, NOW_MS, before_max_ms, 3_600_000)


def _records(rng: random.Random) -> list[tuple]:
    records = []
    for i in range(rng.randint(1, 60)):
        size = rng.choice([0, 10, 700, 5000, 70_000]) if rng.random() < 0.9 else 300_000
        value = rng.randbytes(size // 2) * 2 if rng.random() < 0.7 else bytes(size)
        key = None if rng.random() < 0.1 else f"key-{i}".encode()
        headers = [("h", b"v" * rng.randint(0, 40))] if rng.random() < 0.3 else []
        records.append((key, value, headers, NOW_MS - rng.randint(0, 9000)))
    return records


def _damaged_section(rng: random.Random, section: bytes) -> bytes:
    kind = rng.choice(["none", "none", "flip", "cut", "extra"])
    damaged = bytearray(section)
    if kind == "flip" and damaged:
        damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
    elif kind == "cut" and damaged:
        del damaged[rng.randrange(len(damaged)):]
    elif kind == "extra":
        damaged += rng.randbytes(rng.randint(1, 5))
    return bytes(damaged)


def _frames(rng: random.Random, section: bytes) -> bytes:
    """``section`` as one to three LZ4 frames, each with its own options."""
    cuts = sorted(rng.randrange(len(section) + 1) for _ in range(rng.choice([0, 0, 1, 2])))
    pieces = [section[start:end] for start, end in zip([0, *cuts], [*cuts, len(section)],
                                                       strict=True)]
    out = bytearray()
    for piece in pieces:
        if rng.random() < 0.1:
            skipped = rng.randbytes(rng.randint(0, 20))
            out += struct.pack("<II", SKIPPABLE_FRAME_MAGIC | rng.randrange(16), len(skipped))
            out += skipped
        out += lz4.frame.compress(
            piece, block_size=rng.choice(BLOCK_SIZES), block_linked=rng.random() < 0.5,
            content_checksum=rng.random() < 0.3, block_checksum=rng.random() < 0.3,
            store_size=rng.random() < 0.3)
    return bytes(out)


def _damaged_frames(rng: random.Random, frames: bytes) -> bytes:
    kind = rng.choice(["none"] * 6 + ["flip", "cut"])
    damaged = bytearray(frames)
    if kind == "flip":
        damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
    elif kind == "cut":
        del damaged[rng.randrange(len(damaged)):]
    return bytes(damaged)


def lz4_batch(header_of: bytes, frames: bytes) -> bytearray:
    """The uncompressed batch ``header_of``'s header with ``frames`` as its lz4 records
    section, length and CRC-32C set."""
    batch = bytearray(header_of[:BATCH_HEADER_BYTES]) + frames
    batch[ATTRIBUTES_OFFSET + 1] |= compression.LZ4
    struct.pack_into(">i", batch, 8, len(batch) - 12)
    struct.pack_into(">I", batch, CRC_OFFSET, crc32c.crc32c(bytes(batch[ATTRIBUTES_OFFSET:])))
    return batch


def case(seed: int, index: int) -> tuple[bytearray, tuple, int]:
    """The batch, checks and section buffer size of case ``index`` of ``seed``."""
    rng = random.Random(seed * 1_000_003 + index)
    plain = build_batch(_records(rng))
    section = _damaged_section(rng, plain[BATCH_HEADER_BYTES:])
    frames = _damaged_frames(rng, _frames(rng, section))
    out_bytes = rng.choice([len(section) + 1, len(section), 8 << 20]) if section else 1 << 20
    return lz4_batch(plain, frames), _checks(rng), out_bytes


def outcome(answer) -> tuple:
    """What a path answered, comparable across paths."""
    if isinstance(answer, kernel.RecordsRejected):
        return ("rejected", answer.args)
    if isinstance(answer, InvalidRecord):
        return ("invalid", answer.message)
    return answer


def general_path(batch: bytearray, checks: tuple, out_bytes: int) -> tuple:
    """The general path's answer: ("ok", max timestamp, the batch after) or its error; data
    it cannot inflate within ``out_bytes - 1`` bytes is ("declined",)."""
    buf = bytearray(batch)
    try:
        section = compression.decompress_bounded(compression.LZ4, buf[BATCH_HEADER_BYTES:],
                                                 out_bytes - 1)
    except (CorruptMessage, MessageTooLarge):
        return ("declined",)
    try:
        return ("ok", kernel.check_compressed_records(buf, 0, section, checks), bytes(buf))
    except (kernel.RecordsRejected, InvalidRecord) as error:
        return outcome(error)


def one_pass(batch: bytearray, checks: tuple, out_bytes: int) -> tuple:
    buf, out = bytearray(batch), bytearray(out_bytes)
    try:
        answer = kernel.check_lz4_records(buf, 0, out, checks)
    except (kernel.RecordsRejected, InvalidRecord) as error:
        return outcome(error)
    if answer is None:
        return ("declined",)
    max_timestamp, section_bytes = answer
    assert bytes(out[:section_bytes]) == compression.decompress(
        compression.LZ4, batch[BATCH_HEADER_BYTES:])
    return ("ok", max_timestamp, bytes(buf))


def test_the_one_pass_answers_as_the_general_path_on_seeded_cases():
    seen = set()
    for index in range(CASES):
        batch, checks, out_bytes = case(SEED, index)
        expected = general_path(batch, checks, out_bytes)
        assert one_pass(batch, checks, out_bytes) == expected, f"seed {SEED} case {index}"
        seen.add(expected[0])
    assert seen == {"ok", "declined", "invalid", "rejected"}  # every outcome was reached


def test_records_straddling_blocks_of_linked_and_independent_frames_are_checked_whole():
    records = [(f"k{i}".encode(), bytes([i]) * 90_000, [], NOW_MS + i) for i in range(8)]
    plain = build_batch(records)
    checks = (True, True, True, NOW_MS, 10_000, 10_000)
    for linked in (False, True):
        frames = lz4.frame.compress(plain[BATCH_HEADER_BYTES:], block_linked=linked,
                                    block_size=lz4.frame.BLOCKSIZE_MAX64KB)
        batch = lz4_batch(plain, frames)
        max_timestamp, section_bytes = kernel.check_lz4_records(batch, 0, bytearray(1 << 20),
                                                                checks)
        assert (max_timestamp, section_bytes) == (NOW_MS + 7, len(plain) - BATCH_HEADER_BYTES)


def test_a_record_error_before_a_cut_frame_is_corrupt_data_first():
    """Record 0 has a wrong offset delta and the frame is cut short after its last block:
    the general path finds the data corrupt before it reads a record, so the one pass, which
    meets the record first, declines."""
    records = [(b"k", bytes(range(256)) * 400, [], NOW_MS) for _ in range(4)]
    plain = bytearray(build_batch(records))
    # record 0: length (3 bytes), attributes, timestamp delta, offset delta: 1 (zigzag 2)
    plain[BATCH_HEADER_BYTES + 5] = 2
    frames = bytearray(lz4.frame.compress(plain[BATCH_HEADER_BYTES:], block_linked=False,
                                          block_size=lz4.frame.BLOCKSIZE_MAX64KB))
    checks = (False, False, True, NOW_MS, 0, 0)
    whole = lz4_batch(plain, bytes(frames))
    with pytest.raises(InvalidRecord, match="offset delta 1, expected 0"):
        kernel.check_lz4_records(whole, 0, bytearray(1 << 20), checks)
    del frames[-4:]  # the end mark
    assert kernel.check_lz4_records(lz4_batch(plain, bytes(frames)), 0, bytearray(1 << 20),
                                    checks) is None


def test_a_section_filling_the_buffer_exactly_is_declined_as_too_large():
    plain = build_batch([(b"k", bytes(5000), [], NOW_MS)])
    section_bytes = len(plain) - BATCH_HEADER_BYTES
    batch = lz4_batch(plain, lz4.frame.compress(plain[BATCH_HEADER_BYTES:]))
    checks = (False, False, True, NOW_MS, 0, 0)
    assert kernel.check_lz4_records(batch, 0, bytearray(section_bytes), checks) is None
    assert kernel.check_lz4_records(batch, 0, bytearray(section_bytes + 1), checks)[1] == (
        section_bytes)


@pytest.mark.parametrize("position, codec", [(-1, compression.LZ4), (1, compression.LZ4),
                                             (0, compression.ZSTD)])
def test_anything_but_a_whole_lz4_batch_at_the_position_is_a_usage_error(position, codec):
    plain = build_batch([(b"k", b"v", [], NOW_MS)])
    batch = lz4_batch(plain, lz4.frame.compress(plain[BATCH_HEADER_BYTES:]))
    batch[ATTRIBUTES_OFFSET + 1] = codec
    with pytest.raises(ValueError):
        kernel.check_lz4_records(batch, position, bytearray(1 << 20),
                                 (False, False, True, NOW_MS, 0, 0))


def test_a_frame_cut_short_does_not_spoil_the_threads_next_frame():
    """liblz4 1.9.4's decoder reset keeps a cut frame's remaining content size; a reused
    decoder would refuse the next frame that declares none."""
    plain = build_batch([(b"k", bytes(range(256)) * 40, [], NOW_MS) for _ in range(10)])
    section = plain[BATCH_HEADER_BYTES:]
    cut = lz4.frame.compress(section, store_size=True)[:-200]
    checks = (False, False, True, NOW_MS, 0, 0)
    assert kernel.check_lz4_records(lz4_batch(plain, cut), 0, bytearray(1 << 20), checks) is None
    plain_frame = lz4_batch(plain, lz4.frame.compress(section, store_size=False))
    assert kernel.check_lz4_records(plain_frame, 0, bytearray(1 << 20), checks) == (
        NOW_MS, len(section))
