"""Streaming reads: Trigger.AvailableNow runs over a growing subscription, into a file sink."""

from __future__ import annotations

import pytest
from conftest import append, new_topic, unique_name

pytestmark = pytest.mark.spark


def _run_available_now(spark, bootstrap, pattern, output_dir, checkpoint_dir):
    stream = (
        spark.readStream.format("headrace")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribePattern", pattern)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", "3")
        .load()
        .select("topic", "partition", "offset", "value")
    )
    query = (stream.writeStream.format("parquet").option("path", str(output_dir))
             .option("checkpointLocation", str(checkpoint_dir))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    return query


def _written(spark, output_dir) -> list[tuple[str, int, int, bytes]]:
    rows = spark.read.parquet(str(output_dir)).collect()
    return sorted((row.topic, row.partition, row.offset, row.value) for row in rows)


def test_available_now_runs_read_every_record_exactly_once(spark, bootstrap, tmp_path):
    prefix = unique_name("stream")
    first = f"{prefix}-a"
    second = f"{prefix}-b"
    pattern = f"{prefix}-.*"
    new_topic(bootstrap, 2, first)
    output_dir, checkpoint_dir = tmp_path / "out", tmp_path / "checkpoint"
    expected = []

    def add(topic, partition, values):
        append(bootstrap, topic, partition, values)
        start = sum(1 for row in expected if row[:2] == (topic, partition))
        expected.extend((topic, partition, start + i, v) for i, v in enumerate(values))

    add(first, 0, [b"a0-%d" % i for i in range(5)])
    add(first, 1, [b"a1-%d" % i for i in range(2)])
    query = _run_available_now(spark, bootstrap, pattern, output_dir, checkpoint_dir)
    assert _written(spark, output_dir) == sorted(expected)
    assert len(query.recentProgress) >= 3  # 7 records at 3 per trigger

    add(first, 0, [b"a0-late-%d" % i for i in range(3)])
    _run_available_now(spark, bootstrap, pattern, output_dir, checkpoint_dir)
    assert _written(spark, output_dir) == sorted(expected)

    new_topic(bootstrap, 1, second)
    add(second, 0, [b"b0-%d" % i for i in range(2)])
    add(first, 1, [b"a1-late"])
    _run_available_now(spark, bootstrap, pattern, output_dir, checkpoint_dir)
    assert _written(spark, output_dir) == sorted(expected)



def test_real_time_mode_refuses_the_source_as_it_does_every_python_data_source(
        spark, bootstrap, tmp_path):
    """Spark 4's real-time trigger takes only sources whose stream implements
    SupportsRealTimeMode; Python data sources' streams do not (README, Spark section). When a
    PySpark release accepts them, this fails and the source should support the mode."""
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"real-time"])
    stream = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest").load())
    with pytest.raises(Exception, match="STREAMING_REAL_TIME_MODE") as refused:
        query = (stream.writeStream.format("console").outputMode("update")
                 .option("checkpointLocation", str(tmp_path / "checkpoint"))
                 .trigger(realTime="5 seconds").start())
        try:
            query.processAllAvailable()
        finally:
            query.stop()
    assert "INPUT_STREAM_NOT_SUPPORTED" in str(refused.value)
