"""Tests for headrace.protocol.buffers.RegionPool: reuse only of regions nothing refers to."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from headrace.protocol.buffers import REGION_ROUNDING_BYTES, RegionPool


def test_a_released_region_is_reused_without_allocating():
    pool = RegionPool(max_regions=2)
    first = pool.take(100)
    address = id(first)
    del first
    assert id(pool.take(50)) == address
    assert pool.allocated_bytes == REGION_ROUNDING_BYTES


def _overwrite_takes(pool: RegionPool, count: int) -> None:
    for _ in range(count):
        np.frombuffer(pool.take(16), np.int64)[:2] = [7, 8]


def test_a_region_any_view_still_refers_to_is_not_handed_out_again():
    pa = pytest.importorskip("pyarrow")  # the Spark source's column buffers
    pool = RegionPool(max_regions=4)
    region = pool.take(16)
    batch = pa.RecordBatch.from_arrays(
        [pa.Array.from_buffers(pa.int64(), 2, [None, pa.py_buffer(memoryview(region)[:16])])],
        names=["n"])
    del region
    _overwrite_takes(pool, 3)
    assert batch.column(0).to_pylist() == [0, 0]
    sliced = batch.slice(1, 1)
    del batch
    _overwrite_takes(pool, 3)
    assert sliced.column(0).to_pylist() == [0]
    assert pool.allocated_bytes == 2 * REGION_ROUNDING_BYTES
    del sliced
    _overwrite_takes(pool, 3)
    assert pool.allocated_bytes == 2 * REGION_ROUNDING_BYTES


def test_a_free_region_too_small_is_replaced_by_a_larger_one():
    pool = RegionPool(max_regions=1)
    pool.take(10)
    large = pool.take(REGION_ROUNDING_BYTES + 1)
    assert len(large) == 2 * REGION_ROUNDING_BYTES
    del large
    assert len(pool.take(10)) == 2 * REGION_ROUNDING_BYTES


def test_beyond_max_regions_fresh_regions_are_not_kept():
    pool = RegionPool(max_regions=1)
    held = pool.take(10)
    extra = pool.take(10)
    assert extra is not held
    del extra
    assert pool.take(10) is not held  # the extra one was not kept; held is still in use
    assert pool.allocated_bytes == 3 * REGION_ROUNDING_BYTES


def test_regions_over_the_kept_size_are_handed_out_but_not_kept():
    pool = RegionPool(max_regions=2, max_kept_region_bytes=REGION_ROUNDING_BYTES)
    large = pool.take(REGION_ROUNDING_BYTES + 1)
    del large
    again = pool.take(REGION_ROUNDING_BYTES + 1)
    assert pool.allocated_bytes == 4 * REGION_ROUNDING_BYTES  # two fresh 2 MiB regions
    del again
    small = pool.take(10)
    small_id = id(small)
    del small
    assert id(pool.take(10)) == small_id  # a kept region is reused
    assert pool.allocated_bytes == 5 * REGION_ROUNDING_BYTES


def test_kept_regions_stay_within_max_kept_bytes():
    pool = RegionPool(max_regions=8, max_kept_bytes=3 * REGION_ROUNDING_BYTES)
    first, second = pool.take(REGION_ROUNDING_BYTES + 1), pool.take(REGION_ROUNDING_BYTES + 1)
    first_id = id(first)
    assert pool.kept_bytes == 2 * REGION_ROUNDING_BYTES  # the second one would exceed it
    del first, second
    again = pool.take(REGION_ROUNDING_BYTES + 1)
    assert id(again) == first_id
    pool.take(REGION_ROUNDING_BYTES + 1)  # fresh: the second one was not kept
    assert pool.allocated_bytes == 6 * REGION_ROUNDING_BYTES and pool.kept_bytes == len(again)


def test_lazily_committed_regions_are_reused_like_bytearrays():
    pool = RegionPool(max_regions=1, lazily_committed=True)
    region = pool.take(100)
    region_id = id(region)
    memoryview(region)[:3] = b"abc"
    del region
    assert id(pool.take(50)) == region_id and pool.allocated_bytes == REGION_ROUNDING_BYTES


def test_concurrent_takers_never_share_a_region():
    pool = RegionPool(max_regions=4)
    taken: list[list[int]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def take_many(index: int) -> None:
        start.wait()
        for _ in range(200):
            region = pool.take(8)
            region[0] = index
            taken[index].append(region[0])
            del region

    threads = [threading.Thread(target=take_many, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [set(values) for values in taken] == [{0}, {1}, {2}, {3}]
