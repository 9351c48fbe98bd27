"""The history file format: what is dumped loads back equal, and bad types are refused."""

from __future__ import annotations

import pytest

from headrace.faults.history import INVOKE, OK, History, Op, dump, load


def test_a_history_round_trips_through_its_jsonl_file(tmp_path):
    history = History()
    history.record(INVOKE, "producer-0", "send", "v-1", partition=2)
    history.record(OK, "producer-0", "send", "v-1", partition=2, offset=7)
    history.record(OK, "drain", "poll", [[2, 7, "v-1"]])
    path = tmp_path / "history.jsonl"
    dump(history.ops(), path)
    assert load(path) == history.ops()
    assert len(path.read_text().splitlines()) == 3
    assert [op.index for op in load(path)] == [0, 1, 2]


def test_an_unknown_operation_type_is_refused():
    with pytest.raises(ValueError):
        Op(0, "maybe", "p", 0, "send")
