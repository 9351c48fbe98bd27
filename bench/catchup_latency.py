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

Prints each round's p99s, the catch-up's MB/s and the share of ``cold``'s pages in the page
cache after it, then the medians and the ratio catch-up / idle. The broker reads slices not in
the page cache with ``O_DIRECT`` off its event loop (``headrace.broker.cold_reads``); A/B it
against an older commit by running this file from that commit's tree.

    .venv/bin/python bench/catchup_latency.py --megabytes 3000 --rounds 3

Scratch data under /tmp/catchup-bench (or ``--scratch``); the broker binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))

from cleaner_produce_latency import Broker, PacedProducer, free_port, p99_ms  # noqa: E402

COLD_VALUE_BYTES = 1000
PAGE_BYTES = 4096
CACHESTAT_SYSCALL = 451


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


def drop_from_page_cache(paths: list[Path]) -> None:
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def cached_share(paths: list[Path]) -> float | None:
    """Share of the files' pages in the page cache (cachestat(2), Linux 6.5+; None without)."""
    libc = ctypes.CDLL(None, use_errno=True)
    cached = pages = 0
    for path in paths:
        result = _Cachestat()
        with open(path, "rb") as file:
            if libc.syscall(CACHESTAT_SYSCALL, file.fileno(),
                            ctypes.byref(_CachestatRange(0, 0)), ctypes.byref(result), 0):
                return None
        cached += result.nr_cache
        pages += -(-path.stat().st_size // PAGE_BYTES)
    return round(cached / pages, 3) if pages else None


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
                drop_from_page_cache(segment_files(data_dir))
            idle = paced.pace(args.seconds)
            consumer = subprocess.Popen([sys.executable, __file__, "--consume", bootstrap,
                                         str(records)], stdout=subprocess.PIPE, text=True)
            during = paced.pace(600, until=lambda c=consumer: c.poll() is not None)
            catch_up = json.loads(consumer.communicate(timeout=600)[0].strip().splitlines()[-1])
            result = {"round": round_number, "idle_p99_ms": round(p99_ms(idle), 2),
                      "catch_up_p99_ms": round(p99_ms(during), 2), **catch_up,
                      "cached_share_after": cached_share(segment_files(data_dir)),
                      "load_average_1m": round(os.getloadavg()[0], 2)}
            rounds.append(result)
            print(json.dumps(result), flush=True)
    finally:
        broker.stop()

    def median(name: str) -> float:
        return round(statistics.median(r[name] for r in rounds), 2)

    print(json.dumps({"megabytes": args.megabytes, "rate": args.rate, "warm": args.warm,
                      "idle_p99_ms_median": median("idle_p99_ms"),
                      "catch_up_p99_ms_median": median("catch_up_p99_ms"),
                      "ratio": round(median("catch_up_p99_ms") / median("idle_p99_ms"), 2),
                      "catch_up_mb_per_s_median": median("catch_up_mb_per_s")}))
    shutil.rmtree(args.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
