"""A ParallelConsumer in its own process, for crash and rebalance tests.

Processes every record of ``--topic`` with random handler durations and random failures. A
record counts as processed once "<partition> <offset> <pid>\\n" is appended to ``--processed``
and fsynced, before the handler returns. With ``--transactional-id`` and ``--output-topic`` it
runs in exactly-once mode and each record becomes one output record "<partition> <offset>".
SIGTERM closes the consumer cleanly (final commit); SIGKILL is what the crash tests send. Run: python consumer_child.py --help.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from headrace.client import (  # noqa: E402
    BufferLimits,
    OutputRecord,
    ParallelConsumer,
    ParallelConsumerOptions,
)


class TransientFailure(Exception):
    """The random failure the handler injects."""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--group", required=True)
    parser.add_argument("--processed", required=True)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--ordering", default="unordered")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--max-handler-ms", type=float, default=5.0)
    parser.add_argument("--failure-rate", type=float, default=0.1)
    parser.add_argument("--session-timeout-ms", type=int, default=1000)
    parser.add_argument("--commit-interval-ms", type=int, default=100)
    parser.add_argument("--assignment-strategy", default="range,roundrobin")
    parser.add_argument("--hang-at-offset", type=int, default=None,
                        help="the handler never returns for this offset (until SIGTERM)")
    parser.add_argument("--max-run-records", type=int, default=500)
    parser.add_argument("--transactional-id", default=None,
                        help="exactly-once mode: each record becomes one output record")
    parser.add_argument("--output-topic", default=None,
                        help="exactly-once mode: where the value '<partition> <offset>' goes")
    args = parser.parse_args()

    rng = random.Random(args.seed)
    rng_lock = threading.Lock()
    file_lock = threading.Lock()
    processed_fd = os.open(args.processed, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    pid = os.getpid()

    stop = threading.Event()

    def handler(message) -> list[OutputRecord] | None:
        if message.offset() == args.hang_at_offset:
            stop.wait()
            raise TransientFailure(f"stopped while hanging at {message.offset()}")
        with rng_lock:
            duration_s = rng.uniform(0, args.max_handler_ms) / 1000
            fails = rng.random() < args.failure_rate
        time.sleep(duration_s)
        if fails:
            raise TransientFailure(f"injected failure at {message.offset()}")
        line = f"{message.partition()} {message.offset()} {pid}\n".encode()
        with file_lock:
            os.write(processed_fd, line)
            os.fsync(processed_fd)
        if args.output_topic is None:
            return None
        return [OutputRecord(args.output_topic, f"{message.partition()} {message.offset()}"
                             .encode())]

    config = {"bootstrap.servers": args.bootstrap, "group.id": args.group,
              "auto.offset.reset": "earliest", "session.timeout.ms": args.session_timeout_ms,
              "heartbeat.interval.ms": max(100, args.session_timeout_ms // 3),
              "partition.assignment.strategy": args.assignment_strategy}
    options = ParallelConsumerOptions(
        workers=args.workers, ordering=args.ordering, commit_interval_ms=args.commit_interval_ms,
        retry_backoff_ms=1, retry_backoff_max_ms=20, poll_batch_records=50,
        max_run_records=args.max_run_records, transactional_id=args.transactional_id,
        buffer_limits=BufferLimits(max_buffered_records_per_partition=40, max_buffered_records=100))
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    consumer = ParallelConsumer(config, [args.topic], handler, options).start()
    print("started", flush=True)
    stop.wait()
    consumer.close()


if __name__ == "__main__":
    main()
