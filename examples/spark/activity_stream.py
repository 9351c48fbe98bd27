"""Example: per-member visit counts, kept by a Spark stream in a compacted topic, then restored.

    .venv/bin/python examples/spark/activity_stream.py --bootstrap 127.0.0.1:9092 \
        --events page-views --counts page-view-counts --checkpoint /tmp/activity-checkpoint

Counts the page-view events (keyed by member id) that arrived since the last run
(Trigger.AvailableNow), writes each changed member's total to the compacted counts topic, then
rebuilds the whole view by reading that topic once. Same as ``headrace spark activity
--available-now`` followed by ``headrace spark activity-view``.
"""

from __future__ import annotations

import argparse

from headrace.spark.jobs.activity import restore_view, run_activity
from headrace.spark.jobs.session import DEFAULT_MASTER, build_session

MEMBERS_SHOWN = 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--events", required=True)
    parser.add_argument("--counts", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--master", default=DEFAULT_MASTER)
    args = parser.parse_args()
    spark = build_session(args.master, "headrace-activity-example")
    report = run_activity(spark, args.bootstrap, args.events, args.counts, args.checkpoint)
    spark.stop()
    print(f"counted {report.input_rows} events in {report.micro_batches} micro-batches")
    view = restore_view(args.bootstrap, args.counts)
    print(f"{len(view.counts)} members restored from {view.records_read} records")
    for member, visits in sorted(view.counts.items(), key=lambda item: -item[1])[:MEMBERS_SHOWN]:
        print(f"  {member.decode('utf-8', 'backslashreplace')}: {visits}")


if __name__ == "__main__":
    main()
