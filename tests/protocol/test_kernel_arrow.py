"""Tests for headrace.protocol.kernel.decode_arrow: Arrow buffers written in place.

Reference: the pure-Python v2 decoder of tests/protocol/test_kernel.py (itself checked against
kafka-python), over hypothesis-generated logs with every codec, null keys and values, offset
gaps, control batches and LogAppendTime; the filled buffers are read back through pyarrow.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.errors import CorruptMessage
from headrace.protocol import kernel
from tests.protocol.test_kernel import logs, reference_decode, simple_batch

MICROS_PER_MILLI = 1000
PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _decode(buf: bytes, from_offset: int = -(2**63), until_offset: int = 2**63 - 1,
            region: bytearray | None = None, **flags) -> list[tuple]:
    """decode_arrow's rows as (offset, timestamp ms, type, key, value) read through Arrow."""
    plan = kernel.plan_arrow_decode(buf, skip_control=flags.pop("skip_control", True))
    if region is None:
        region = bytearray(kernel.arrow_region_bytes(plan))
    out = kernel.arrow_buffers_in(region, plan)
    filled = kernel.decode_arrow(buf, plan, out, from_offset, until_offset, **flags)
    count = filled.count
    keys = pa.Array.from_buffers(pa.binary(), count, [
        pa.py_buffer(out.key_validity), pa.py_buffer(out.key_offsets),
        pa.py_buffer(out.key_data[:filled.key_bytes])])
    values = pa.Array.from_buffers(pa.binary(), count, [
        pa.py_buffer(out.value_validity), pa.py_buffer(out.value_offsets),
        pa.py_buffer(out.value_data[:filled.value_bytes])])
    keys.validate(full=True)
    values.validate(full=True)
    assert (filled.key_null_count, filled.value_null_count) == (keys.null_count,
                                                                values.null_count)
    offsets = np.frombuffer(out.offsets, np.int64, count).tolist()
    timestamps_us = np.frombuffer(out.timestamps_us, np.int64, count).tolist()
    types = np.frombuffer(out.timestamp_types, np.int32, count).tolist()
    return list(zip(offsets, [t // MICROS_PER_MILLI for t in timestamps_us], types,
                    keys.to_pylist(), values.to_pylist(), strict=True))


def _expected(buf: bytes, from_offset: int, until_offset: int,
              skip_control: bool = True) -> list[tuple]:
    return [(r.offset, r.timestamp_ms, r.timestamp_type, r.key, r.value)
            for r in reference_decode(buf, skip_control)[0]
            if from_offset <= r.offset < until_offset]


@PROPERTY
@given(logs(), st.data(), st.booleans())
def test_decode_arrow_matches_reference_within_any_range(log, data, skip_control):
    buf, _ = log
    offsets = [r.offset for r in reference_decode(buf, skip_control=False)[0]] or [0]
    first, last = min(offsets), max(offsets)
    from_offset = data.draw(st.integers(first - 2, last + 2) | st.just(-(2**63)))
    until_offset = data.draw(st.integers(from_offset, last + 3) | st.just(2**63 - 1))
    assert _decode(buf, from_offset, until_offset, skip_control=skip_control) == _expected(
        buf, from_offset, until_offset, skip_control)


def test_plan_bounds_records_and_bytes_and_says_where_batches_end():
    buf = simple_batch() * 2 + simple_batch()[:20]
    plan = kernel.plan_arrow_decode(buf)
    assert plan.max_records == 6
    assert plan.max_data_bytes >= 2 * len(simple_batch())
    assert plan.bytes_consumed == 2 * len(simple_batch())
    assert plan.next_offset == 104


def test_a_reused_region_is_overwritten_completely():
    region = bytearray(b"\xff") * kernel.arrow_region_bytes(kernel.plan_arrow_decode(
        simple_batch()))
    first = _decode(simple_batch(), region=region)
    assert _decode(simple_batch(), region=region) == first == _expected(
        simple_batch(), 0, 2**40)


def test_too_small_buffers_raise_instead_of_overrunning():
    buf = simple_batch()
    plan = kernel.plan_arrow_decode(buf)
    small = kernel.ArrowDecodePlan(2, plan.max_data_bytes, plan.sections, True,
                                   plan.next_offset, plan.bytes_consumed)
    out = kernel.arrow_buffers_in(bytearray(kernel.arrow_region_bytes(small)), small)
    with pytest.raises(ValueError, match="more records than the 2 rows"):
        kernel.decode_arrow(buf, small, out, 0, 2**40)
    tight = kernel.ArrowDecodePlan(3, 1, plan.sections, True, plan.next_offset,
                                   plan.bytes_consumed)
    out = kernel.arrow_buffers_in(bytearray(kernel.arrow_region_bytes(tight)), tight)
    with pytest.raises(ValueError, match="exceeds the 1 bytes"):
        kernel.decode_arrow(buf, tight, out, 0, 2**40)
    with pytest.raises(ValueError, match="region of 8 bytes"):
        kernel.arrow_buffers_in(bytearray(8), plan)


def test_crc_is_checked_once_per_batch_unless_disabled():
    corrupt = bytearray(simple_batch())
    corrupt[corrupt.index(b"\x021") + 1] = ord("9")  # the first value: records still parse
    with pytest.raises(CorruptMessage, match="CRC-32C"):
        _decode(bytes(corrupt))
    assert [row[4] for row in _decode(bytes(corrupt), verify_crc=False)] == [b"9", b"2", None]


def test_read_only_output_is_rejected():
    buf = simple_batch()
    plan = kernel.plan_arrow_decode(buf)
    out = kernel.arrow_buffers_in(bytes(kernel.arrow_region_bytes(plan)), plan)
    with pytest.raises(TypeError):
        kernel.decode_arrow(buf, plan, out, 0, 2**40)
