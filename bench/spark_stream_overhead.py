"""Per-micro-batch overhead of spark.readStream.format("headrace"), in milliseconds.

Creates a 1-partition topic holding --records tiny records, then runs a streaming query with
Trigger.AvailableNow and maxOffsetsPerTrigger=--records-per-batch into format("noop"), so the
query runs records / records-per-batch micro-batches that each carry almost no data. Prints,
as one JSON line: wall ms per micro-batch (query start to termination / micro-batches) and
the median and p90 of Spark's own triggerExecution duration per micro-batch (planning through
latestOffset, one executor task reading its range, commit), each the median of --repeat runs.

    bench/run-headrace.sh -- sh -c '.venv/bin/python bench/spark_stream_overhead.py \\
        --bootstrap $BOOTSTRAP'
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
import uuid

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic
from spark_read import spark_session

RECORD_BYTES = 16


def _topic_with_records(bootstrap: str, records: int) -> str:
    name = f"bench-stream-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, 1, 1)]).values():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for index in range(records):
        producer.produce(name, b"%0*d" % (RECORD_BYTES, index), partition=0)
    assert producer.flush(60) == 0
    return name


def run_query(spark, bootstrap: str, topic: str, records_per_batch: int) -> dict:
    stream = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", topic).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(records_per_batch)).load())
    with tempfile.TemporaryDirectory(prefix="spark-stream-bench-") as checkpoint:
        started = time.perf_counter()
        query = (stream.writeStream.format("noop").option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        elapsed_ms = (time.perf_counter() - started) * 1000
        progress = [entry for entry in query.recentProgress if entry["numInputRows"] > 0]
    trigger_ms = sorted(entry["durationMs"]["triggerExecution"] for entry in progress)
    return {
        "micro_batches": len(progress),
        "wall_ms_per_batch": elapsed_ms / len(progress),
        "trigger_ms_median": statistics.median(trigger_ms),
        "trigger_ms_p90": trigger_ms[int(0.9 * (len(trigger_ms) - 1))],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--records-per-batch", type=int, default=10)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    topic = _topic_with_records(args.bootstrap, args.records)
    spark = spark_session()
    spark.conf.set("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    run_query(spark, args.bootstrap, topic, args.records_per_batch)  # warm-up: JVM, workers
    runs = [run_query(spark, args.bootstrap, topic, args.records_per_batch)
            for _ in range(args.repeat)]
    spark.stop()
    figures = {"records": args.records, "records_per_batch": args.records_per_batch,
               "micro_batches": runs[0]["micro_batches"]}
    for name in ("wall_ms_per_batch", "trigger_ms_median", "trigger_ms_p90"):
        figures[name] = round(statistics.median(run[name] for run in runs), 1)
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
