"""Produce p99 latency while the log cleaner runs in the broker, against idle (goal <= 2x).

One broker (cleaner enabled, ``log.cleaner.backoff.ms=100``) serves every round, and one
warmed-up paced producer (confluent-kafka, acks=1, linger.ms=0, ``--rate`` msgs/s of
``--record-bytes`` records to the plain topic ``latency``) measures both windows, so start-up
and connection set-up are in neither. Each of ``--runs`` rounds:

1. the topic ``dirty`` is set to ``cleanup.policy=delete`` (infinite retention: nothing is
   removed, nothing is cleaned) and gets ``--megabytes`` of keyed updates (``--keys`` distinct
   keys, ``--value-bytes`` values);
2. the paced producer runs ``--seconds`` (idle);
3. ``dirty`` is altered to ``cleanup.policy=compact`` and the paced producer runs until the
   broker logs this round's cleaning summary line (at most ``--max-cleaning-seconds``).

Every delivered record is kept with its send time (wall clock) and latency. Two definitions
of the windows, both printed:

- ``cleaning`` (the goal's: produce latency during the cleaning): records sent from the
  cleaning's start (the ``time_ms`` of its ``last_cleaning`` in the broker's
  ``cleaner-status.json``: when the cleaner picked the partition) to its end (the broker log's
  time stamp on the summary line), against records sent in the idle window's last stretch of
  the same length, at the same rate. A round's cleaning lasts about a second, so the round's
  p99 rests on a few thousand records at the default rate; the rounds' records are also
  pooled into one p99 per window (``pooled``).
- ``alter_to_summary`` (the earlier definition): records sent from the AlterConfigs to the
  summary line, against the whole idle window. It includes the AlterConfigs and the
  cleaner's wait for its next look (``log.cleaner.backoff.ms``).

Prints each round's p99s (with the 1-minute load average: on a shared 2-core machine other
load moves the idle p99 by 10x, so rounds on a busy machine say little), the medians of the
rounds and the pooled p99s with their ratios cleaning / idle.

    .venv/bin/python bench/cleaner_produce_latency.py --megabytes 2400 --rate 2000 --runs 3

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
from datetime import datetime
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
STATUS_TIMEOUT_S = 30.0


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

    def pace(self, seconds: float, until=lambda: False) -> list[tuple[float, float]]:
        """Pace for ``seconds`` or until ``until()`` (asked every 50 sends); the (send time,
        wall clock s; latency ms) of every delivered record."""
        delivered_records: list[tuple[float, float]] = []

        def delivered(error, _message, sent):
            if error is None:
                wall_s, sent_s = sent
                delivered_records.append((wall_s, (time.perf_counter() - sent_s) * 1000))

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
            sent = (time.time(), time.perf_counter())
            self.producer.produce("latency", value=self.payload,
                                  on_delivery=lambda e, m, s=sent: delivered(e, m, s))
            self.producer.poll(0)
        self.producer.flush(30)
        return delivered_records


def p99_ms(records: list[tuple[float, float]]) -> float:
    latencies_ms = sorted(latency for _, latency in records)
    return latencies_ms[int(0.99 * (len(latencies_ms) - 1))]


def sent_between(records: list[tuple[float, float]], start_s: float,
                 end_s: float) -> list[tuple[float, float]]:
    return [record for record in records if start_s <= record[0] <= end_s]


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
    """How many cleanings of ``dirty`` the broker has logged a summary line for, and the log's
    time stamp on the latest. Asked every 50 sends inside the measured window, so each call
    reads only what the log gained since the previous one (re-reading the whole log each
    time kept the measuring process busy)."""

    SUMMARY_MARK = b"cleaned log dirty-0"
    TIME_FORMAT = "%Y-%m-%d %H:%M:%S,%f"  # logging's asctime, local time

    def __init__(self, broker_log: Path) -> None:
        self.broker_log = broker_log
        self.read_bytes = 0
        self.count = 0
        self.last_summary_s = 0.0
        self.partial_line = b""  # a line may straddle two reads

    def __call__(self) -> int:
        with open(self.broker_log, "rb") as log_file:
            log_file.seek(self.read_bytes)
            data = log_file.read()
        self.read_bytes += len(data)
        *lines, self.partial_line = (self.partial_line + data).split(b"\n")
        for line in lines:
            if self.SUMMARY_MARK in line:
                self.count += 1
                stamp = line[:23].decode()
                self.last_summary_s = datetime.strptime(stamp, self.TIME_FORMAT).timestamp()
        return self.count


def cleaning_start_s(data_dir: Path, after_s: float) -> float:
    """When the cleaner picked ``dirty-0`` for its latest cleaning (broker wall clock, s),
    once the cleaner status file shows a cleaning that started after ``after_s`` (the file
    is written just after the summary line is logged)."""
    deadline_s = time.monotonic() + STATUS_TIMEOUT_S
    while time.monotonic() < deadline_s:
        try:
            document = json.loads((data_dir / "cleaner-status.json").read_text())
        except (FileNotFoundError, ValueError):  # not written yet / being replaced
            document = {"partitions": []}
        for entry in document["partitions"]:
            if (entry["topic"], entry["partition"]) == ("dirty", 0) and entry["last_cleaning"]:
                start_s = entry["last_cleaning"]["time_ms"] / 1000
                if start_s > after_s:
                    return start_s
        time.sleep(0.05)
    raise RuntimeError("the cleaner status file shows no new cleaning of dirty-0")


def ratio(cleaning_ms: float, idle_ms: float) -> float:
    return round(cleaning_ms / idle_ms, 2)


def report_round(rounds: list[dict], result: dict) -> None:
    """Keep a round's result (with the 1-minute load average) and print it as a JSON line."""
    result["load_average_1m"] = round(os.getloadavg()[0], 2)
    rounds.append(result)
    print(json.dumps(result), flush=True)


def median_of(rounds: list[dict], name: str) -> float:
    return round(statistics.median(r[name] for r in rounds), 2)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=2400)
    parser.add_argument("--keys", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=2000)
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
    rounds: list[dict] = []
    pooled_idle, pooled_cleaning = [], []
    cleanings_logged = CleaningsLogged(broker.log_path)
    try:
        create_topics(bootstrap)
        paced = PacedProducer(bootstrap, args.rate, args.record_bytes)
        for round_number in range(args.runs):
            set_cleanup_policy(bootstrap, "delete")
            fill(bootstrap, args.megabytes, args.keys, args.value_bytes, round_number)
            idle = paced.pace(args.seconds)
            done_before = cleanings_logged()
            altered_s = time.time()
            set_cleanup_policy(bootstrap, "compact")
            after_alter = paced.pace(args.max_cleaning_seconds,
                                     until=lambda done=done_before: cleanings_logged() > done)
            if cleanings_logged() <= done_before:
                raise RuntimeError(f"no cleaning within {args.max_cleaning_seconds} s")
            start_s = cleaning_start_s(data_dir, altered_s)
            end_s = cleanings_logged.last_summary_s
            during = sent_between(after_alter, start_s, end_s)
            idle_end_s = idle[-1][0]
            idle_same_length = sent_between(idle, idle_end_s - (end_s - start_s), idle_end_s)
            pooled_idle += idle_same_length
            pooled_cleaning += during
            result = {"round": round_number,
                      "cleaning_s": round(end_s - start_s, 2), "cleaning_records": len(during),
                      "idle_p99_ms": round(p99_ms(idle_same_length), 2),
                      "cleaning_p99_ms": round(p99_ms(during), 2),
                      "alter_to_summary_s": round(after_alter[-1][0] - after_alter[0][0], 2),
                      "alter_to_summary_p99_ms": round(p99_ms(after_alter), 2),
                      "idle_whole_p99_ms": round(p99_ms(idle), 2)}
            report_round(rounds, result)
    finally:
        broker.stop()

    def median(name: str) -> float:
        return median_of(rounds, name)

    print(json.dumps({
        "dirty_megabytes_per_round": args.megabytes, "rate": args.rate, "cpus": os.cpu_count(),
        "idle_p99_ms_median": median("idle_p99_ms"),
        "cleaning_p99_ms_median": median("cleaning_p99_ms"),
        "ratio": ratio(median("cleaning_p99_ms"), median("idle_p99_ms")),
        "pooled_idle_p99_ms": round(p99_ms(pooled_idle), 2),
        "pooled_cleaning_p99_ms": round(p99_ms(pooled_cleaning), 2),
        "pooled_records": len(pooled_cleaning),
        "pooled_ratio": ratio(p99_ms(pooled_cleaning), p99_ms(pooled_idle)),
        "alter_to_summary_ratio": ratio(median("alter_to_summary_p99_ms"),
                                        median("idle_whole_p99_ms")),
        "goal": "<= 2.0"}))
    shutil.rmtree(args.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
