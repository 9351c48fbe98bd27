"""Example: copy one topic to another with the headrace Spark source and sink.

    .venv/bin/python examples/spark/copy_topic.py --bootstrap 127.0.0.1:9092 \
        --source events --target events-copy --checkpoint /tmp/copy-checkpoint

Runs as a Trigger.AvailableNow stream: each run copies what arrived since the last run. The
checkpoint holds the source offsets; the sink is at least once and stamps every record with
the header ``headrace.batch.id`` so readers can drop a replayed micro-batch.
"""

from __future__ import annotations

import argparse

from headrace.spark.jobs.session import DEFAULT_MASTER, build_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--target", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--master", default=DEFAULT_MASTER)
    args = parser.parse_args()
    spark = build_session(args.master, "headrace-copy-topic")
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
