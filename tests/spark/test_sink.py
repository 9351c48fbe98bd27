"""Writes through df.write / writeStream .format("headrace"), read back with the source."""

from __future__ import annotations

import json

import pytest
from conftest import append, new_topic
from pyspark.sql import Row

from headrace.spark.encoder import murmur2
from headrace.spark.sink import BATCH_ID_HEADER

pytestmark = pytest.mark.spark

HEADERS_SCHEMA = ("value binary, key binary, partition int, "
                  "headers array<struct<key: string, value: binary>>")


def _read_back(spark, bootstrap, topic, partitions_to_end):
    ending = json.dumps({topic: {str(p): end for p, end in partitions_to_end.items()}})
    return (spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", topic).option("includeHeaders", "true")
            .option("endingOffsets", ending).load().collect())


def test_batch_write_round_trips_values_keys_headers_and_partitions(spark, bootstrap):
    topic = new_topic(bootstrap, 2)
    rows = [
        Row(value=b"v0", key=b"k0", partition=0, headers=[Row(key="h", value=b"x")]),
        Row(value=b"v1", key=None, partition=1, headers=[]),
        Row(value=b"v2", key=b"k2", partition=1,
            headers=[Row(key="a", value=b"1"), Row(key="b", value=None)]),
    ]
    frame = spark.createDataFrame(rows, HEADERS_SCHEMA)
    (frame.write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).mode("append").save())
    read = _read_back(spark, bootstrap, topic, {0: 1, 1: 2})
    got = sorted((row.partition, row.value, row.key,
                  [(h.key, h.value) for h in row.headers]) for row in read)
    assert got == [(0, b"v0", b"k0", [("h", b"x")]),
                   (1, b"v1", None, []),
                   (1, b"v2", b"k2", [("a", b"1"), ("b", None)])]


def test_write_without_topic_is_refused(spark, bootstrap):
    frame = spark.createDataFrame([Row(value=b"v")], "value binary")
    with pytest.raises(Exception, match="topic"):
        (frame.write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
         .mode("append").save())


def test_stream_write_marks_records_with_the_batch_id(spark, bootstrap, tmp_path):
    source_topic, sink_topic = new_topic(bootstrap, 1), new_topic(bootstrap, 1)
    append(bootstrap, source_topic, 0, [b"s%d" % i for i in range(4)])
    stream = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", source_topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", "2").load().select("key", "value"))
    query = (stream.writeStream.format("headrace")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", sink_topic)
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    read = _read_back(spark, bootstrap, sink_topic, {0: 4})
    batch_of = {row.value: dict((h.key, h.value) for h in row.headers)[BATCH_ID_HEADER]
                for row in read}
    assert batch_of == {b"s0": b"0", b"s1": b"0", b"s2": b"1", b"s3": b"1"}


def test_topic_column_and_string_columns_are_written_as_utf8(spark, bootstrap):
    first, second = new_topic(bootstrap, 1), new_topic(bootstrap, 1)
    rows = [Row(topic=first, key="ключ", value="значение"), Row(topic=second, key=None,
                                                                 value="b")]
    frame = spark.createDataFrame(rows, "topic string, key string, value string")
    (frame.write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
     .mode("append").save())
    assert [(row.key, row.value) for row in _read_back(spark, bootstrap, first, {0: 1})] == [
        ("ключ".encode(), "значение".encode())]
    assert [(row.key, row.value) for row in _read_back(spark, bootstrap, second, {0: 1})] == [
        (None, b"b")]


def test_undeliverable_records_fail_the_write(spark, bootstrap):
    topic = new_topic(bootstrap, 1)
    frame = spark.createDataFrame([Row(value=b"v", partition=7)], "value binary, partition int")
    with pytest.raises(Exception, match="(?i)unknown partition"):
        (frame.write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", topic).option("kafka.message.timeout.ms", "3000")
         .mode("append").save())


def test_keyed_rows_without_a_partition_go_where_the_java_producer_puts_them(spark, bootstrap):
    topic = new_topic(bootstrap, 3)
    keys = [b"21", b"foobar", b"abc", b"k3", b"k4", b"k5"]
    frame = spark.createDataFrame([Row(key=key, value=b"v-" + key) for key in keys],
                                  "key binary, value binary")
    (frame.write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).option("kafka.compression.type", "lz4").mode("append").save())
    expected = {key: (murmur2(key) & 0x7FFFFFFF) % 3 for key in keys}
    ends = {p: list(expected.values()).count(p) for p in range(3)}
    read = _read_back(spark, bootstrap, topic, ends)
    assert {row.key: row.partition for row in read} == expected
    assert {row.key: row.value for row in read} == {key: b"v-" + key for key in keys}


def test_options_only_confluent_kafka_takes_use_that_path(spark, bootstrap):
    topic = new_topic(bootstrap, 1)
    frame = spark.createDataFrame(
        [Row(value=b"v0", headers=[Row(key="h", value=b"x")]), Row(value=b"v1", headers=None)],
        "value binary, headers array<struct<key: string, value: binary>>")
    (frame.write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).option("kafka.queue.buffering.max.kbytes", "65536")
     .mode("append").save())
    read = _read_back(spark, bootstrap, topic, {0: 2})
    assert sorted((row.value, [(h.key, h.value) for h in row.headers]) for row in read) == [
        (b"v0", [("h", b"x")]), (b"v1", [])]
