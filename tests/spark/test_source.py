"""Batch reads through spark.read.format("headrace") against a real broker."""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import time

import numpy as np
import pytest
from confluent_kafka import Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from conftest import PEER_IGNORES_TIMESTAMPS, USE_TANSU, append, new_topic, unique_name
from pyspark.sql import functions as F

from headrace.errors import OffsetOutOfRange, RequestTimedOut, UnknownTopicOrPartition
from headrace.protocol.kernel import decode_columns
from headrace.spark.columns import arrow_chunks, source_arrow_schema
from headrace.spark.fetch import COLUMN_REGIONS, read_range
from headrace.spark.offsets import OffsetRange
from headrace.spark.options import parse_source_options
from headrace.spark.wire_fetch import FRAME_REGIONS, FetchClientConfig, PartitionFetchClient

pytestmark = pytest.mark.spark

PREFETCH_THREAD_EXIT_TIMEOUT_S = 30


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


# --- the executor's read path (read_range), without Spark -------------------------------------


def _options(bootstrap, **overrides):
    options = parse_source_options({"kafka.bootstrap.servers": bootstrap, "subscribe": "any",
                                    "includeHeaders": "true", **overrides}, streaming=False)
    return options


def _rows(options, offset_range) -> list[dict]:
    return [row for batch in read_range(options, offset_range) for row in batch.to_pylist()]


@pytest.mark.parametrize("include_headers", ["true", "false"])
def test_read_range_trims_batches_keeps_nulls_and_chunks(bootstrap, include_headers):
    topic = new_topic(bootstrap, 1)
    values = [None if i == 4 else b"v%d" % i for i in range(10)]
    keys = [None if i % 3 == 0 else b"k%d" % i for i in range(10)]
    headers = [[("h", b"%d" % i), ("n", None)] if i % 2 else [] for i in range(10)]
    append(bootstrap, topic, 0, values, keys=keys, headers=headers)
    options = dataclasses.replace(_options(bootstrap, includeHeaders=include_headers),
                                  records_per_arrow_batch=3)
    batches = list(read_range(options, OffsetRange(topic, 0, 2, 9)))
    assert [batch.num_rows for batch in batches] == [3, 3, 1]
    assert {batch.schema for batch in batches} == {
        source_arrow_schema(include_headers == "true")}
    rows = [row for batch in batches for row in batch.to_pylist()]
    assert [row["offset"] for row in rows] == list(range(2, 9))
    assert [row["value"] for row in rows] == values[2:9]
    assert [row["key"] for row in rows] == keys[2:9]
    if include_headers == "true":
        assert [[(h["key"], h["value"]) for h in row["headers"]] for row in rows] == headers[2:9]
    assert {(row["topic"], row["partition"], row["timestampType"]) for row in rows} == {
        (topic, 0, 0)}


def test_read_range_batches_kept_by_the_caller_are_never_overwritten(bootstrap):
    topic = new_topic(bootstrap, 1)
    values = [b"%04d" % i * 64 for i in range(120)]  # 256 bytes each, a batch each
    append(bootstrap, topic, 0, values, batch_per_record=True)
    options = _options(bootstrap, includeHeaders="false",
                       **{"kafka.max.partition.fetch.bytes": "1024"})  # ~3 records a response
    kept = list(read_range(options, OffsetRange(topic, 0, 0, 120)))
    assert len(kept) > COLUMN_REGIONS + FRAME_REGIONS  # more than the pools ever reuse
    assert [row["value"] for batch in kept for row in batch.to_pylist()] == values


def test_read_range_closed_early_ends_its_prefetch_thread(bootstrap):
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v%d" % i for i in range(40)])
    options = dataclasses.replace(_options(bootstrap), records_per_arrow_batch=2)
    batches = read_range(options, OffsetRange(topic, 0, 0, 40))
    assert next(batches).column("offset").to_pylist() == [0, 1]
    [prefetch_thread] = [thread for thread in threading.enumerate()
                         if thread.name == f"headrace-fetch-{topic}-0"]
    batches.close()  # Spark stops reading (a LIMIT): 18 batches never consumed
    prefetch_thread.join(PREFETCH_THREAD_EXIT_TIMEOUT_S)
    assert not prefetch_thread.is_alive()


@pytest.mark.parametrize(("codec", "include_headers"), [
    ("gzip", "true"), ("snappy", "false"), ("lz4", "true"), ("zstd", "false")])
def test_read_range_decodes_compressed_batches(bootstrap, codec, include_headers):
    topic = new_topic(bootstrap, 1)
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                         "linger.ms": 20})
    for index in range(200):
        producer.produce(topic, b"value-%d" % index * 20, key=b"%d" % index, partition=0)
    assert producer.flush(30) == 0
    rows = _rows(_options(bootstrap, includeHeaders=include_headers),
                 OffsetRange(topic, 0, 50, 200))
    assert [row["offset"] for row in rows] == list(range(50, 200))
    assert [row["value"] for row in rows] == [b"value-%d" % i * 20 for i in range(50, 200)]


@pytest.mark.skipif(USE_TANSU, reason="the Tansu peer drops the connection on DeleteRecords")
def test_read_range_below_the_log_start_is_data_loss(bootstrap):
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v%d" % i for i in range(6)], batch_per_record=True)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.delete_records([TopicPartition(topic, 0, 3)]).values():
        future.result(timeout=30)
    with pytest.raises(OffsetOutOfRange, match="the log starts at 3"):
        _rows(_options(bootstrap), OffsetRange(topic, 0, 1, 5))
    tolerant = _options(bootstrap, failOnDataLoss="false")
    assert [row["offset"] for row in _rows(tolerant, OffsetRange(topic, 0, 1, 5))] == [3, 4]


def test_read_range_of_an_unknown_topic_is_data_loss(bootstrap):
    missing = OffsetRange(unique_name("gone"), 0, 0, 5)
    with pytest.raises(UnknownTopicOrPartition, match="failOnDataLoss"):
        _rows(_options(bootstrap), missing)
    assert _rows(_options(bootstrap, failOnDataLoss="false"), missing) == []


def test_read_range_times_out_when_no_broker_answers():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    options = _options(f"127.0.0.1:{closed_port}", **{"kafkaConsumer.pollTimeoutMs": "300"})
    with pytest.raises(RequestTimedOut, match="within 300 ms"):
        _rows(options, OffsetRange("t", 0, 0, 5))


@pytest.mark.skipif(USE_TANSU, reason="the Tansu peer ignores message.timestamp.type")
def test_read_range_gives_log_append_time_batches_the_broker_time(bootstrap):
    topic = unique_name()
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, 1, 1, config={"message.timestamp.type": "LogAppendTime"})
    for future in admin.create_topics([new]).values():
        future.result(timeout=30)
    long_ago_ms = 1_000_000_000_000
    append(bootstrap, topic, 0, [b"a", b"b"], timestamps_ms=[long_ago_ms, long_ago_ms])
    for include_headers in ("true", "false"):
        rows = _rows(_options(bootstrap, includeHeaders=include_headers),
                     OffsetRange(topic, 0, 0, 2))
        assert [row["timestampType"] for row in rows] == [1, 1]
        assert all(row["timestamp"].timestamp() * 1000 > long_ago_ms for row in rows)


def test_arrow_chunks_bound_records_and_bytes(bootstrap):
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v" * 10] * 6, keys=[b"kk"] * 6)  # 12 bytes a record
    client = PartitionFetchClient(
        FetchClientConfig.from_client_options({"bootstrap.servers": bootstrap}), topic, 0)
    try:
        client.send_fetch(0)
        columns = decode_columns(client.receive_fetch().records)
    finally:
        client.close()
    before = columns.key_offsets.astype(np.int64) + columns.value_offsets
    assert list(arrow_chunks(before, 1, 6, max_records=4, max_bytes=1000)) == [(1, 5), (5, 6)]
    assert list(arrow_chunks(before, 0, 6, max_records=4, max_bytes=30)) == [
        (0, 2), (2, 4), (4, 6)]
    assert list(arrow_chunks(before, 0, 2, max_records=4, max_bytes=5)) == [(0, 1), (1, 2)]
