"""PartitionOffsets and the done-offset metadata codec (pure logic, property-tested)."""

from hypothesis import given
from hypothesis import strategies as st

from headrace.client.offset_tracker import (
    PartitionOffsets,
    SkipRanges,
    decode_done_ranges,
    encode_done_ranges,
)
from tests.client.done_offsets import decode_done_offsets, encode_done_offsets


def test_seed_003_example():
    p0, p1 = PartitionOffsets(), PartitionOffsets()
    p0_slot = p0.register_fetched(0, 0)
    p1_slot0, p1_slot1 = p1.register_fetched(0, 0), p1.register_fetched(1, 1)
    p0.mark_done(p0_slot, 1)
    assert p0.committable_offset() == 1
    p1.mark_done(p1_slot1, 2)
    assert p1.committable_offset() == 0
    p1.mark_done(p1_slot0, 1)
    assert p1.committable_offset() == 2


def test_nothing_fetched_means_nothing_to_commit():
    assert PartitionOffsets().committable_offset() is None


def test_a_run_across_gaps_completes_as_one_range():
    tracker = PartitionOffsets()
    first_slot = tracker.register_fetched(10, 14)  # e.g. 10, 12, 14 after compaction
    second_slot = tracker.register_fetched(20, 25)
    assert (first_slot, second_slot) == (10, 15)
    tracker.mark_done(second_slot, 26)
    assert tracker.committable_offset() == 10
    assert tracker.done_ranges_above_mark() == [(15, 26)]
    tracker.mark_done(first_slot, 15)
    assert tracker.committable_offset() == 26
    assert tracker.done_ranges_above_mark() == []


@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.randoms(use_true_random=False))
def test_committable_never_passes_an_unfinished_record(gaps, rng):
    offsets, offset = [], 0
    for gap in gaps:  # compaction and transaction markers leave holes
        offset += gap
        offsets.append(offset)
        offset += 1
    tracker = PartitionOffsets()
    slots = {fetched: (tracker.register_fetched(fetched, fetched), fetched + 1)
             for fetched in offsets}
    done: set[int] = set()
    for finished in rng.sample(offsets, len(offsets)):
        tracker.mark_done(*slots[finished])
        done.add(finished)
        committable = tracker.committable_offset()
        prefix = 0
        while prefix < len(offsets) and offsets[prefix] in done:
            prefix += 1
        assert committable == (offsets[prefix - 1] + 1 if prefix else offsets[0])
        assert all(o in done for o in offsets if o < committable)
        skipped = decode_done_offsets(committable, tracker.commit_metadata(4096))
        assert {o for o in done if o > committable} <= skipped
        assert not skipped & (set(offsets) - done)  # a restart never skips an unfinished record


@given(st.integers(0, 2**40), st.sets(st.integers(1, 5000), max_size=200))
def test_metadata_round_trip(committed, relative_done):
    done = {committed + r for r in relative_done}
    assert decode_done_offsets(committed, encode_done_offsets(committed, done)) == done


@given(st.integers(0, 2**40), st.lists(st.tuples(st.integers(1, 3000), st.integers(1, 3000)),
                                        max_size=20))
def test_range_metadata_decodes_to_maximal_sorted_ranges(committed, pairs):
    ranges = [(committed + min(a, b), committed + max(a, b) + 1) for a, b in pairs]
    decoded = decode_done_ranges(committed, encode_done_ranges(committed, ranges))
    assert {o for s, e in decoded for o in range(s, e)} == {o for s, e in ranges
                                                           for o in range(s, e)}
    assert all(e1 < s2 for (_, e1), (s2, _) in zip(decoded, decoded[1:], strict=False))


def test_a_million_done_offsets_fit_the_metadata_limit():
    metadata = encode_done_ranges(0, [(2, 1_000_002)])
    assert len(metadata) <= 4096
    assert decode_done_ranges(0, metadata) == [(2, 1_000_002)]


def test_foreign_or_corrupt_metadata_is_ignored():
    assert decode_done_offsets(5, "") == set()
    assert decode_done_offsets(5, "written by another client") == set()
    assert decode_done_offsets(5, "hr1:!!not base64!!") == set()


def test_metadata_over_the_limit_is_left_out():
    tracker = PartitionOffsets()
    slots = [(tracker.register_fetched(o, o), o + 1) for o in range(0, 200_000, 2)]
    for slot in slots[1::2]:
        tracker.mark_done(*slot)
    assert tracker.committable_offset() == 0
    assert tracker.commit_metadata(64) == ""
    expected = {o for start, end in slots[1::2] for o in range(start, end)}
    assert decode_done_offsets(0, tracker.commit_metadata(1_000_000)) == expected


def test_skip_ranges_answer_membership_and_expire():
    skip = SkipRanges([(20, 25), (11, 13)])
    assert [o for o in range(9, 27) if skip.contains(o)] == [11, 12, 20, 21, 22, 23, 24]
    assert skip.active_below(24) and not skip.active_below(25)
    assert not SkipRanges().active_below(0)
