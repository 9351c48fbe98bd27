"""OffsetMap against a dict: latest offset per key hash, capacity, and filling up."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from headrace.storage.offset_map import NOT_FOUND, SLOT_BYTES, OffsetMap


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=1, max_size=300), st.integers(0, 1 << 40))
def test_offset_map_matches_a_dict(key_ids, base_offset):
    rng = np.random.default_rng(len(key_ids))
    hashes = rng.integers(0, 2**64, size=(41, 2), dtype=np.uint64)
    hashes[0, 0] = 0  # an h1 of zero is a valid key too
    ids = np.array(key_ids)
    offsets = base_offset + np.arange(len(ids), dtype=np.int64) * 3
    offset_map = OffsetMap(64 * SLOT_BYTES)
    offset_map.clear(base_offset)
    assert offset_map.put(hashes[ids, 0], hashes[ids, 1], offsets) == len(ids)
    expected = {}
    for key_id, offset in zip(key_ids, offsets.tolist(), strict=True):
        expected[key_id] = offset
    got = offset_map.get(hashes[:, 0], hashes[:, 1])
    assert got.tolist() == [expected.get(i, NOT_FOUND) for i in range(41)]
    assert offset_map.size == len(expected)


def test_map_reports_full_at_the_load_factor():
    offset_map = OffsetMap(1000 * SLOT_BYTES, load_factor=0.5)
    offset_map.clear(0)
    rng = np.random.default_rng(3)
    hashes = rng.integers(0, 2**64, size=(800, 2), dtype=np.uint64)
    taken = offset_map.put(hashes[:, 0], hashes[:, 1], np.arange(800, dtype=np.int64))
    assert taken == 500 == offset_map.size
    assert offset_map.utilization == 0.5
    assert offset_map.get(hashes[:500, 0], hashes[:500, 1]).tolist() == list(range(500))
    assert offset_map.get(hashes[600:601, 0], hashes[600:601, 1]).tolist() == [NOT_FOUND]


def test_same_fingerprint_different_home_is_a_different_key():
    offset_map = OffsetMap(1000 * SLOT_BYTES)
    offset_map.clear(0)
    h1 = np.array([42, 42], np.uint64)
    h2 = np.array([0, 0x80000000], np.uint64)  # homes at opposite ends of the table
    offset_map.put(h1, h2, np.array([5, 9], np.int64))
    assert offset_map.get(h1, h2).tolist() == [5, 9]
    assert offset_map.size == 2

