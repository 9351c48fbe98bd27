"""A seeded fuzzer over the Spark encoder's entry points that read column buffers.

Random Arrow column buffers -- usually valid, sometimes with offsets out of order, negative or
past the data, short data or validity, a claimed row or header count larger than the buffers
hold -- go straight to the C functions (``_encoder.partition_rows`` and
``_encoder.encode_batches``, below the Python face's argument shaping). The only outcomes
allowed are a result or the documented exceptions (the batch fuzzer's, and MemoryError for a
row count past any memory); a crash fails the run, and under
``make kernel-asan`` so does any out-of-bounds access or undefined behaviour. A failure names
its seed and case index.
"""

from __future__ import annotations

import random

import numpy as np

from headrace.spark import _encoder
from tests.protocol.test_kernel_fuzz import EXPECTED_ERRORS, FUZZ_SEED, NOW_MS, _expect_clean

COLUMN_CASES = 1500
# a row count past any memory with no column to check it against (a column of nulls)
COLUMN_ERRORS = (*EXPECTED_ERRORS, MemoryError)


def _random_column(rng: random.Random, rows: int):
    """An Arrow binary column spec, usually valid, sometimes with broken offsets/lengths."""
    if rng.random() < 0.1:
        return None
    lengths = [rng.choice([0, 0, 1, 3, 17]) for _ in range(rows)]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    data = rng.randbytes(int(offsets[-1]))
    valid = None if rng.random() < 0.5 else np.array(
        [rng.random() < 0.8 for _ in range(rows)], np.bool_)
    breakage = rng.random()
    if breakage < 0.1 and rows:
        offsets[rng.randrange(rows + 1)] = rng.choice([-1, 2**31 - 1, -(2**31)])
    elif breakage < 0.2:
        offsets = offsets[:rng.randrange(len(offsets))]
    elif breakage < 0.25 and data:
        data = data[:-1]
    elif breakage < 0.3 and valid is not None and rows:
        valid = valid[:-1]
    return (np.ascontiguousarray(offsets), data, valid)


def _random_headers(rng: random.Random, rows: int):
    if rng.random() < 0.4:
        return None
    per_row = [rng.randrange(3) for _ in range(rows)]
    list_offsets = np.concatenate([[0], np.cumsum(per_row)]).astype(np.int32)
    entries = int(list_offsets[-1])
    claimed_entries = entries + (rng.choice([-1, 1, 2**62]) if rng.random() < 0.1 else 0)
    keys = _random_column(rng, entries) or (np.zeros(1, np.int32), b"", None)
    list_valid = None if rng.random() < 0.5 else np.ones(rows, np.bool_)
    return (list_offsets, list_valid, keys, _random_column(rng, entries), claimed_entries)


def _column_case(rng: random.Random) -> None:
    rows = rng.choice([0, 1, 2, 5, 40])
    claimed_rows = rows if rng.random() < 0.8 else rng.choice([rows + 1, 2**61, 2**62])
    keys, values = _random_column(rng, rows), _random_column(rng, rows)
    explicit = None if rng.random() < 0.5 else np.array(
        [rng.choice([-1, -1, 0, 1, 2, 3, -2]) for _ in range(rows)], np.int32)
    _expect_clean(_encoder.partition_rows, claimed_rows, keys, values, explicit, 3,
                  rng.randrange(3), rng.randrange(100), rng.choice([1, 16, 16384]),
                  errors=COLUMN_ERRORS)
    selection = np.array([rng.choice([0, rows - 1, rows, -1]) for _ in range(rows + 1)],
                         np.int32)
    extra = None if rng.random() < 0.5 else (rng.randbytes(3), rng.randbytes(2))
    _expect_clean(_encoder.encode_batches, claimed_rows, keys, values,
                  _random_headers(rng, rows), extra, selection, NOW_MS,
                  (rng.choice([-1, 7]), 0, 2**31 - 2), 0, rng.choice([61, 100, 1 << 20]),
                  errors=COLUMN_ERRORS)


def test_partition_and_encode_survive_random_column_buffers():
    for case in range(COLUMN_CASES):
        rng = random.Random(f"{FUZZ_SEED}:columns:{case}")
        try:
            _column_case(rng)
        except Exception as error:
            raise AssertionError(f"seed {FUZZ_SEED} column case {case}") from error
