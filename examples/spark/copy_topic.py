"""Example: copy one topic to another with the headrace Spark source and sink.

    .venv/bin/python examples/spark/copy_topic.py --bootstrap 127.0.0.1:9092 \
        --source events --target events-copy --checkpoint /tmp/copy-checkpoint

Runs as a Trigger.AvailableNow stream: each run copies what arrived since the last run. The
checkpoint holds the source offsets; the sink is at least once and stamps every record with
the header ``headrace.batch.id`` so readers can drop a replayed micro-batch.
"""

from __future__ import annotations

import argparse
import os

from pyspark.sql import SparkSession


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    args = parser.parse_args()
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (SparkSession.builder.master("local[2]").appName("headrace-copy-topic")
             .config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.bindAddress", "127.0.0.1")
             .config("spark.ui.enabled", "false").getOrCreate())
    stream = (spark.readStream.format("headrace")
              .option("kafka.bootstrap.servers", args.bootstrap)
              .option("subscribe", args.source).option("startingOffsets", "earliest")
              .option("includeHeaders", "true").load()
              .select("key", "value", "headers", "partition"))
    query = (stream.writeStream.format("headrace")
             .option("kafka.bootstrap.servers", args.bootstrap).option("topic", args.target)
             .option("checkpointLocation", args.checkpoint)
             .trigger(availableNow=True).start())
    query.awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
