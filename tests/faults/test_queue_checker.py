"""The queue checker on hand-made histories, each holding exactly one anomaly (or none)."""

from __future__ import annotations

from headrace.faults.checkers.queue import QueueExpectations, check
from headrace.faults.history import INFO, INVOKE, OK, build
from tests.faults.anomalies import only


def send(process, value, partition, offset):
    return [(INVOKE, process, "send", value, partition), (OK, process, "send", value, partition,
                                                           offset)]


def poll(process, *records):
    return [(INVOKE, process, "poll"), (OK, process, "poll", [list(r) for r in records])]


def clean_rows():
    return [*send("p0", "a", 0, 0), *send("p0", "b", 0, 1), *send("p1", "c", 1, 0),
            *poll("c-assign", (0, 0, "a"), (0, 1, "b")), *poll("c-assign", (1, 0, "c")),
            *poll("drain", (0, 0, "a"), (0, 1, "b"), (1, 0, "c"))]


def test_a_clean_history_passes():
    result = check(build(clean_rows()))
    assert result.valid, result.anomalies
    assert (result.acked, result.read) == (3, 3)


def test_an_acknowledged_write_the_drain_never_read_is_lost():
    rows = [*send("p0", "a", 0, 0), *send("p0", "b", 0, 1), *poll("drain", (0, 0, "a"))]
    assert only(check(build(rows)), "lost") == "b"


def test_an_indeterminate_send_never_read_is_not_lost():
    rows = [*send("p0", "a", 0, 0), (INVOKE, "p0", "send", "b", 0),
            (INFO, "p0", "send", "b", 0), *poll("drain", (0, 0, "a"))]
    assert check(build(rows)).valid


def test_a_value_read_at_two_offsets_is_duplicated():
    rows = [*send("p0", "a", 0, 0), *poll("drain", (0, 0, "a"), (0, 1, "a"))]
    assert only(check(build(rows)), "duplicated") == {"value": "a", "at": [(0, 0), (0, 1)]}


def test_duplicates_of_a_non_idempotent_producer_are_counted_not_anomalies():
    rows = [*send("p0", "a", 0, 0), *poll("drain", (0, 0, "a"), (0, 1, "a"))]
    result = check(build(rows), QueueExpectations(non_idempotent_processes=frozenset({"p0"})))
    assert result.valid
    assert result.duplicated_non_idempotent == 1


def test_two_consumers_seeing_different_values_at_one_offset_is_inconsistent():
    rows = [(INVOKE, "p0", "send", "a", 0), (INFO, "p0", "send", "a", 0),
            (INVOKE, "p0", "send", "b", 0), (INFO, "p0", "send", "b", 0),
            *poll("c-assign", (0, 0, "a")), *poll("drain", (0, 0, "b"))]
    assert only(check(build(rows)), "inconsistent") == {"partition": 0, "offset": 0,
                                                       "values": ["a", "b"]}


def test_a_consumer_polling_an_offset_again_is_nonmonotonic():
    rows = clean_rows() + poll("c-assign", (0, 1, "b"))
    assert only(check(build(rows)), "nonmonotonic") == {"process": "c-assign", "partition": 0,
                                                       "from": 1, "to": 1}


def test_an_assignment_change_lets_a_consumer_go_back():
    rows = clean_rows() + [(INFO, "c-assign", "assign", [0])] + poll("c-assign", (0, 0, "a"))
    assert check(build(rows)).valid


def test_a_consumer_jumping_over_a_stored_record_skipped_it():
    rows = [*send("p0", "a", 0, 0), *send("p0", "b", 0, 1), *send("p0", "c", 0, 2),
            *poll("c-subscribe", (0, 0, "a")), *poll("c-subscribe", (0, 2, "c")),
            *poll("drain", (0, 0, "a"), (0, 1, "b"), (0, 2, "c"))]
    assert only(check(build(rows)), "skipped") == {"process": "c-subscribe", "partition": 0,
                                                  "from": 0, "to": 2}


def power_cut():
    return (INFO, "nemesis", "power-cut", None)


def test_a_power_cut_may_drop_an_acknowledged_suffix_when_allowed():
    rows = [*send("p0", "a", 0, 0), *send("p0", "b", 0, 1), *send("p0", "c", 0, 2),
            *poll("c-assign", (0, 0, "a"), (0, 1, "b"), (0, 2, "c")), power_cut(),
            *send("p0", "d", 0, 1), *poll("c-assign", (0, 1, "d")),
            *poll("drain", (0, 0, "a"), (0, 1, "d"))]
    allowed = check(build(rows), QueueExpectations(unsynced_loss_allowed=True))
    assert allowed.valid, allowed.anomalies
    assert allowed.truncated == 2
    strict = check(build(rows))
    assert strict.counts()["lost"] == 2


def test_a_power_cut_never_excuses_a_hole():
    rows = [*send("p0", "a", 0, 0), *send("p0", "b", 0, 1), *send("p0", "c", 0, 2),
            power_cut(), *poll("drain", (0, 0, "a"), (0, 2, "c"))]
    result = check(build(rows), QueueExpectations(unsynced_loss_allowed=True))
    assert result.anomalies["lost"] == ["b"]
