"""Produce p99 latency while a consumer catches up on a log that is not in the page cache.

One broker serves every round; one warmed-up paced producer (confluent-kafka, acks=1,
linger.ms=0, ``--rate`` msgs/s of ``--record-bytes`` records to the topic ``latency``)
measures both windows. The topic ``cold`` (one partition) gets ``--megabytes`` of 1000-byte
records once. Each of ``--rounds`` rounds:

1. drops ``cold``'s segment files from the page cache (fsync, then
   ``posix_fadvise(DONTNEED)``; no root needed), unless ``--warm``;
2. the paced producer runs ``--seconds`` (idle);
3. a consumer in its own process reads ``cold`` from offset 0 to its end (confluent-kafka
   with its defaults: 1 MiB per partition per Fetch; it counts the records without copying
   their values) while the paced producer keeps running until it is done.

Prints each round's p99s, the catch-up's MB/s and the share of ``cold``'s 1 MiB ranges wholly
in the page cache after it, then the medians and the ratio catch-up / idle. The broker reads slices not in
the page cache with ``O_DIRECT`` off its event loop (``headrace.broker.cold_reads``); A/B it
against an older commit by running this file from that commit's tree.

    .venv/bin/python bench/catchup_latency.py --megabytes 3000 --rounds 3

Scratch data under /tmp/catchup-bench (or ``--scratch``); the broker binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cleaner_produce_latency import (  # noqa: E402
    Broker,
    PacedProducer,
    free_port,
    median_of,
    p99_ms,
    report_round,
)

from headrace.storage.segment_io import page_cache_holds  # noqa: E402
from tests.page_cache import drop_from_page_cache  # noqa: E402

COLD_VALUE_BYTES = 1000
SHARE_RANGE_BYTES = 1024 * 1024


def fill(bootstrap: str, megabytes: int) -> int:
    """Write ``megabytes`` of records to ``cold``; returns how many."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.size": 1_000_000, "queue.buffering.max.kbytes": 512 * 1024})
    value = b"c" * COLD_VALUE_BYTES
    records = megabytes * 1024 * 1024 // COLD_VALUE_BYTES
    for _ in range(records):
        while True:
            try:
                producer.produce("cold", value=value, partition=0)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(300) == 0
    return records


def segment_files(data_dir: Path) -> list[Path]:
    return sorted((data_dir / "cold-0").glob("*.log"))


def cached_share(paths: list[Path]) -> float:
    """Share of the files' 1 MiB ranges wholly in the page cache (``page_cache_holds``:
    cachestat, or mincore before Linux 6.5)."""
    cached = ranges = 0
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            for position in range(0, size, SHARE_RANGE_BYTES):
                ranges += 1
                cached += page_cache_holds(fd, position, min(SHARE_RANGE_BYTES, size - position))
        finally:
            os.close(fd)
    return round(cached / ranges, 3) if ranges else 0.0


def consume_all(bootstrap: str, records: int) -> None:
    """The catch-up consumer (``--consume`` mode): read ``cold`` from 0; prints its MB/s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "catch-up",
                         "enable.auto.commit": False})  # 1 MiB per partition per Fetch
    consumer.assign([TopicPartition("cold", 0, 0)])
    started, seen, value_bytes = time.perf_counter(), 0, 0
    while seen < records:
        for message in consumer.consume(10_000, 5.0):
            if message.error() is None:
                seen += 1
                value_bytes += len(message)  # the value's size, without copying it
    elapsed = time.perf_counter() - started
    consumer.close()
    print(json.dumps({"catch_up_s": round(elapsed, 2),
                      "catch_up_mb_per_s": round(value_bytes / elapsed / 1e6, 1)}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=3000)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warm", action="store_true",
                        help="leave the log in the page cache (a catch-up from memory)")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/catchup-bench"))
    parser.add_argument("--consume", nargs=2, metavar=("BOOTSTRAP", "RECORDS"),
                        help=argparse.SUPPRESS)  # the consumer process's own mode
    args = parser.parse_args()
    if args.consume:
        consume_all(args.consume[0], int(args.consume[1]))
        return
    shutil.rmtree(args.scratch, ignore_errors=True)
    data_dir = args.scratch / "data"
    data_dir.mkdir(parents=True)
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker = Broker(data_dir, port, {"offsets.topic.num.partitions": "1"})
    rounds = []
    try:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        for future in admin.create_topics([NewTopic("cold", 1, 1),
                                           NewTopic("latency", 1, 1)]).values():
            future.result(30)
        records = fill(bootstrap, args.megabytes)
        paced = PacedProducer(bootstrap, args.rate, args.record_bytes)
        for round_number in range(args.rounds):
            if not args.warm:
                for path in segment_files(data_dir):
                    drop_from_page_cache(path)
            idle = paced.pace(args.seconds)
            consumer = subprocess.Popen([sys.executable, __file__, "--consume", bootstrap,
                                         str(records)], stdout=subprocess.PIPE, text=True)
            during = paced.pace(600, until=lambda c=consumer: c.poll() is not None)
            catch_up = json.loads(consumer.communicate(timeout=600)[0].strip().splitlines()[-1])
            report_round(rounds, {
                "round": round_number, "idle_p99_ms": round(p99_ms(idle), 2),
                "catch_up_p99_ms": round(p99_ms(during), 2), **catch_up,
                "cached_share_after": cached_share(segment_files(data_dir))})
    finally:
        broker.stop()

    def median(name: str) -> float:
        return median_of(rounds, name)

    print(json.dumps({"megabytes": args.megabytes, "rate": args.rate, "warm": args.warm,
                      "idle_p99_ms_median": median("idle_p99_ms"),
                      "catch_up_p99_ms_median": median("catch_up_p99_ms"),
                      "ratio": round(median("catch_up_p99_ms") / median("idle_p99_ms"), 2),
                      "catch_up_mb_per_s_median": median("catch_up_mb_per_s")}))
    shutil.rmtree(args.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
