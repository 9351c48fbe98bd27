"""The Spark sink's exactlyOnce mode against its at-least-once mode, in one run.

Fills a --partitions-partition input topic with --records records of spark_read's
RECORD_BYTES (spark_read.produce_plain), then each
of the --repeat rounds runs the same streaming query twice, in alternating order: the headrace
source (Trigger.AvailableNow, maxOffsetsPerTrigger = records / --batches) into
writeStream.format("headrace") at least once, and with exactlyOnce=true (each task a
transaction, committed by the driver per micro-batch), each into a fresh output topic with
a fresh checkpoint. Prints, as one JSON line, the median rows/s of each and their ratio
(issue #21's goal: exactly once >= 0.8 of at least once). Both sides read the same input, so
the ratio compares what the sink adds.

    bench/run-headrace.sh -- sh -c '.venv/bin/python bench/spark_eos.py --bootstrap $BOOTSTRAP'
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

from confluent_kafka.admin import AdminClient
from spark_read import RECORD_BYTES, _create_topic, produce_plain, spark_session


def run_query(spark, bootstrap: str, source: str, output: str, records_per_batch: int,
              exactly_once: bool) -> float:
    """Seconds from the query's start to its termination."""
    stream = (spark.readStream.format("headrace").option("kafka.bootstrap.servers", bootstrap)
              .option("subscribe", source).option("startingOffsets", "earliest")
              .option("maxOffsetsPerTrigger", str(records_per_batch)).load()
              .select("key", "value"))
    with tempfile.TemporaryDirectory(prefix="spark-eos-bench-") as checkpoint:
        started = time.perf_counter()
        query = (stream.writeStream.format("headrace")
                 .option("kafka.bootstrap.servers", bootstrap).option("topic", output)
                 .option("exactlyOnce", str(exactly_once).lower())
                 .option("checkpointLocation", checkpoint)
                 .trigger(availableNow=True).start())
        query.awaitTermination()
        elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(f"query failed: {query.exception()}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--batches", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    args = parser.parse_args()
    spark = spark_session(args.master)
    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    source = _create_topic(admin, args.partitions)
    produce_plain(args.bootstrap, source, args.records, args.partitions)
    records_per_batch = max(1, args.records // args.batches)
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for round_index in range(args.repeat + 1):  # round 0 warms Spark and the broker up
        for exactly_once in ((False, True) if round_index % 2 else (True, False)):
            output = _create_topic(admin, args.partitions)
            elapsed = run_query(spark, args.bootstrap, source, output, records_per_batch,
                                exactly_once)
            if round_index:
                seconds[exactly_once].append(elapsed)
    at_least_once = args.records / statistics.median(seconds[False])
    exactly_once = args.records / statistics.median(seconds[True])
    print(json.dumps({
        "records": args.records, "record_bytes": RECORD_BYTES,
        "partitions": args.partitions, "micro_batches": args.batches, "repeat": args.repeat,
        "at_least_once_rows_per_s": round(at_least_once),
        "exactly_once_rows_per_s": round(exactly_once),
        "exactly_once_ratio": round(exactly_once / at_least_once, 3),
    }))
    spark.stop()


if __name__ == "__main__":
    main()
