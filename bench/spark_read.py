"""Spark source and sink throughput against a plain confluent-kafka client, in one run.

Creates a topic (6 partitions by default), produces N records of 1 KiB with a plain
confluent-kafka Producer (the sink's baseline), reads them back with a plain confluent-kafka
Consumer (the source's baseline), then with spark.read.format("headrace") into format("noop"),
and writes N rows with df.write.format("headrace"); each of the --repeat rounds runs all four
(the producer and the sink into fresh topics). Prints medians of rows/s, MB/s and the ratios
(source goal >= 1.0 of the consumer, sink goal >= 0.8 of the producer) as one JSON line.

Both sides are measured warm: before the rounds Spark reads the topic and runs the sink
``--warmups`` times (the JVM is still JIT-compiling the read path during its second job), as
the plain clients need no warm-up beyond a connection. Each round also times a Spark read of
one record per partition: the fixed cost of a job (planning on the driver, ListOffsets, task
launch), reported as ``source_job_fixed_s``; it is included in the source's rows/s.

Shared machines make wall-clock ratios noisy, so each side's CPU time is reported too: the
seconds used by this process and its descendants (Spark's JVM and Python workers) plus the
broker's (``--broker-pid``, which run-headrace.sh exports as $BROKER_PID), per million rows.

``--ceiling`` also measures Spark's own ceiling in the same session and rounds: a Python data
source that yields one pre-built Arrow batch of the source's schema (4,096 rows of 1 KiB
values; the source yields a batch per Fetch response, ~16k rows, which measured as cheap for
Spark as 1k-16k rows per batch) over and over into format("noop") -- no fetching, no
decoding -- as ``ceiling_rows_per_s`` and ``ceiling_vs_consumer``. A source cannot beat it.

``--sink-only`` skips the reads (consumer, source); ``--read-only`` skips the writes (the
producer after its first run, the sink). ``--fallback-option KEY=VALUE`` also times the sink
with that extra writer option in every round, as ``sink_fallback``: an option only the
confluent-kafka path takes (``kafka.queue.buffering.max.kbytes=262144``, that path's own
default) measures the sink's fallback path against its own path in the same run.

    run-peer.sh -- sh -c '.venv/bin/python bench/spark_read.py --bootstrap $BOOTSTRAP'
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

RECORD_BYTES = 1024
MB = 1_000_000
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _process_stats() -> dict[int, tuple[int, int]]:
    """pid -> (parent pid, clock ticks) of every process readable in /proc; the ticks are
    its own user + system time and that of its exited, reaped children."""
    stats = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat") as stat_file:
                fields = stat_file.read().rsplit(")", 1)[1].split()
        except OSError:  # exited meanwhile
            continue
        stats[int(name)] = (int(fields[1]), sum(int(field) for field in fields[11:15]))
    return stats


def cpu_seconds(broker_pid: int | None) -> float:
    """CPU seconds so far of this process, its descendants and the broker."""
    stats = _process_stats()
    children: dict[int, list[int]] = {}
    for pid, (parent, _) in stats.items():
        children.setdefault(parent, []).append(pid)
    pending = [os.getpid()] + ([broker_pid] if broker_pid in stats else [])
    ticks = 0
    while pending:
        pid = pending.pop()
        ticks += stats[pid][1]
        pending.extend(children.get(pid, ()))
    return ticks / CLOCK_TICKS_PER_S


def measured(run, broker_pid: int | None) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of ``run()``, which returns its own wall seconds."""
    cpu_before = cpu_seconds(broker_pid)
    wall = run()
    return wall, cpu_seconds(broker_pid) - cpu_before


def _create_topic(admin: AdminClient, partitions: int) -> str:
    name = f"bench-spark-{uuid.uuid4().hex[:8]}"
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(timeout=30)
    return name


def produce_plain(bootstrap: str, topic: str, records: int, partitions: int) -> float:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True,
                         "linger.ms": 5, "batch.size": 1024 * 1024})
    payload = os.urandom(RECORD_BYTES)
    started = time.perf_counter()
    for index in range(records):
        while True:
            try:
                producer.produce(topic, payload, partition=index % partitions)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(300) == 0
    return time.perf_counter() - started


# The plain consumer's local queue as shared/bench/kbench.py sets it: with librdkafka's defaults
# (100k messages queued, then fetch.queue.backoff.ms=1000) a consumer that falls briefly
# behind stops fetching for a second at a time, which would flatter the source's ratio.
PLAIN_CONSUMER_QUEUE_CONFIG = {"queued.min.messages": 1_000_000,
                               "queued.max.messages.kbytes": 262_144,
                               "fetch.queue.backoff.ms": 5}


def consume_plain(bootstrap: str, topic: str, ends: dict[int, int]) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-spark",
                         "enable.auto.commit": False, "fetch.max.bytes": 64 * 1024 * 1024,
                         **PLAIN_CONSUMER_QUEUE_CONFIG})
    consumer.assign([TopicPartition(topic, partition, 0) for partition in ends])
    remaining, total_bytes = sum(ends.values()), 0
    started = time.perf_counter()
    while remaining:
        for message in consumer.consume(10_000, 1.0):
            if message.error() is None:
                total_bytes += len(message.value())
                remaining -= 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return elapsed


def spark_session(master: str):
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master(master).appName("headrace-spark-bench")
               .config("spark.driver.host", "127.0.0.1")
               .config("spark.driver.bindAddress", "127.0.0.1")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    return session


SOURCE_OPTIONS: dict[str, str] = {}  # --source-option: extra options of every Spark read


def read_spark(spark, bootstrap: str, topic: str, ends: dict[int, int]) -> float:
    ending = json.dumps({topic: {str(p): end for p, end in ends.items()}})
    frame = (spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("endingOffsets", ending)
             .options(**SOURCE_OPTIONS).load())
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def read_spark_fixed_cost(spark, bootstrap: str, topic: str, partitions: int) -> float:
    """A read of one record per partition: all of a job's costs but the rows."""
    return read_spark(spark, bootstrap, topic, dict.fromkeys(range(partitions), 1))


CEILING_BATCH_ROWS = 4096


def register_ceiling_source(spark, records: int, partitions: int) -> None:
    """Register format("ceiling"): ``records`` rows in ``partitions`` input partitions, each
    yielding one pre-built Arrow batch of the headrace source's schema repeatedly."""
    import numpy as np
    import pyarrow as pa
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class CeilingPartition(InputPartition):
        def __init__(self, partition: int, rows: int) -> None:
            self.partition, self.rows = partition, rows

    class CeilingReader(DataSourceReader):
        def partitions(self):
            return [CeilingPartition(p, len(range(p, records, partitions)))
                    for p in range(partitions)]

        def read(self, partition):
            rows = CEILING_BATCH_ROWS
            batch = pa.RecordBatch.from_arrays([
                pa.nulls(rows, pa.binary()),
                pa.array([os.urandom(RECORD_BYTES)] * rows, pa.binary()),
                pa.array(["ceiling"] * rows, pa.string()),
                pa.array(np.full(rows, partition.partition, np.int32)),
                pa.array(np.arange(rows, dtype=np.int64)),
                pa.array(np.zeros(rows, np.int64)).cast(pa.timestamp("us", tz="UTC")),
                pa.array(np.zeros(rows, np.int32)),
            ], names=["key", "value", "topic", "partition", "offset", "timestamp",
                      "timestampType"])
            left = partition.rows
            while left > 0:
                yield batch if left >= rows else batch.slice(0, left)
                left -= rows

    class CeilingSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "ceiling"

        def schema(self) -> str:
            return ("key binary, value binary, topic string, partition int, offset long, "
                    "timestamp timestamp, timestampType int")

        def reader(self, schema):
            return CeilingReader()

    spark.dataSource.register(CeilingSource)


def read_ceiling(spark) -> float:
    started = time.perf_counter()
    spark.read.format("ceiling").load().write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def write_spark(spark, bootstrap: str, topic: str, records: int,
                options: dict[str, str] | None = None) -> float:
    from pyspark.sql import functions as F

    frame = spark.range(records, numPartitions=2).select(
        F.expr(f"cast(repeat('x', {RECORD_BYTES}) as binary)").alias("value"))
    writer = (frame.write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("topic", topic).mode("append"))
    for key, value in (options or {}).items():
        writer = writer.option(key, value)
    started = time.perf_counter()
    writer.save()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--broker-pid", type=int,
                        default=int(os.environ["BROKER_PID"]) if "BROKER_PID" in os.environ
                        else None, help="count this broker's CPU time too")
    parser.add_argument("--warmups", type=int, default=2,
                        help="Spark reads and sink writes run before the measured rounds")
    parser.add_argument("--master", default="local[2]",
                        help="Spark master: local[2] is one task slot per core here; the "
                             "source's tasks mostly wait on the network, so local[4] is worth "
                             "measuring too")
    parser.add_argument("--sink-only", action="store_true",
                        help="measure only the sink and the plain producer (no reads)")
    parser.add_argument("--read-only", action="store_true",
                        help="measure only the reads (consumer, source, ceiling): no sink runs")
    parser.add_argument("--sink-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an extra option of the sink's writer (e.g. "
                             "kafka.compression.type=lz4); repeatable")
    parser.add_argument("--fallback-option", action="append", default=[],
                        metavar="KEY=VALUE",
                        help="also time the sink with this extra option in every round, as "
                             "sink_fallback (e.g. kafka.queue.buffering.max.kbytes=262144, "
                             "which only the confluent-kafka path takes); repeatable")
    parser.add_argument("--ceiling", action="store_true",
                        help="also measure Spark's ceiling: pre-built Arrow batches into noop")
    parser.add_argument("--source-option", action="append", default=[], metavar="KEY=VALUE",
                        help="an option of the Spark reads, e.g. "
                             "kafka.max.partition.fetch.bytes=1048576 (repeatable)")
    args = parser.parse_args()
    sink_options = dict(option.split("=", 1) for option in args.sink_option)
    fallback_options = dict(option.split("=", 1) for option in args.fallback_option)
    SOURCE_OPTIONS.update(option.split("=", 1) for option in args.source_option)
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    topic = _create_topic(admin, args.partitions)
    produce_s = produce_plain(args.bootstrap, topic, args.records, args.partitions)
    ends = {p: len(range(p, args.records, args.partitions)) for p in range(args.partitions)}
    spark = spark_session(args.master)
    if args.ceiling:
        register_ceiling_source(spark, args.records, args.partitions)
    for _ in range(args.warmups):  # JVM (JIT), Python workers: both sides measured warm
        if not args.sink_only:
            read_spark(spark, args.bootstrap, topic, ends)
        if args.ceiling:
            read_ceiling(spark)
        if args.read_only:
            continue
        write_spark(spark, args.bootstrap, _create_topic(admin, args.partitions), args.records,
                    sink_options)
        if args.fallback_option:
            write_spark(spark, args.bootstrap, _create_topic(admin, args.partitions),
                        args.records, {**sink_options, **fallback_options})
    producer_s, consumer_s, source_s, sink_s, fixed_s = [produce_s], [], [], [], []
    ceiling_s: list[float] = []
    fallback_s: list[float] = []
    cpu: dict[str, list[float]] = {"consumer": [], "source": [], "sink": [], "producer": [],
                                   "ceiling": [], "sink_fallback": []}

    def timed(kind: str, seconds: list[float], run) -> None:
        wall, cpu_s = measured(run, args.broker_pid)
        seconds.append(wall)
        cpu[kind].append(cpu_s)

    for run in range(args.repeat):
        if run and not args.read_only:  # the first producer run filled the topic read above
            timed("producer", producer_s, lambda: produce_plain(
                args.bootstrap, _create_topic(admin, args.partitions), args.records,
                args.partitions))
        if not args.sink_only:
            timed("consumer", consumer_s, lambda: consume_plain(args.bootstrap, topic, ends))
            timed("source", source_s, lambda: read_spark(spark, args.bootstrap, topic, ends))
            fixed_s.append(read_spark_fixed_cost(spark, args.bootstrap, topic,
                                                 args.partitions))
        if args.ceiling:
            timed("ceiling", ceiling_s, lambda: read_ceiling(spark))
        if args.read_only:
            continue
        timed("sink", sink_s, lambda: write_spark(
            spark, args.bootstrap, _create_topic(admin, args.partitions), args.records,
            sink_options))
        if args.fallback_option:
            timed("sink_fallback", fallback_s, lambda: write_spark(
                spark, args.bootstrap, _create_topic(admin, args.partitions), args.records,
                {**sink_options, **fallback_options}))
    spark.stop()
    megabytes = args.records * RECORD_BYTES / MB
    figures = {"records": args.records, "partitions": args.partitions,
               "record_bytes": RECORD_BYTES}
    if not args.sink_only:
        figures.update({
            "consumer_rows_per_s": round(args.records / statistics.median(consumer_s)),
            "source_rows_per_s": round(args.records / statistics.median(source_s)),
            "source_mb_per_s": round(megabytes / statistics.median(source_s), 1),
            "source_job_fixed_s": round(statistics.median(fixed_s), 3),
            "consumer_mb_per_s": round(megabytes / statistics.median(consumer_s), 1),
            "source_vs_consumer": round(
                statistics.median(consumer_s) / statistics.median(source_s), 2)})
    if sink_s:
        figures.update({
            "producer_rows_per_s": round(args.records / statistics.median(producer_s)),
            "sink_rows_per_s": round(args.records / statistics.median(sink_s)),
            "sink_mb_per_s": round(megabytes / statistics.median(sink_s), 1),
            "sink_vs_producer": round(
                statistics.median(producer_s) / statistics.median(sink_s), 2),
        })
    if fallback_s:
        figures["sink_fallback_rows_per_s"] = round(
            args.records / statistics.median(fallback_s))
        figures["sink_fallback_vs_producer"] = round(
            statistics.median(producer_s) / statistics.median(fallback_s), 2)
    for kind, seconds in cpu.items():
        if seconds:
            figures[f"{kind}_cpu_s_per_million_rows"] = round(
                statistics.median(seconds) * 1_000_000 / args.records, 2)
    if ceiling_s:
        figures["ceiling_rows_per_s"] = round(args.records / statistics.median(ceiling_s))
        figures["ceiling_vs_consumer"] = round(
            statistics.median(consumer_s) / statistics.median(ceiling_s), 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
