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


def consume_plain(bootstrap: str, topic: str, ends: dict[int, int]) -> float:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-spark",
                         "enable.auto.commit": False, "fetch.max.bytes": 64 * 1024 * 1024})
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


def read_spark(spark, bootstrap: str, topic: str, ends: dict[int, int]) -> float:
    ending = json.dumps({topic: {str(p): end for p, end in ends.items()}})
    frame = (spark.read.format("headrace").option("kafka.bootstrap.servers", bootstrap)
             .option("subscribe", topic).option("endingOffsets", ending).load())
    started = time.perf_counter()
    frame.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - started


def read_spark_fixed_cost(spark, bootstrap: str, topic: str, partitions: int) -> float:
    """A read of one record per partition: all of a job's costs but the rows."""
    return read_spark(spark, bootstrap, topic, dict.fromkeys(range(partitions), 1))


def write_spark(spark, bootstrap: str, topic: str, records: int) -> float:
    from pyspark.sql import functions as F

    frame = spark.range(records, numPartitions=2).select(
        F.expr(f"cast(repeat('x', {RECORD_BYTES}) as binary)").alias("value"))
    started = time.perf_counter()
    (frame.write.format("headrace").option("kafka.bootstrap.servers", bootstrap)
     .option("topic", topic).mode("append").save())
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
    args = parser.parse_args()
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    topic = _create_topic(admin, args.partitions)
    produce_s = produce_plain(args.bootstrap, topic, args.records, args.partitions)
    ends = {p: len(range(p, args.records, args.partitions)) for p in range(args.partitions)}
    spark = spark_session(args.master)
    for _ in range(args.warmups):  # JVM (JIT), Python workers: both sides measured warm
        read_spark(spark, args.bootstrap, topic, ends)
        write_spark(spark, args.bootstrap, _create_topic(admin, args.partitions), args.records)
    producer_s, consumer_s, source_s, sink_s, fixed_s = [produce_s], [], [], [], []
    cpu: dict[str, list[float]] = {"consumer": [], "source": [], "sink": [], "producer": []}

    def timed(kind: str, seconds: list[float], run) -> None:
        wall, cpu_s = measured(run, args.broker_pid)
        seconds.append(wall)
        cpu[kind].append(cpu_s)

    for run in range(args.repeat):
        if run:  # the first producer run filled the topic read above
            timed("producer", producer_s, lambda: produce_plain(
                args.bootstrap, _create_topic(admin, args.partitions), args.records,
                args.partitions))
        timed("consumer", consumer_s, lambda: consume_plain(args.bootstrap, topic, ends))
        timed("source", source_s, lambda: read_spark(spark, args.bootstrap, topic, ends))
        fixed_s.append(read_spark_fixed_cost(spark, args.bootstrap, topic, args.partitions))
        timed("sink", sink_s, lambda: write_spark(
            spark, args.bootstrap, _create_topic(admin, args.partitions), args.records))
    spark.stop()
    megabytes = args.records * RECORD_BYTES / MB
    figures = {
        "records": args.records, "partitions": args.partitions, "record_bytes": RECORD_BYTES,
        "consumer_rows_per_s": round(args.records / statistics.median(consumer_s)),
        "source_rows_per_s": round(args.records / statistics.median(source_s)),
        "source_mb_per_s": round(megabytes / statistics.median(source_s), 1),
        "source_job_fixed_s": round(statistics.median(fixed_s), 3),
        "consumer_mb_per_s": round(megabytes / statistics.median(consumer_s), 1),
        "producer_rows_per_s": round(args.records / statistics.median(producer_s)),
        "sink_rows_per_s": round(args.records / statistics.median(sink_s)),
        "sink_mb_per_s": round(megabytes / statistics.median(sink_s), 1),
    }
    for kind, seconds in cpu.items():
        if seconds:
            figures[f"{kind}_cpu_s_per_million_rows"] = round(
                statistics.median(seconds) * 1_000_000 / args.records, 2)
    figures["source_vs_consumer"] = round(
        statistics.median(consumer_s) / statistics.median(source_s), 2)
    figures["sink_vs_producer"] = round(
        statistics.median(producer_s) / statistics.median(sink_s), 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
