"""Produce p99 latency while the log cleaner runs in the broker, against idle (goal <= 2x).

One broker (cleaner enabled, ``log.cleaner.backoff.ms=100``) serves every round, and one
warmed-up paced producer (confluent-kafka, acks=1, linger.ms=0, ``--rate`` msgs/s of
``--record-bytes`` records to the plain topic ``latency``) measures both windows, so start-up
and connection set-up are in neither. Each of ``--runs`` rounds:

1. the topic ``dirty`` is set to ``cleanup.policy=delete`` (infinite retention: nothing is
   removed, nothing is cleaned) and gets ``--megabytes`` of keyed updates (``--keys`` distinct
   keys, ``--value-bytes`` values);
2. idle window: the paced producer runs ``--seconds``;
3. ``dirty`` is altered to ``cleanup.policy=compact`` and the paced producer runs until the
   broker logs this round's cleaning summary line (at most ``--max-cleaning-seconds``): the
   cleaning window, over exactly the cleaning.

Prints each round's p99s (with the 1-minute load average: on a shared 2-core machine other
load moves the idle p99 by 10x, so rounds on a busy machine say little), the medians of the
rounds and the ratio cleaning / idle.

    .venv/bin/python bench/cleaner_produce_latency.py --megabytes 1200 --rate 1000 --runs 3

Scratch data under /tmp/cleaner-bench (or ``--scratch``); the broker binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from confluent_kafka import Producer
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

REPO = Path(__file__).resolve().parents[1]
STARTUP_TIMEOUT_S = 60.0
SEGMENT_BYTES = 64 * 1024 * 1024
POLL_MIN_S = 0.001  # librdkafka's poll timeout resolution


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Broker:
    def __init__(self, data_dir: Path, port: int, overrides: dict[str, str]) -> None:
        command = [sys.executable, "-m", "headrace.cli.main", "broker",
                   "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
                   "--override", f"log.dirs={data_dir}"]
        for key, value in overrides.items():
            command += ["--override", f"{key}={value}"]
        self.log_path = data_dir.parent / "broker.log"
        with open(self.log_path, "ab") as log_file:
            self.process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT,
                                            cwd=REPO)
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("broker did not start")

    def stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(120)


def fill(bootstrap: str, megabytes: int, keys: int, value_bytes: int, round_number: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "batch.size": 1_000_000, "queue.buffering.max.kbytes": 512 * 1024})
    value = b"v" * value_bytes
    records = megabytes * 1024 * 1024 // (value_bytes + 40)
    for sequence in range(records):
        key = b"key-%012d" % ((sequence * 7919 + round_number) % keys)
        while True:
            try:
                producer.produce("dirty", key=key, value=value)
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(300) == 0


class PacedProducer:
    """A warmed-up acks=1 producer sending ``rate`` records/s to ``latency``."""

    def __init__(self, bootstrap: str, rate: int, record_bytes: int) -> None:
        self.producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "1"})
        self.interval_s = 1.0 / rate
        self.payload = b"x" * record_bytes
        for _ in range(rate):  # a second of traffic: connections, metadata, buffers settle
            self.producer.produce("latency", value=self.payload)
            time.sleep(self.interval_s)
        assert self.producer.flush(30) == 0

    def p99_ms(self, seconds: float, until=lambda: False) -> tuple[float, float]:
        """(p99 ms, window s) of pacing for ``seconds`` or until ``until()``."""
        latencies_ms: list[float] = []

        def delivered(error, _message, sent_s):
            if error is None:
                latencies_ms.append((time.perf_counter() - sent_s) * 1000)

        start = time.perf_counter()
        sequence = 0
        while sequence * self.interval_s < seconds and not (sequence % 50 == 0 and until()):
            due = start + sequence * self.interval_s
            sequence += 1
            while (now := time.perf_counter()) < due:
                # Block until the send is due (delivery reports still wake it at once):
                # librdkafka takes whole milliseconds, so a shorter wait would spin and keep a
                # core busy that the broker under test should have.
                self.producer.poll(max(due - now, POLL_MIN_S))
            sent = time.perf_counter()
            self.producer.produce("latency", value=self.payload,
                                  on_delivery=lambda e, m, s=sent: delivered(e, m, s))
            self.producer.poll(0)
        window_s = time.perf_counter() - start
        self.producer.flush(30)
        latencies_ms.sort()
        return latencies_ms[int(0.99 * (len(latencies_ms) - 1))], window_s


def create_topics(bootstrap: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.create_topics([
        NewTopic("dirty", 1, 1, config={"cleanup.policy": "delete", "retention.ms": "-1",
                                        "segment.bytes": str(SEGMENT_BYTES)}),
        NewTopic("latency", 1, 1),
    ])
    for future in futures.values():
        future.result(30)


def set_cleanup_policy(bootstrap: str, policy: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, "dirty", incremental_configs=[entry])
    admin.incremental_alter_configs([resource])[resource].result(30)


class CleaningsLogged:
    """How many cleanings of ``dirty`` the broker has logged a summary line for. Asked every
    50 sends inside the measured window, so each call reads only what the log gained since
    the previous one (re-reading the whole log each time kept the measuring process busy)."""

    SUMMARY_MARK = b"cleaned log dirty-0"

    def __init__(self, broker_log: Path) -> None:
        self.broker_log = broker_log
        self.read_bytes = 0
        self.count = 0
        self.tail = b""  # a mark may straddle two reads

    def __call__(self) -> int:
        with open(self.broker_log, "rb") as log_file:
            log_file.seek(self.read_bytes)
            data = log_file.read()
        self.read_bytes += len(data)
        text = self.tail + data
        self.count += text.count(self.SUMMARY_MARK)
        self.tail = text[-(len(self.SUMMARY_MARK) - 1):]
        return self.count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=1200)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--max-cleaning-seconds", type=float, default=120.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/cleaner-bench"))
    parser.add_argument("--override", action="append", default=[],
                        help="extra broker key=value")
    args = parser.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    data_dir = args.scratch / "data"
    data_dir.mkdir(parents=True)
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    extra = dict(item.split("=", 1) for item in args.override)
    broker = Broker(data_dir, port, {"log.cleaner.backoff.ms": "100",
                                     "offsets.topic.num.partitions": "1", **extra})
    idle, cleaning = [], []
    cleanings_logged = CleaningsLogged(broker.log_path)
    try:
        create_topics(bootstrap)
        paced = PacedProducer(bootstrap, args.rate, args.record_bytes)
        for round_number in range(args.runs):
            set_cleanup_policy(bootstrap, "delete")
            fill(bootstrap, args.megabytes, args.keys, args.value_bytes, round_number)
            idle_p99, idle_s = paced.p99_ms(args.seconds)
            done_before = cleanings_logged()
            set_cleanup_policy(bootstrap, "compact")
            cleaning_p99, cleaning_s = paced.p99_ms(
                args.max_cleaning_seconds,
                until=lambda done=done_before: cleanings_logged() > done)
            idle.append(idle_p99)
            cleaning.append(cleaning_p99)
            print(json.dumps({"round": round_number, "idle_p99_ms": round(idle_p99, 2),
                              "idle_window_s": round(idle_s, 1),
                              "cleaning_p99_ms": round(cleaning_p99, 2),
                              "cleaning_window_s": round(cleaning_s, 1),
                              "cleaning_finished_in_window":
                                  cleanings_logged() > done_before,
                              "load_average_1m": round(os.getloadavg()[0], 2)}),
                  flush=True)
    finally:
        broker.stop()
    idle_median, cleaning_median = statistics.median(idle), statistics.median(cleaning)
    print(json.dumps({"dirty_megabytes_per_round": args.megabytes, "rate": args.rate,
                      "idle_p99_ms_median": round(idle_median, 2),
                      "cleaning_p99_ms_median": round(cleaning_median, 2),
                      "ratio": round(cleaning_median / idle_median, 2), "goal": "<= 2.0",
                      "cpus": os.cpu_count()}))
    shutil.rmtree(args.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
