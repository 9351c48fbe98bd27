"""Spark source and sink throughput against a plain confluent-kafka client, in one run.

Creates a topic (6 partitions by default), produces N records of 1 KiB with a plain
confluent-kafka Producer (the sink's baseline), reads them back with a plain confluent-kafka
Consumer (the source's baseline), then with spark.read.format("headrace") into format("noop"),
and writes N rows with df.write.format("headrace"); each of the --repeat rounds runs all four
(the producer and the sink into fresh topics). Prints medians of rows/s, MB/s and the ratios
(source goal >= 1.0 of the consumer, sink goal >= 0.8 of the producer) as one JSON line.

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
    read_spark(spark, args.bootstrap, topic, ends)  # warm-up: JVM, Python workers
    producer_s, consumer_s, source_s, sink_s = [produce_s], [], [], []
    for run in range(args.repeat):
        if run:  # the first producer run filled the topic read above
            producer_s.append(produce_plain(args.bootstrap, _create_topic(admin, args.partitions),
                                            args.records, args.partitions))
        consumer_s.append(consume_plain(args.bootstrap, topic, ends))
        source_s.append(read_spark(spark, args.bootstrap, topic, ends))
        sink_s.append(write_spark(spark, args.bootstrap, _create_topic(admin, args.partitions),
                                  args.records))
    spark.stop()
    megabytes = args.records * RECORD_BYTES / MB
    figures = {
        "records": args.records, "partitions": args.partitions, "record_bytes": RECORD_BYTES,
        "consumer_rows_per_s": round(args.records / statistics.median(consumer_s)),
        "source_rows_per_s": round(args.records / statistics.median(source_s)),
        "source_mb_per_s": round(megabytes / statistics.median(source_s), 1),
        "consumer_mb_per_s": round(megabytes / statistics.median(consumer_s), 1),
        "producer_rows_per_s": round(args.records / statistics.median(producer_s)),
        "sink_rows_per_s": round(args.records / statistics.median(sink_s)),
        "sink_mb_per_s": round(megabytes / statistics.median(sink_s), 1),
    }
    figures["source_vs_consumer"] = round(
        statistics.median(consumer_s) / statistics.median(source_s), 2)
    figures["sink_vs_producer"] = round(
        statistics.median(producer_s) / statistics.median(sink_s), 2)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
