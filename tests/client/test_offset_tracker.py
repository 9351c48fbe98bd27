"""PartitionOffsets and the done-offset metadata codec (pure logic, property-tested)."""

from hypothesis import given
from hypothesis import strategies as st

from headrace.client.offset_tracker import (
    PartitionOffsets,
    decode_done_offsets,
    encode_done_offsets,
)


def test_seed_003_example():
    p0, p1 = PartitionOffsets(), PartitionOffsets()
    p0.register_fetched(0)
    p1.register_fetched(0)
    p1.register_fetched(1)
    p0.mark_done(0)
    assert p0.committable_offset() == 1
    p1.mark_done(1)
    assert p1.committable_offset() == 0
    p1.mark_done(0)
    assert p1.committable_offset() == 2


def test_nothing_fetched_means_nothing_to_commit():
    assert PartitionOffsets().committable_offset() is None


@given(st.lists(st.integers(0, 5), min_size=1, max_size=60), st.randoms(use_true_random=False))
def test_committable_never_passes_an_unfinished_record(gaps, rng):
    offsets, offset = [], 0
    for gap in gaps:  # compaction and transaction markers leave holes
        offset += gap
        offsets.append(offset)
        offset += 1
    tracker = PartitionOffsets()
    for fetched in offsets:
        tracker.register_fetched(fetched)
    done: set[int] = set()
    for finished in rng.sample(offsets, len(offsets)):
        tracker.mark_done(finished)
        done.add(finished)
        committable = tracker.committable_offset()
        assert all(o in done for o in offsets if o < committable)
        assert committable == min((o for o in offsets if o not in done), default=offsets[-1] + 1)
        metadata = tracker.commit_metadata(4096)
        assert decode_done_offsets(committable, metadata) == {o for o in done if o > committable}


@given(st.integers(0, 2**40), st.sets(st.integers(1, 5000), max_size=200))
def test_metadata_round_trip(committed, relative_done):
    done = {committed + r for r in relative_done}
    assert decode_done_offsets(committed, encode_done_offsets(committed, done)) == done


def test_foreign_or_corrupt_metadata_is_ignored():
    assert decode_done_offsets(5, "") == set()
    assert decode_done_offsets(5, "written by another client") == set()
    assert decode_done_offsets(5, "hr1:!!not base64!!") == set()


def test_metadata_over_the_limit_is_left_out():
    tracker = PartitionOffsets()
    for offset in range(0, 200_000, 2):
        tracker.register_fetched(offset)
    for offset in range(2, 200_000, 4):
        tracker.mark_done(offset)
    assert tracker.committable_offset() == 0
    assert tracker.commit_metadata(64) == ""
    assert decode_done_offsets(0, tracker.commit_metadata(1_000_000)) == set(range(2, 200_000, 4))


def test_skip_offsets_from_a_previous_owner_complete_at_fetch():
    tracker = PartitionOffsets(skip_offsets={11, 12})
    for offset in (10, 11, 12, 13):
        if tracker.should_skip(offset):
            tracker.register_fetched(offset)
            tracker.mark_done(offset)
        else:
            tracker.register_fetched(offset)
    assert tracker.committable_offset() == 10
    tracker.mark_done(10)
    assert tracker.committable_offset() == 13
