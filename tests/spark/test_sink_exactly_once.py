"""The sink's exactlyOnce mode: read_committed readers see every micro-batch's records once,
across a re-run of committed batches (a driver that died before its commit log entry) and a
task killed in the middle of its write."""

from __future__ import annotations

import os
import time

import pytest
from conftest import append, new_topic

from headrace.spark.options import OptionError, parse_sink_options
from headrace.spark.sink import BATCH_ID_HEADER
from tests.client.conftest import read_committed_messages

pytestmark = pytest.mark.spark

POLL_TIMEOUT_S = 0.5
KILL_WAIT_S = 60.0
RECORDS_PER_PARTITION = 6
SOURCE_PARTITIONS = 2
# The killed task: Spark hands the sink Arrow batches of 10,000 rows
# (spark.sql.execution.arrow.maxRecordsPerBatch), so a task that dies after 14,000 rows has
# had at least one batch written by the sink.
KILL_RECORDS_PER_PARTITION = 15_000
KILL_AT_INDEX = 14_000


def _read_committed(bootstrap: str, topic: str, partitions: int) -> list[tuple[bytes, bytes]]:
    """Every committed (value, batch id header) of ``topic``."""
    return [(message.value(), dict(message.headers())[BATCH_ID_HEADER])
            for message in read_committed_messages(bootstrap, topic, partitions)]


def _source(spark, bootstrap: str, topic: str, max_offsets_per_trigger: int | None = 4):
    reader = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest"))
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    return reader.load().select("key", "value")


def _run_to_end(frame, bootstrap: str, sink_topic: str, checkpoint) -> Exception | None:
    query = (frame.writeStream.format("headrace")
             .option("kafka.bootstrap.servers", bootstrap).option("topic", sink_topic)
             .option("exactlyOnce", "true")
             .option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    try:
        query.awaitTermination()
    except Exception as error:  # noqa: BLE001 -- the failed run is part of the scenario
        return error
    return query.exception()


def _fill_source(bootstrap: str, records_per_partition: int = RECORDS_PER_PARTITION
                 ) -> tuple[str, list[bytes]]:
    topic = new_topic(bootstrap, SOURCE_PARTITIONS)
    values = []
    for partition in range(SOURCE_PARTITIONS):
        batch = [b"p%d-%d" % (partition, i) for i in range(records_per_partition)]
        append(bootstrap, topic, partition, batch)
        values += batch
    return topic, values


def _forget_commits(checkpoint, last: int) -> None:
    """The checkpoint a driver leaves when it dies after its tasks committed but before it
    wrote the commit log entries of the batches from ``last`` on."""
    commits = checkpoint / "commits"
    batch_ids = sorted(int(name) for name in os.listdir(commits) if name.isdigit())
    assert batch_ids and batch_ids[-1] >= last, batch_ids
    for batch_id in batch_ids:
        if batch_id >= last:
            (commits / str(batch_id)).unlink()
            crc = commits / f".{batch_id}.crc"
            if crc.exists():
                crc.unlink()


def test_a_rerun_of_committed_batches_writes_nothing_again(spark, bootstrap, tmp_path):
    source_topic, values = _fill_source(bootstrap)
    sink_topic = new_topic(bootstrap, 2)
    checkpoint = tmp_path / "checkpoint"
    assert _run_to_end(_source(spark, bootstrap, source_topic), bootstrap, sink_topic,
                       checkpoint) is None
    first = _read_committed(bootstrap, sink_topic, 2)
    assert sorted(value for value, _ in first) == sorted(values)

    _forget_commits(checkpoint, last=1)
    assert _run_to_end(_source(spark, bootstrap, source_topic), bootstrap, sink_topic,
                       checkpoint) is None
    assert sorted(_read_committed(bootstrap, sink_topic, 2)) == sorted(first)


def _dies_after_the_sink_wrote(bootstrap: str, sink_topic: str, once_flag: str):
    """A row function that passes values on and, the first time a row at KILL_AT_INDEX or
    later goes through, waits until the sink has written records to ``sink_topic``
    (uncommitted: the high watermark moves) and kills its Python worker, failing the task
    mid-write."""

    def kill_task_once(value: bytes) -> bytes:
        from confluent_kafka import Consumer, TopicPartition  # imported in the worker

        if int(value.split(b"-")[1]) < KILL_AT_INDEX or os.path.exists(once_flag):
            return value
        open(once_flag, "w").close()  # noqa: SIM115 -- an empty flag file
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "eos-killer"})
        partitions = [TopicPartition(sink_topic, p) for p in range(2)]
        deadline = time.monotonic() + KILL_WAIT_S
        while time.monotonic() < deadline:
            if sum(consumer.get_watermark_offsets(p, timeout=10)[1] for p in partitions):
                break
            time.sleep(POLL_TIMEOUT_S)  # polling the broker's state, bounded by the deadline
        os._exit(1)

    return kill_task_once


def test_a_task_killed_mid_write_leaves_no_visible_records(spark, bootstrap, tmp_path):
    from pyspark.sql import functions

    source_topic, values = _fill_source(bootstrap, KILL_RECORDS_PER_PARTITION)
    sink_topic = new_topic(bootstrap, 2)
    checkpoint = tmp_path / "checkpoint"
    killer = functions.udf(
        _dies_after_the_sink_wrote(bootstrap, sink_topic, str(tmp_path / "killed")), "binary")
    frame = _source(spark, bootstrap, source_topic, max_offsets_per_trigger=None)
    killing = frame.select("key", killer("value").alias("value"))
    assert _run_to_end(killing, bootstrap, sink_topic, checkpoint) is not None
    assert (tmp_path / "killed").exists()

    assert _run_to_end(_source(spark, bootstrap, source_topic, max_offsets_per_trigger=None),
                       bootstrap, sink_topic, checkpoint) is None
    assert sorted(value for value, _ in _read_committed(bootstrap, sink_topic, 2)) == \
        sorted(values)


def test_exactly_once_needs_the_topic_option_and_its_own_transactional_ids():
    with pytest.raises(OptionError, match="topic"):
        parse_sink_options({"kafka.bootstrap.servers": "h:1", "exactlyOnce": "true"})
    with pytest.raises(OptionError, match="transactional.id"):
        parse_sink_options({"kafka.bootstrap.servers": "h:1", "exactlyOnce": "true",
                            "topic": "t", "kafka.transactional.id": "mine"})
    assert parse_sink_options({"kafka.bootstrap.servers": "h:1", "exactlyOnce": "true",
                               "topic": "t"}).exactly_once
