"""The broker's CPU per Fetch round trip, as a real consumer (confluent-kafka) drives it.

Spawns ``headrace broker`` on a free loopback port with a fresh data directory under
``--scratch`` (from the checkout ``--source``, default this one: compare two versions in one
session by running both), and for each codec in ``--codecs`` creates a one-partition topic, produces
``--records`` JSON-like values of ``--record-bytes`` (librdkafka, acks 1, linger.ms 5,
batch.size 1000000, as the benchmark matrix), then ``--repeat`` times consumes the whole
topic from the beginning with a fresh assigned consumer (the matrix's consumer settings:
one Fetch in flight, max.partition.fetch.bytes 1 MiB).

Per consume it reads the broker's CPU time (the scheduler's per-thread run time, ns) over
the consume and the number of Fetch requests the consumer sent (librdkafka's own
statistics), and prints, per codec, the median over the repeats of:

* ``broker_us_per_fetch``: broker CPU microseconds per Fetch request;
* ``broker_cpu_s_per_gb``: broker CPU seconds per GB of record values delivered;
* ``fetches``, ``records_per_s`` and the consume wall time (noisy on a shared machine).

CPU per Fetch is the figure to compare between versions; quote ``uptime`` with it.

    .venv/bin/python bench/fetch_cost.py [--records 300000] [--codecs none,lz4] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parents[1]
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
STARTUP_TIMEOUT_S = 30.0
CONSUME_IDLE_TIMEOUT_S = 15.0
STATS_INTERVAL_MS = 200
CORPUS_BYTES = 4 * 1024 * 1024
OFFSET_BEGINNING = -2


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def broker_cpu_s(pid: int) -> float:
    """CPU time of process ``pid``, all its threads, in seconds: the scheduler's nanosecond
    run time per thread (/proc/PID/task/TID/schedstat) where the kernel keeps it, else
    utime + stime from /proc/PID/stat (clock ticks: 10 ms steps)."""
    total_ns = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            total_ns += int((task / "schedstat").read_text().split()[0])
        return total_ns / 1e9
    except (FileNotFoundError, ProcessLookupError):  # no schedstat, or a thread just ended
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def start_broker(data_dir: Path, port: int, source: Path = REPO) -> subprocess.Popen:
    command = [sys.executable, "-m", "headrace.cli.main", "broker",
               "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
               "--override", f"log.dirs={data_dir}"]
    env = {**os.environ, "PYTHONPATH": str(source)}
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL,
                               stderr=open(data_dir.parent / "broker.log", "wb"))
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"broker exited early, see {data_dir.parent / 'broker.log'}")
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return process
        except OSError:
            time.sleep(0.1)
    process.kill()
    raise SystemExit(f"broker not listening on {port} after {STARTUP_TIMEOUT_S} s")


def json_like_corpus(size_bytes: int, seed: int = 42) -> bytes:
    """Log-line-like JSON text: compresses about as well as the matrix's payloads."""
    rnd = random.Random(seed)
    words = ("request completed user session cache miss hit timeout retry upstream payload "
             "order item checkout latency database query shard replica leader commit").split()
    lines, total = [], 0
    while total < size_bytes:
        line = json.dumps({
            "ts": 1_700_000_000_000 + total, "level": rnd.choice(["INFO", "WARN", "ERROR"]),
            "service": f"svc-{rnd.randint(1, 12)}", "trace_id": f"{rnd.getrandbits(128):032x}",
            "user_id": rnd.randint(1, 10**6), "status": rnd.choice([200, 201, 404, 500]),
            "duration_ms": round(rnd.expovariate(1 / 40), 3),
            "msg": " ".join(rnd.choice(words) for _ in range(rnd.randint(4, 14))),
        }).encode() + b"\n"
        lines.append(line)
        total += len(line)
    return b"".join(lines)[:size_bytes]


def produce(bootstrap: str, topic: str, codec: str, records: int, record_bytes: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)
    corpus = json_like_corpus(CORPUS_BYTES)
    span = len(corpus) - record_bytes
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "compression.type": codec,
                         "linger.ms": 5, "batch.size": 1_000_000,
                         "queue.buffering.max.messages": 1_000_000})
    for index in range(records):
        start = (index * 1031) % span
        value = corpus[start:start + record_bytes]
        while True:
            try:
                producer.produce(topic, value, partition=0)
                break
            except BufferError:
                producer.poll(0.005)
        if not index & 1023:
            producer.poll(0)
    if producer.flush(120):
        raise SystemExit(f"producing to {topic}: records left undelivered")


def consume_once(bootstrap: str, topic: str, records: int, broker_pid: int) -> dict:
    """Read the topic from the beginning once; broker CPU and Fetch count for it."""
    snapshots: list[str] = []
    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"fetch-cost-{time.monotonic_ns()}",
        "enable.auto.commit": False, "broker.address.family": "v4",
        "queued.min.messages": 1_000_000, "queued.max.messages.kbytes": 262144,
        "fetch.queue.backoff.ms": 5, "statistics.interval.ms": STATS_INTERVAL_MS,
        "stats_cb": snapshots.append,
    })
    received = value_bytes = 0
    try:
        cpu_start_s, wall_start_s = broker_cpu_s(broker_pid), time.perf_counter()
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        idle_deadline = time.monotonic() + CONSUME_IDLE_TIMEOUT_S
        while received < records and time.monotonic() < idle_deadline:
            for message in consumer.consume(num_messages=10_000, timeout=0.5):
                if message.error() is not None:
                    if message.error().code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SystemExit(f"consumer error: {message.error()}")
                received += 1
                value_bytes += len(message.value())
                idle_deadline = time.monotonic() + CONSUME_IDLE_TIMEOUT_S
        wall_s = time.perf_counter() - wall_start_s
        cpu_s = broker_cpu_s(broker_pid) - cpu_start_s
        consumer.pause([TopicPartition(topic, 0)])  # no more Fetches while the stats arrive
        stats_seen = len(snapshots)
        stats_deadline = time.monotonic() + 5
        while len(snapshots) <= stats_seen and time.monotonic() < stats_deadline:
            consumer.poll(0.05)
    finally:
        consumer.close()
    if received < records:
        raise SystemExit(f"consumed {received} of {records} records from {topic}")
    fetches = sum(broker.get("req", {}).get("Fetch", 0)
                  for broker in json.loads(snapshots[-1])["brokers"].values()
                  if broker.get("nodeid", -1) >= 0)
    return {"fetches": fetches, "broker_cpu_s": cpu_s, "wall_s": wall_s,
            "value_bytes": value_bytes, "records": received}


def summarize(codec: str, runs: list[dict]) -> dict:
    def median(key_function) -> float:
        return statistics.median(key_function(run) for run in runs)

    return {
        "codec": codec,
        "broker_us_per_fetch": round(median(lambda r: 1e6 * r["broker_cpu_s"] / r["fetches"]), 1),
        "broker_cpu_s_per_gb": round(median(lambda r: r["broker_cpu_s"] / (r["value_bytes"] / 1e9)), 3),
        "fetches": median(lambda r: r["fetches"]),
        "records_per_s": round(median(lambda r: r["records"] / r["wall_s"])),
        "wall_s": round(median(lambda r: r["wall_s"]), 3),
        "runs": [{k: round(v, 3) if isinstance(v, float) else v for k, v in run.items()}
                 for run in runs],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--codecs", default="none,lz4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scratch", default="/tmp/fetch-cost")
    parser.add_argument("--source", type=Path, default=REPO,
                        help="the headrace checkout whose broker runs (default: this one)")
    args = parser.parse_args()
    Path(args.scratch).mkdir(parents=True, exist_ok=True)
    work_dir = Path(tempfile.mkdtemp(dir=args.scratch))
    data_dir = work_dir / "data"
    data_dir.mkdir()
    port = free_port()
    broker = start_broker(data_dir, port, args.source)
    bootstrap = f"127.0.0.1:{port}"
    try:
        for codec in args.codecs.split(","):
            topic = f"fetch-cost-{codec}"
            produce(bootstrap, topic, codec, args.records, args.record_bytes)
            runs = [consume_once(bootstrap, topic, args.records, broker.pid)
                    for _ in range(args.repeat)]
            print(json.dumps({"load": os.getloadavg()[0], **summarize(codec, runs)}), flush=True)
    finally:
        broker.send_signal(signal.SIGTERM)
        try:
            broker.wait(30)
        except subprocess.TimeoutExpired:
            broker.kill()
        shutil.rmtree(work_dir, ignore_errors=True)


if __name__ == "__main__":
    main()
