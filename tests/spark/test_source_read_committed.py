"""The source under ``kafka.isolation.level``: read_committed reads skip aborted transactions
and end at the last stable offset; read_uncommitted (the default) reads everything."""

from __future__ import annotations

import uuid

import pytest
from confluent_kafka import Producer
from conftest import new_topic

from headrace.protocol.control_records import build_end_txn_marker_batch
from headrace.protocol.records import build_batch
from headrace.spark.fetch import committed_spans
from headrace.spark.options import OptionError, parse_source_options

pytestmark = pytest.mark.spark

TIMEOUT_S = 30


def _transaction(producer: Producer, topic: str, values: list[bytes], commit: bool) -> None:
    producer.begin_transaction()
    for value in values:
        producer.produce(topic, value, partition=0)
    producer.flush(TIMEOUT_S)
    if commit:
        producer.commit_transaction(TIMEOUT_S)
    else:
        producer.abort_transaction(TIMEOUT_S)


@pytest.fixture
def mixed_topic(bootstrap):
    """A partition holding a committed, an aborted and a committed transaction, then one
    still open (kept open until the test ends)."""
    topic = new_topic(bootstrap, 1)
    producer = Producer({"bootstrap.servers": bootstrap,
                         "transactional.id": f"source-{uuid.uuid4().hex[:8]}"})
    producer.init_transactions(TIMEOUT_S)
    _transaction(producer, topic, [b"a0", b"a1", b"a2"], commit=True)
    _transaction(producer, topic, [b"b0", b"b1"], commit=False)
    _transaction(producer, topic, [b"c0", b"c1"], commit=True)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    producer.flush(TIMEOUT_S)
    yield topic
    producer.abort_transaction(TIMEOUT_S)


def _values(spark, bootstrap, topic, **options) -> list[bytes]:
    reader = (spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic))
    for key, value in options.items():
        reader = reader.option(key, value)
    return [row.value for row in reader.load().orderBy("offset").collect()]


def test_read_committed_skips_aborted_records_and_stops_at_the_open_transaction(
        spark, bootstrap, mixed_topic):
    assert _values(spark, bootstrap, mixed_topic, **{"kafka.isolation.level": "read_committed"}
                   ) == [b"a0", b"a1", b"a2", b"c0", b"c1"]


def test_read_uncommitted_is_the_default_and_reads_every_record(spark, bootstrap, mixed_topic):
    assert _values(spark, bootstrap, mixed_topic) == \
        [b"a0", b"a1", b"a2", b"b0", b"b1", b"c0", b"c1", b"open"]


def test_a_stream_reads_committed_records_only(spark, bootstrap, mixed_topic, tmp_path):
    stream = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", mixed_topic).option("startingOffsets", "earliest")
              .option("kafka.isolation.level", "read_committed")
              .option("maxOffsetsPerTrigger", "3").load().select("offset", "value"))
    query = (stream.writeStream.format("parquet").option("path", str(tmp_path / "out"))
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    query.awaitTermination()
    assert query.exception() is None
    rows = spark.read.parquet(str(tmp_path / "out")).orderBy("offset").collect()
    assert [row.value for row in rows] == [b"a0", b"a1", b"a2", b"c0", b"c1"]


def test_an_unknown_isolation_level_is_refused():
    with pytest.raises(OptionError, match="isolation.level"):
        parse_source_options({"kafka.bootstrap.servers": "h:1", "subscribe": "t",
                              "kafka.isolation.level": "serializable"}, streaming=False)


def _data(producer_id: int, base_offset: int, values: list[bytes]) -> bytes:
    return build_batch([(None, value, (), 0) for value in values], base_offset=base_offset,
                       producer_id=producer_id, producer_epoch=0, base_sequence=0,
                       transactional=True)


def _marker(producer_id: int, base_offset: int, commit: bool) -> bytes:
    return build_end_txn_marker_batch(producer_id, 0, commit, 0, 0, base_offset=base_offset)


def test_committed_spans_drop_only_the_aborted_producers_batches_until_their_marker():
    batches = [
        _data(7, 0, [b"x"]),            # producer 7's aborted transaction starts here
        _data(8, 1, [b"y"]),            # producer 8: committed
        _marker(7, 2, commit=False),
        _data(7, 3, [b"z"]),            # producer 7's next transaction: committed
        _marker(8, 4, commit=True),
        _marker(7, 5, commit=True),
    ]
    records = memoryview(b"".join(batches))
    kept = b"".join(bytes(records[start:end])
                    for start, end in committed_spans(records, ((7, 0),)))
    assert kept == b"".join(batches[1:])
    assert committed_spans(records, ()) == [(0, len(records))]
