"""The pure offset plans: ranges, data-loss checks, minPartitions splits, rate limits."""

from __future__ import annotations

import pytest

from headrace.errors import OffsetOutOfRange, UnknownTopicOrPartition
from headrace.spark.offsets import (
    OffsetRange,
    offsets_from_json,
    offsets_to_json,
    plan_ranges,
    rate_limit,
    split_ranges,
)
from headrace.spark.options import OptionError, parse_source_options

BOOTSTRAP = {"kafka.bootstrap.servers": "127.0.0.1:1"}


def test_json_offsets_round_trip():
    offsets = {("t", 0): 5, ("t", 11): 7, ("u", 1): 0}
    assert offsets_to_json(offsets) == {"t": {"0": 5, "11": 7}, "u": {"1": 0}}
    assert offsets_from_json(offsets_to_json(offsets)) == offsets


def test_plan_starts_new_partitions_at_zero_and_drops_empty_ranges():
    ranges = plan_ranges({("t", 0): 4, ("t", 1): 9}, {("t", 0): 8, ("t", 1): 9, ("t", 2): 3},
                         fail_on_data_loss=True)
    assert ranges == [OffsetRange("t", 0, 4, 8), OffsetRange("t", 2, 0, 3)]


def test_plan_reports_rewound_and_deleted_partitions():
    with pytest.raises(OffsetOutOfRange, match="changed from 9 to 2"):
        plan_ranges({("t", 0): 9}, {("t", 0): 2}, fail_on_data_loss=True)
    with pytest.raises(UnknownTopicOrPartition, match="t-1 are gone"):
        plan_ranges({("t", 0): 1, ("t", 1): 1}, {("t", 0): 2}, fail_on_data_loss=True)
    assert plan_ranges({("t", 0): 9, ("t", 1): 1}, {("t", 0): 2},
                       fail_on_data_loss=False) == []


def test_split_follows_sizes_and_covers_every_offset():
    ranges = [OffsetRange("t", 0, 0, 90), OffsetRange("t", 1, 100, 110)]
    split = split_ranges(ranges, min_partitions=10)
    assert [(r.partition, r.from_offset, r.until_offset) for r in split if r.partition == 1] == [
        (1, 100, 110)]
    assert len([r for r in split if r.partition == 0]) == 9
    assert sum(r.size for r in split) == 100
    assert split_ranges(ranges, min_partitions=2) == ranges


def test_rate_limit_shares_by_backlog_and_never_starves():
    start = {("t", 0): 0, ("t", 1): 10}
    latest = {("t", 0): 1000, ("t", 1): 11, ("t", 2): 5}
    limited = rate_limit(100, start, latest)
    assert limited == {("t", 0): 99, ("t", 1): 11, ("t", 2): 1}
    assert rate_limit(100, latest, latest) == latest


def test_options_follow_sparks_rules():
    with pytest.raises(OptionError, match="exactly one"):
        parse_source_options(BOOTSTRAP, streaming=False)
    with pytest.raises(OptionError, match="not valid for batch"):
        parse_source_options({**BOOTSTRAP, "subscribe": "t", "startingoffsets": "latest"},
                             streaming=False)
    with pytest.raises(OptionError, match="not supported"):
        parse_source_options({**BOOTSTRAP, "subscribe": "t", "kafka.auto.offset.reset": "x"},
                             streaming=True)
    parsed = parse_source_options(
        {**BOOTSTRAP, "assign": '{"t": [1, 0]}', "startingoffsets": '{"t": {"0": -2, "1": 3}}',
         "minpartitions": "4", "failondataloss": "false"}, streaming=True)
    assert parsed.subscription.assigned == (("t", 0), ("t", 1))
    assert parsed.starting.partition_values() == {("t", 0): -2, ("t", 1): 3}
    assert (parsed.min_partitions, parsed.fail_on_data_loss) == (4, False)
