"""The Spark encoder's size and capacity checks: row counts whose byte sizes overflow 64 bits, and
the fixed array of buffers a call holds while its GIL is released (``HELD_VIEWS_MAX``).

Calls that crashed the process before their check existed run in a child interpreter, so a
regression fails this test instead of killing the test run.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest

from headrace.spark import encoder
from headrace.spark.encoder import (
    BinaryColumn,
    HeaderColumn,
    ProducerFields,
    StickyPartition,
    encode_batches,
    partition_rows,
)

CHILD_TIMEOUT_S = 60
ROWS_OVERFLOWING_SIZE = 2**62  # 4-byte rows: 2**64 bytes, 0 after a 64-bit wrap
ROWS_PAST_ANY_MEMORY = 2**61


def _run_child(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=CHILD_TIMEOUT_S)


def _two_row_column() -> BinaryColumn:
    return BinaryColumn(np.array([0, 1, 2], np.int32), b"kv")


@pytest.mark.parametrize("rows", [ROWS_OVERFLOWING_SIZE, ROWS_PAST_ANY_MEMORY])
def test_partition_rows_of_a_huge_row_count_is_a_memory_error_not_a_crash(rows):
    child = _run_child(f"""
        from headrace.spark import _encoder
        try:
            _encoder.partition_rows({rows}, None, None, None, 3, 0, 0, 16384)
        except MemoryError:
            print("MemoryError")
        """)
    assert child.returncode == 0, child.stderr
    assert child.stdout.strip() == "MemoryError"


@pytest.mark.parametrize("rows", [ROWS_OVERFLOWING_SIZE, 2**63 - 1])
def test_a_column_is_never_long_enough_for_an_overflowing_row_count(rows):
    child = _run_child(f"""
        import numpy as np
        from headrace.spark import _encoder
        column = (np.array([0, 1], np.int32), b"k", None)
        for call in (lambda: _encoder.partition_rows({rows}, column, column, None, 3, 0, 0, 1),
                     lambda: _encoder.partition_rows({rows}, None, None,
                                                    np.zeros(1, np.int32), 3, 0, 0, 1),
                     lambda: _encoder.encode_batches({rows}, column, column, None, None,
                                                    np.zeros(1, np.int32), 0, (-1, -1, 0),
                                                    0, 1 << 20)):
            try:
                call()
            except ValueError as error:
                print(error)
        """)
    assert child.returncode == 0, child.stderr
    short_column = "a binary column is shorter than its row count"
    assert child.stdout.splitlines() == [
        short_column, "the partition column is shorter than its row count", short_column]


def test_the_explicit_partition_column_must_cover_every_row():
    with pytest.raises(ValueError, match="partition column is shorter"):
        partition_rows(2, None, _two_row_column(), np.zeros(1, np.int32), 3,
                       StickyPartition(0), 1)


def _every_column_spec(rows: int) -> dict:
    """Arguments of encode_batches holding the most buffers one call can hold."""
    column = BinaryColumn(np.arange(rows + 1, dtype=np.int32), b"x" * rows,
                          np.ones(rows, np.bool_))
    header_keys = BinaryColumn(np.arange(rows + 1, dtype=np.int32), b"h" * rows)
    headers = HeaderColumn(np.arange(rows + 1, dtype=np.int32), np.ones(rows, np.bool_),
                           header_keys, column)
    return dict(rows=rows, keys=column, values=column, headers=headers,
                extra_header=(b"extra", b"header"), selection=np.arange(rows, dtype=np.int32),
                timestamp_ms=0, producer=ProducerFields(), codec=0, max_batch_bytes=1 << 20)


BUFFERS_OF_THE_FULLEST_CALL = 17  # keys 3, values 3, headers 2 + 3 + 3, extra 2, selection 1


@pytest.mark.skipif(encoder.HELD_VIEWS_MAX < BUFFERS_OF_THE_FULLEST_CALL,
                    reason="a test build with a shrunken HELD_VIEWS_MAX")
def test_the_fullest_encode_call_fits_the_held_views():
    encoded = encode_batches(**_every_column_spec(3))
    assert encoded.bounds[:, 2].sum() == 3


@pytest.mark.skipif(encoder.HELD_VIEWS_MAX >= BUFFERS_OF_THE_FULLEST_CALL,
                    reason="reachable only in the sanitizer run's shrunken-capacity build")
def test_more_buffers_than_held_views_max_is_a_value_error():
    with pytest.raises(ValueError, match=f"more than {encoder.HELD_VIEWS_MAX} buffers"):
        encode_batches(**_every_column_spec(3))
