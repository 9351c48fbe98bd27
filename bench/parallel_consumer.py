"""Benchmark: ParallelConsumer vs a plain single-threaded confluent-kafka consume loop.

Two figures, each a records/s ratio measured against the same topic in one run:
  io:   a 10 ms I/O-bound handler (time.sleep), ParallelConsumer with --workers (32) vs a plain loop
        (target >= 25x);
  noop: a handler doing nothing: plain loop records/s / ParallelConsumer records/s (target <= 1.3);
        noop_active_workers 0 means the consumer ran it on its poll thread (inline mode).
Both loops run with the same librdkafka settings (the ParallelConsumer's defaults,
LIBRDKAFKA_CONFIG_DEFAULTS, are given to the plain loop too). Each topic holds TAIL_FRACTION more
records than either loop counts, so neither ends on a consume() waiting out its timeout for a
batch the topic cannot fill. Prints one JSON line and one markdown row. Run against any broker, e.g. the Tansu peer:
  ../shared/bench/run-peer.sh -- sh -c '.venv/bin/python bench/parallel_consumer.py --bootstrap $BOOTSTRAP'
Scratch: topics named pcbench-*; nothing on disk.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.client import ParallelConsumer, ParallelConsumerOptions  # noqa: E402
from headrace.client.parallel_consumer import LIBRDKAFKA_CONFIG_DEFAULTS  # noqa: E402

IO_HANDLER_S = 0.010
METRICS_POLL_S = 0.001
VALUE_BYTES = 100
TAIL_FRACTION = 0.1  # records produced beyond those counted (see module doc)


def make_topic(bootstrap: str, partitions: int, records: int) -> str:
    """A new topic holding ``records`` plus a tail of TAIL_FRACTION more."""
    records += int(records * TAIL_FRACTION)
    name = f"pcbench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1)]).values():
        future.result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20})
    value = b"x" * VALUE_BYTES
    for index in range(records):
        while True:
            try:
                producer.produce(name, key=str(index).encode(), value=value,
                                 partition=index % partitions)
                break
            except BufferError:  # librdkafka's queue.buffering.max.messages: wait for acks
                producer.poll(0.1)
        if index % 10_000 == 0:
            producer.poll(0)
    producer.flush(60)
    return name


def group_config(bootstrap: str) -> dict:
    return {**LIBRDKAFKA_CONFIG_DEFAULTS, "bootstrap.servers": bootstrap,
            "group.id": f"pcbench-{uuid.uuid4().hex[:8]}", "auto.offset.reset": "earliest",
            "enable.auto.commit": False}


def plain_loop(bootstrap: str, topic: str, records: int, handler) -> float:
    """records/s of consume + handler one at a time, committing every second like the PC."""
    consumer = Consumer(group_config(bootstrap))
    consumer.subscribe([topic])
    seen, started, next_commit = 0, None, 0.0
    while seen < records:
        for message in consumer.consume(500, 0.1):
            if message.error() is None:
                started = started or time.perf_counter()
                handler(message)
                seen += 1
        if started and time.perf_counter() >= next_commit:
            consumer.commit(asynchronous=True)
            next_commit = time.perf_counter() + 1
    elapsed = time.perf_counter() - started
    consumer.close()
    return seen / elapsed


def parallel(bootstrap: str, topic: str, records: int, handler, workers: int,
             ordering: str) -> tuple[float, int]:
    """records/s of the ParallelConsumer running ``handler`` itself (no counting wrapper, so
    both loops run the same handler): from the first completed run to ``records`` processed,
    read from its metrics every METRICS_POLL_S; and the active workers it ended with (its
    adaptive parallelism, see headrace/client/parallelism.py)."""
    consumer = ParallelConsumer(group_config(bootstrap), [topic], handler,
                                ParallelConsumerOptions(workers=workers, ordering=ordering))
    started = None
    with consumer:
        while (processed := consumer.metrics().processed_records) < records:
            if started is None and processed:
                started = time.perf_counter()
            time.sleep(METRICS_POLL_S)
        elapsed = time.perf_counter() - started  # before close: its commit is not timed
        active_workers = consumer.metrics().active_workers
    return records / elapsed, active_workers


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--partitions", type=int, default=6)
    parser.add_argument("--workers", type=int, default=32)
    parser.add_argument("--ordering", default="key")
    parser.add_argument("--io-records", type=int, default=3_000)
    parser.add_argument("--noop-records", type=int, default=100_000)
    parser.add_argument("--only", choices=["io", "noop"], help="measure one figure only")
    args = parser.parse_args()

    result = {"bench": "parallel_consumer", "partitions": args.partitions,
              "workers": args.workers, "ordering": args.ordering}
    if args.only in (None, "io"):
        io_topic = make_topic(args.bootstrap, args.partitions, args.io_records)
        plain_io = plain_loop(args.bootstrap, io_topic, args.io_records // 10,
                              lambda _m: time.sleep(IO_HANDLER_S))
        parallel_io, io_active_workers = parallel(args.bootstrap, io_topic, args.io_records,
                               lambda _m: time.sleep(IO_HANDLER_S), args.workers, args.ordering)
        result.update(plain_io_rps=round(plain_io), parallel_io_rps=round(parallel_io),
                      io_speedup=round(parallel_io / plain_io, 2),
                      io_active_workers=io_active_workers)
    if args.only in (None, "noop"):
        noop_topic = make_topic(args.bootstrap, args.partitions, args.noop_records)
        plain_noop = plain_loop(args.bootstrap, noop_topic, args.noop_records, lambda _m: None)
        parallel_noop, noop_active_workers = parallel(args.bootstrap, noop_topic, args.noop_records, lambda _m: None,
                                 args.workers, args.ordering)
        result.update(plain_noop_rps=round(plain_noop), parallel_noop_rps=round(parallel_noop),
                      noop_cost_ratio=round(plain_noop / parallel_noop, 2),
                      noop_active_workers=noop_active_workers)
    print(json.dumps(result))
    print(f"| parallel_consumer | {args.partitions} | {args.workers} | {args.ordering} | "
          f"{result.get('io_speedup', '-')}x (>=25x) | "
          f"{result.get('noop_cost_ratio', '-')}x (<=1.3x) |")


if __name__ == "__main__":
    main()
