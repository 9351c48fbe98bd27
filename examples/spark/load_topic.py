"""Example: load a topic into Parquet incrementally, offsets committed with the output.

    .venv/bin/python examples/spark/load_topic.py --bootstrap 127.0.0.1:9092 \
        --topic events --output-dir /tmp/events-parquet

Each run loads what arrived since the previous run into DIR/data/run=<id>/ and prints its
report; read the table with spark.read.parquet("/tmp/events-parquet/data"). Same as
``headrace spark load``; see headrace/spark/jobs/load.py for the commit protocol.
"""

from __future__ import annotations

import argparse
import json

from headrace.spark.jobs.load import load_topic
from headrace.spark.jobs.session import DEFAULT_MASTER, build_session


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--master", default=DEFAULT_MASTER)
    args = parser.parse_args()
    spark = build_session(args.master, "headrace-load-example")
    report = load_topic(spark, args.bootstrap, args.topic, args.output_dir)
    print(json.dumps(report.to_json(), indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
