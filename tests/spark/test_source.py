"""Batch reads through spark.read.format("headrace") against a real broker."""

from __future__ import annotations

import json
import time

import pytest
from conftest import PEER_IGNORES_TIMESTAMPS, append, new_topic
from pyspark.sql import functions as F

pytestmark = pytest.mark.spark


def _read(spark, bootstrap, **options):
    reader = spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def _positions(frame) -> list[tuple[int, int, bytes]]:
    rows = frame.select("partition", "offset", "value").collect()
    return sorted((row.partition, row.offset, row.value) for row in rows)


def test_earliest_to_latest_reads_every_column(spark, bootstrap):
    topic = new_topic(bootstrap, 2)
    append(bootstrap, topic, 0, [b"a0", b"a1", b"a2"], keys=[b"k0", b"k1", b"k2"],
           headers=[[("h", b"x")], [], [("h", b"y"), ("g", b"z")]])
    append(bootstrap, topic, 1, [b"b0"], keys=[None], headers=[[]])
    rows = _read(spark, bootstrap, subscribe=topic, includeHeaders="true").collect()
    by_position = {(row.partition, row.offset): row for row in rows}
    assert sorted(by_position) == [(0, 0), (0, 1), (0, 2), (1, 0)]
    assert [by_position[(0, offset)].key for offset in range(3)] == [b"k0", b"k1", b"k2"]
    assert by_position[(1, 0)].key is None and by_position[(1, 0)].value == b"b0"
    assert [(h.key, h.value) for h in by_position[(0, 2)].headers] == [("h", b"y"), ("g", b"z")]
    assert by_position[(0, 1)].headers == []
    assert {row.topic for row in rows} == {topic}
    assert {row.timestampType for row in rows} == {0}


def test_json_offsets_with_sentinels_select_exact_ranges(spark, bootstrap):
    topic = new_topic(bootstrap, 2)
    append(bootstrap, topic, 0, [b"a%d" % i for i in range(6)])
    append(bootstrap, topic, 1, [b"b%d" % i for i in range(4)])
    frame = _read(spark, bootstrap, subscribe=topic,
                  startingOffsets=json.dumps({topic: {"0": 2, "1": -2}}),
                  endingOffsets=json.dumps({topic: {"0": 5, "1": -1}}))
    assert _positions(frame) == [(0, 2, b"a2"), (0, 3, b"a3"), (0, 4, b"a4"),
                                 (1, 0, b"b0"), (1, 1, b"b1"), (1, 2, b"b2"), (1, 3, b"b3")]


def test_assign_reads_only_the_assigned_partition(spark, bootstrap):
    topic = new_topic(bootstrap, 3)
    for partition in range(3):
        append(bootstrap, topic, partition, [b"p%d" % partition])
    frame = _read(spark, bootstrap, assign=json.dumps({topic: [1]}))
    assert _positions(frame) == [(1, 0, b"p1")]


@pytest.mark.skipif(PEER_IGNORES_TIMESTAMPS, reason="the Tansu peer has no timestamp index")
def test_timestamps_select_ranges(spark, bootstrap):
    # recent timestamps: a broker rolls and expires segments whose records are older than
    # segment.ms / retention.ms, as Kafka does
    base_ms = (int(time.time()) - 3600) * 1000
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v%d" % i for i in range(5)],
           timestamps_ms=[base_ms + 1_000 * (i + 1) for i in range(5)], batch_per_record=True)
    by_partition = _read(spark, bootstrap, subscribe=topic,
                         startingOffsetsByTimestamp=json.dumps({topic: {"0": base_ms + 2_500}}),
                         endingOffsetsByTimestamp=json.dumps({topic: {"0": base_ms + 4_500}}))
    assert _positions(by_partition) == [(0, 2, b"v2"), (0, 3, b"v3")]
    global_start = _read(spark, bootstrap, subscribe=topic, startingTimestamp=str(base_ms + 4000))
    assert _positions(global_start) == [(0, 3, b"v3"), (0, 4, b"v4")]
    after_all = str(base_ms + 99_000)
    with pytest.raises(Exception, match="no offset matched the starting timestamp"):
        _read(spark, bootstrap, subscribe=topic, startingTimestamp=after_all).collect()
    latest_strategy = _read(spark, bootstrap, subscribe=topic, startingTimestamp=after_all,
                            startingOffsetsByTimestampStrategy="latest")
    assert latest_strategy.count() == 0


def test_min_partitions_splits_large_ranges(spark, bootstrap):
    topic = new_topic(bootstrap, 1)
    values = [b"v%02d" % i for i in range(10)]
    append(bootstrap, topic, 0, values)
    frame = _read(spark, bootstrap, subscribe=topic, minPartitions="4")
    tasks = frame.select(F.spark_partition_id().alias("task"), "offset").collect()
    assert len({row.task for row in tasks}) == 4
    assert sorted(row.offset for row in tasks) == list(range(10))


def test_data_loss_fails_or_is_skipped(spark, bootstrap):
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v0", b"v1", b"v2"])
    beyond_log_end = json.dumps({topic: {"0": 8}})
    failing = _read(spark, bootstrap, subscribe=topic, endingOffsets=beyond_log_end)
    with pytest.raises(Exception, match="failOnDataLoss"):
        failing.collect()
    tolerant = _read(spark, bootstrap, subscribe=topic, endingOffsets=beyond_log_end,
                     failOnDataLoss="false")
    assert _positions(tolerant) == [(0, 0, b"v0"), (0, 1, b"v1"), (0, 2, b"v2")]
