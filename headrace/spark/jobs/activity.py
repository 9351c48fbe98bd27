"""The activity job (seed 002's motivating case): per-member visit counts in a compacted topic.

Owns ``run_activity`` (``headrace spark activity``), ``restore_view``
(``headrace spark activity-view``) and the output topic's record format:

    key   = the member id, the input record's key, unchanged (bytes)
    value = the member's total visit count so far, ASCII decimal ("17")

Pipeline: page-view events keyed by member id are read with
``spark.readStream.format("headrace")`` from the earliest offset, counted with
``groupBy(key).count()`` (Spark's state store, in the checkpoint), and every micro-batch's
changed counts (output mode "update", which the headrace stream sink does not take, so through
``foreachBatch`` and the batch sink ``write.format("headrace")``) are written to the output
topic, partitioned by key with Java's default partitioner (murmur2), so a member's
updates land in one partition in order. Events without a key are not counted.

Delivery: the sink is at least once, but each record carries an absolute count, not an
increment, and a replayed micro-batch (restart after a failure) is recomputed from the same
checkpointed state and offsets, so it writes the same counts again: a duplicate never changes
the restored view. Spark's checkpoint (``checkpoint_dir``) holds the input offsets and the
counts; a run with ``available_now`` processes what is in the topic when it starts and stops.

The output topic is created with ``cleanup.policy=compact`` when missing, and refused when it
exists without compaction: compaction keeps the latest count per member, so ``restore_view``
reads O(members) records once the cleaner has run, however many events were counted.

Runs on the driver's main thread; ``restore_view`` owns one consumer for the call.
"""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from headrace.spark.jobs.session import JobError, topic_partition_ids

COMPACT_POLICY = "compact"
KEY_PARTITIONER = "murmur2_random"
VIEW_GROUP_ID = "headrace-activity-view"
VIEW_MESSAGES_PER_CALL = 10_000
VIEW_POLL_S = 0.5
DEFAULT_VIEW_TIMEOUT_MS = 60_000
DEFAULT_TRIGGER_INTERVAL_S = 10
ADMIN_TIMEOUT_S = 30.0


@dataclass(frozen=True, slots=True)
class ActivityReport:
    input_topic: str
    output_topic: str
    micro_batches: int
    input_rows: int

    def to_json(self) -> dict:
        return {"input_topic": self.input_topic, "output_topic": self.output_topic,
                "micro_batches": self.micro_batches, "input_rows": self.input_rows}


@dataclass(frozen=True, slots=True)
class ActivityView:
    counts: dict[bytes, int]
    records_read: int


def ensure_compacted_topic(bootstrap: str, topic: str, partitions: int) -> None:
    """Create ``topic`` compacted when missing; JobError when it exists uncompacted."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=ADMIN_TIMEOUT_S).topics:
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        configs = admin.describe_configs([resource])[resource].result(timeout=ADMIN_TIMEOUT_S)
        policy = configs["cleanup.policy"].value if "cleanup.policy" in configs else "delete"
        if COMPACT_POLICY not in (policy or "").split(","):
            raise JobError(f"output topic {topic!r} has cleanup.policy={policy}; "
                           f"it must include {COMPACT_POLICY}")
        return
    new_topic = NewTopic(topic, partitions, 1, config={"cleanup.policy": COMPACT_POLICY})
    try:
        admin.create_topics([new_topic])[topic].result(timeout=ADMIN_TIMEOUT_S)
    except KafkaException as error:
        raise JobError(f"cannot create output topic {topic!r}: {error}") from None


def visit_counts(events):
    """The changed (key, value=count) rows of each micro-batch of ``events``."""
    from pyspark.sql import functions as F

    return (events.where(F.col("key").isNotNull()).groupBy("key").count()
            .select("key", F.col("count").cast("string").alias("value")))


def _counts_writer(bootstrap: str, output_topic: str):
    """foreachBatch function: one micro-batch's changed counts into the output topic."""

    def write(batch, batch_id: int) -> None:
        (batch.write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
         .option("topic", output_topic).option("kafka.partitioner", KEY_PARTITIONER)
         .mode("append").save())

    return write


def run_activity(spark, bootstrap: str, input_topic: str, output_topic: str,
                 checkpoint_dir: str, *, available_now: bool = True,
                 trigger_interval_s: int = DEFAULT_TRIGGER_INTERVAL_S,
                 max_offsets_per_trigger: int | None = None) -> ActivityReport:
    """Run the counting query; with available_now, until the input seen at start is counted."""
    input_partitions = topic_partition_ids(bootstrap, input_topic)
    ensure_compacted_topic(bootstrap, output_topic, len(input_partitions))
    reader = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", input_topic).option("startingOffsets", "earliest"))
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    write_counts = _counts_writer(bootstrap, output_topic)
    writer = (visit_counts(reader.load()).writeStream.outputMode("update")
              .foreachBatch(write_counts)
              .option("checkpointLocation", str(checkpoint_dir)))
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{trigger_interval_s} seconds")
    query = writer.start()
    try:
        query.awaitTermination()
    finally:
        if query.isActive:
            query.stop()
    if query.exception() is not None:
        raise query.exception()
    progress = query.recentProgress
    return ActivityReport(input_topic, output_topic, len(progress),
                          sum(entry.numInputRows for entry in progress))


def _apply(counts: dict[bytes, int], key: bytes | None, value: bytes | None) -> None:
    if key is None:
        return
    if value is None:
        counts.pop(key, None)
    else:
        counts[key] = int(value)


def restore_view(bootstrap: str, topic: str,
                 timeout_ms: int = DEFAULT_VIEW_TIMEOUT_MS) -> ActivityView:
    """Every member's latest count, read from the start of ``topic`` to its end now."""
    partitions = topic_partition_ids(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": VIEW_GROUP_ID,
                         "enable.auto.commit": False, "enable.partition.eof": False})
    try:
        return _read_to_end(consumer, topic, partitions, timeout_ms)
    finally:
        consumer.close()


def _read_to_end(consumer: Consumer, topic: str, partitions: list[int],
                 timeout_ms: int) -> ActivityView:
    ends = {}
    for partition in partitions:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, partition),
                                                   timeout=timeout_ms / 1000)
        if high > low:
            ends[partition] = high
    consumer.assign([TopicPartition(topic, partition, OFFSET_BEGINNING) for partition in ends])
    counts: dict[bytes, int] = {}
    records_read = 0
    idle_polls_allowed = max(1, int(timeout_ms / 1000 / VIEW_POLL_S))
    idle_polls = 0
    while ends:
        messages = consumer.consume(VIEW_MESSAGES_PER_CALL, VIEW_POLL_S)
        idle_polls = 0 if messages else idle_polls + 1
        if idle_polls >= idle_polls_allowed:
            raise JobError(f"no progress reading {topic} for {timeout_ms} ms")
        for message in messages:
            if message.error() is not None:
                raise JobError(f"reading {topic}: {message.error().str()}")
            if message.offset() < ends.get(message.partition(), 0):
                records_read += 1
                _apply(counts, message.key(), message.value())
        _drop_finished(consumer, topic, ends)
    return ActivityView(counts, records_read)


def _drop_finished(consumer: Consumer, topic: str, ends: dict[int, int]) -> None:
    """Forget partitions whose position reached the end (gaps and markers included)."""
    positions = consumer.position([TopicPartition(topic, partition) for partition in ends])
    for position in positions:
        if position.offset >= ends[position.partition]:
            del ends[position.partition]
