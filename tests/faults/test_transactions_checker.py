"""The transactional checker on hand-made histories, each holding exactly one anomaly (or none):
aborted reads (G1a), circular information flow (G1c), lost committed writes."""

from __future__ import annotations

from headrace.faults.checkers.transactions import check
from headrace.faults.history import FAIL, INFO, INVOKE, OK, build
from tests.faults.anomalies import only


def txn(process, outcome, sends, reads=()):
    """A transaction: ``sends`` [(partition, value, offset)], ``reads`` [(p, offset, v)]."""
    value = {"sends": [list(send) for send in sends], "reads": [list(r) for r in reads]}
    return [(INVOKE, process, "txn", {"sends": [[p, v, None] for p, v, _ in sends]}),
            (outcome, process, "txn", value)]


def poll(process, *records):
    return [(INVOKE, process, "poll"), (OK, process, "poll", [list(r) for r in records])]


def test_a_clean_history_passes():
    rows = [*txn("t0", OK, [(0, "a", 0), (1, "b", 0)]),
            *txn("t1", FAIL, [(0, "x", 1)]),
            *txn("t1", OK, [(0, "c", 3)], reads=[(1, 0, "b")]),
            *poll("consumer", (0, 0, "a"), (0, 3, "c")),
            *poll("drain", (0, 0, "a"), (0, 3, "c"), (1, 0, "b"))]
    result = check(build(rows))
    assert result.valid, result.anomalies
    assert (result.committed, result.aborted, result.acked) == (2, 1, 3)


def test_a_poll_returning_a_value_of_an_aborted_transaction_is_an_aborted_read():
    rows = [*txn("t0", FAIL, [(0, "x", None)]), *txn("t0", OK, [(0, "a", 2)]),
            *poll("consumer", (0, 0, "x")),
            *poll("drain", (0, 2, "a"))]
    found = only(check(build(rows)), "g1a")
    assert (found["reader"], found["value"], found["aborted_txn"]) == ("consumer", "x", 1)


def test_a_transaction_reading_an_aborted_value_is_an_aborted_read():
    rows = [*txn("t0", FAIL, [(0, "x", None)]),
            *txn("t1", OK, [(1, "b", 0)], reads=[(0, 0, "x")]),
            *poll("drain", (1, 0, "b"))]
    assert only(check(build(rows)), "g1a")["reader"] == "t1"


def test_a_value_of_a_transaction_whose_outcome_is_unknown_may_be_read():
    rows = [*txn("t0", INFO, [(0, "u", None)]), *poll("consumer", (0, 0, "u")),
            *poll("drain", (0, 0, "u"))]
    assert check(build(rows)).valid


def test_two_transactions_each_reading_what_the_other_wrote_are_a_cycle():
    """T0 wrote a and read b; T1 wrote b and read a: wr edges both ways."""
    rows = [*txn("t0", OK, [(0, "a", 0)], reads=[(1, 0, "b")]),
            *txn("t1", OK, [(1, "b", 0)], reads=[(0, 0, "a")]),
            *poll("drain", (0, 0, "a"), (1, 0, "b"))]
    assert only(check(build(rows)), "g1c") == [1, 3]


def test_a_read_of_a_value_written_later_in_write_order_is_a_cycle():
    """T1 ran first and its c precedes T0's d in partition 1 (T1 -> T0), yet T1 read T0's a
    (T0 -> T1)."""
    rows = [*txn("t1", OK, [(1, "c", 0)], reads=[(0, 0, "a")]),
            *txn("t0", OK, [(0, "a", 0), (1, "d", 1)]),
            *poll("drain", (0, 0, "a"), (1, 0, "c"), (1, 1, "d"))]
    assert only(check(build(rows)), "g1c") == [1, 3]


def test_transactions_open_at_once_may_be_ordered_differently_in_two_partitions():
    """T0 before T1 in partition 0, T1 before T0 in partition 1: both were open at once, and
    Kafka orders each partition by its appends."""
    rows = [(INVOKE, "t0", "txn", {"sends": []}), (INVOKE, "t1", "txn", {"sends": []}),
            (OK, "t0", "txn", {"sends": [[0, "a", 0], [1, "d", 1]], "reads": []}),
            (OK, "t1", "txn", {"sends": [[0, "b", 1], [1, "c", 0]], "reads": []}),
            *poll("drain", (0, 0, "a"), (0, 1, "b"), (1, 0, "c"), (1, 1, "d"))]
    assert check(build(rows)).valid


def test_reads_and_writes_in_one_direction_are_no_cycle():
    rows = [*txn("t0", OK, [(0, "a", 0), (1, "c", 0)]),
            *txn("t1", OK, [(1, "d", 1)], reads=[(0, 0, "a")]),
            *txn("t2", OK, [(0, "e", 1)], reads=[(1, 1, "d")]),
            *poll("drain", (0, 0, "a"), (0, 1, "e"), (1, 0, "c"), (1, 1, "d"))]
    assert check(build(rows)).valid


def test_a_committed_value_the_drain_did_not_read_is_lost():
    rows = [*txn("t0", OK, [(0, "a", 0), (0, "b", 1)]), *poll("drain", (0, 0, "a"))]
    assert only(check(build(rows)), "lost") == {"partition": 0, "value": "b", "txn": 1}


def test_interleaved_writes_of_transactions_open_at_once_are_no_cycle():
    """T0 and T1 were open together: their records interleave in partition 0 (a0 b0 a1 b1),
    which orders neither before the other."""
    rows = [*txn("t0", OK, [(0, "a0", 0), (0, "a1", 2)]),
            *txn("t1", OK, [(0, "b0", 1), (0, "b1", 3)]),
            *poll("drain", (0, 0, "a0"), (0, 1, "b0"), (0, 2, "a1"), (0, 3, "b1"))]
    assert check(build(rows)).valid


def test_a_cycle_through_three_transactions_is_found():
    """T0, T1, T2 one after another in partition 0, and T0 read T2's z."""
    rows = [*txn("t0", OK, [(0, "a", 0)], reads=[(1, 0, "z")]),
            *txn("t1", OK, [(0, "b", 1)]),
            *txn("t2", OK, [(0, "c", 2), (1, "z", 0)]),
            *poll("drain", (0, 0, "a"), (0, 1, "b"), (0, 2, "c"), (1, 0, "z"))]
    assert only(check(build(rows)), "g1c") == [1, 3, 5]
