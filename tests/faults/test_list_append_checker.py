"""The list-append checker on hand-made histories, each holding exactly one anomaly (or none)."""

from __future__ import annotations

from headrace.faults.checkers.list_append import ListAppendExpectations, check
from headrace.faults.history import INFO, INVOKE, OK, build
from tests.faults.anomalies import only


def append(value, partition, offset, process="w0"):
    return [(INVOKE, process, "append", value, partition),
            (OK, process, "append", value, partition, offset)]


def read(partition, *values, offsets=None, process="r0"):
    offsets = offsets if offsets is not None else range(len(values))
    return [(INVOKE, process, "read", None, partition),
            (OK, process, "read", [[o, v] for o, v in zip(offsets, values, strict=True)],
             partition)]


def test_a_clean_history_passes():
    rows = [*append("a", 0, 0), *read(0, "a"), *append("b", 0, 1), *append("c", 1, 0),
            *read(0, "a", "b"), *read(1, "c")]
    result = check(build(rows))
    assert result.valid, result.anomalies
    assert (result.acked, result.reads) == (3, 3)


def test_an_acknowledged_append_missing_from_a_later_read_is_lost():
    rows = [*append("a", 0, 0), *append("b", 0, 1), *read(0, "a")]
    assert only(check(build(rows)), "lost") == {"partition": 0, "value": "b"}


def test_a_read_invoked_before_the_acknowledgement_may_miss_it():
    rows = [(INVOKE, "r0", "read", None, 0), *append("a", 0, 0),
            (OK, "r0", "read", [], 0), *read(0, "a", process="r1")]
    assert check(build(rows)).valid


def test_a_value_twice_in_one_read_is_duplicated():
    rows = [*append("a", 0, 0), *read(0, "a", "a")]
    assert only(check(build(rows)), "duplicated") == {"partition": 0, "value": "a"}


def test_another_value_at_an_acknowledged_offset_is_inconsistent():
    rows = [*append("a", 0, 0), (INVOKE, "w1", "append", "b", 0), (INFO, "w1", "append", "b", 0),
            *read(0, "b", "a")]
    assert only(check(build(rows)), "inconsistent") == {"partition": 0, "offset": 0,
                                                       "acked": "a", "read": "b"}


def test_reads_that_are_not_prefixes_of_each_other_diverge():
    rows = [(INVOKE, "w1", "append", "a", 0), (INFO, "w1", "append", "a", 0),
            (INVOKE, "w1", "append", "b", 0), (INFO, "w1", "append", "b", 0),
            *read(0, "a"), *read(0, "b")]
    assert only(check(build(rows)), "divergent") == {"partition": 0, "offset": 0,
                                                    "earlier": "a", "later": "b"}


def test_a_gap_in_a_read_is_skipped():
    rows = [*append("a", 0, 0), *append("b", 0, 2), *read(0, "a", "b", offsets=[0, 2])]
    assert only(check(build(rows)), "skipped") == {"partition": 0, "from": 0, "to": 2}


def test_a_power_cut_may_drop_an_acknowledged_suffix_when_allowed():
    rows = [*append("a", 0, 0), *append("b", 0, 1), *read(0, "a", "b"),
            (INFO, "nemesis", "power-cut", None), *append("c", 0, 1), *read(0, "a", "c")]
    allowed = check(build(rows), ListAppendExpectations(unsynced_loss_allowed=True))
    assert allowed.valid, allowed.anomalies
    assert allowed.truncated == 1
    assert not check(build(rows)).valid


def test_a_power_cut_never_excuses_a_hole():
    rows = [*append("a", 0, 0), *append("b", 0, 1), (INFO, "nemesis", "power-cut", None),
            *read(0, "b", offsets=[1])]
    result = check(build(rows), ListAppendExpectations(unsynced_loss_allowed=True))
    assert result.anomalies["lost"] == [{"partition": 0, "value": "a"}]
