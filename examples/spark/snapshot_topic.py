"""Example: a compacted topic as a Parquet table of each key's latest value.

    .venv/bin/python examples/spark/snapshot_topic.py --bootstrap 127.0.0.1:9092 \
        --topic profiles --output-dir /tmp/profiles-snapshot

Tombstones remove keys; the table replaces the previous one atomically (DIR/current). The
report's "table" path is what spark.read.parquet reads. Same as ``headrace spark snapshot``.
"""

from __future__ import annotations

import argparse
import json
import time

from headrace.spark.jobs.session import DEFAULT_MASTER, build_session
from headrace.spark.jobs.snapshot import snapshot_topic


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--master", default=DEFAULT_MASTER)
    args = parser.parse_args()
    spark = build_session(args.master, "headrace-snapshot-example")
    report = snapshot_topic(spark, args.bootstrap, args.topic, args.output_dir,
                            now_ms=time.time_ns() // 1_000_000)
    print(json.dumps(report.to_json(), indent=2))
    spark.stop()


if __name__ == "__main__":
    main()
