"""Broker CPU-seconds per GB and producer MB/s of compressed produce, for one or more trees.

For each round, codec and tree (interleaved, so a busy machine's noise falls on all alike):
spawns ``headrace broker`` from that tree (``PYTHONPATH`` and working directory the tree) on a
free loopback port with a fresh data directory, creates a one-partition topic, and produces
``--megabytes`` of ``--record-bytes`` JSON-like log values with a confluent-kafka producer
(``--linger-ms``, ``acks`` as ``--acks``, kbench's defaults otherwise: batch.size 1 MB), then
stops the broker. The broker's CPU (utime+stime of every thread, /proc/PID/stat) over the
produce phase divided by the bytes produced is the figure to compare on a shared machine;
MB/s also holds the client's share of the two cores.

    PYTHONPATH=. nice -n 5 .venv/bin/python bench/produce_codec_cost.py \\
        --tree base=../headrace-1f413ac --tree new=. --codecs lz4,zstd,gzip --megabytes 300

(``../headrace-1f413ac``: a checkout of 1f413ac beside the repository, built in place.)

``--profile-dir DIR`` runs each broker under ``bench/sampling_profiler.py`` and leaves one
profile per run in DIR.
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
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fetch_cost import json_like_corpus  # noqa: E402  (the matrix-like payload)

STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0
PRODUCE_TIMEOUT_S = 600.0
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
CORPUS_BYTES = 8 * 1024 * 1024
PROFILER = Path(__file__).resolve().parent / "sampling_profiler.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def broker_counters(pid: int) -> tuple[float, float, int]:
    """(user CPU s, system CPU s, minor page faults) of every thread of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) / CLOCK_TICKS_PER_S, int(fields[12]) / CLOCK_TICKS_PER_S,
            int(fields[7]))


def spawn_broker(tree: Path, data_dir: Path, port: int, profile_path: Path | None
                 ) -> subprocess.Popen:
    prefix = [sys.executable]
    if profile_path is not None:
        prefix += [str(PROFILER), "--out", str(profile_path), "--"]
    command = [*prefix, "-m", "headrace.cli.main", "broker",
               "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
               "--override", f"log.dirs={data_dir}"]
    env = {**os.environ, "PYTHONPATH": str(tree)}
    process = subprocess.Popen(command, cwd=tree, env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"broker from {tree} exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"broker from {tree} did not start")


def stop_broker(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(STOP_TIMEOUT_S)


def create_topic(bootstrap: str, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)


def produce(bootstrap: str, topic: str, args: argparse.Namespace, codec: str,
            corpus: bytes) -> int:
    """Produce ``args.megabytes`` of values; the bytes delivered."""
    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec,
                         "linger.ms": args.linger_ms, "acks": args.acks,
                         "batch.size": 1_000_000, "queue.buffering.max.kbytes": 1_048_576})
    failures: list[str] = []

    def delivered(error, _message) -> None:
        if error is not None:
            failures.append(str(error))

    records = args.megabytes * 1_000_000 // args.record_bytes
    span = len(corpus) - args.record_bytes
    deadline = time.monotonic() + PRODUCE_TIMEOUT_S
    for index in range(records):
        start = (index * 7919) % span
        value = corpus[start : start + args.record_bytes]
        while True:
            try:
                producer.produce(topic, value, on_delivery=delivered)
                break
            except BufferError:
                producer.poll(0.05)
        if index % 10_000 == 0:
            producer.poll(0)
            if time.monotonic() > deadline:
                raise RuntimeError("produce phase timed out")
    if producer.flush(PRODUCE_TIMEOUT_S):
        raise RuntimeError("records still undelivered after the flush timeout")
    if failures:
        raise RuntimeError(f"{len(failures)} records failed, first: {failures[0]}")
    return records * args.record_bytes


def one_run(label: str, tree: Path, codec: str, args: argparse.Namespace, corpus: bytes,
            round_index: int) -> dict:
    scratch = args.dir / f"{label}-{codec}-{round_index}"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    port = free_port()
    profile_path = (args.profile_dir / f"{label}-{codec}-{round_index}.txt"
                    if args.profile_dir else None)
    process = spawn_broker(tree, scratch / "data", port, profile_path)
    try:
        bootstrap = f"127.0.0.1:{port}"
        create_topic(bootstrap, "codec-cost")
        before, wall_before = broker_counters(process.pid), time.perf_counter()
        produced_bytes = produce(bootstrap, "codec-cost", args, codec, corpus)
        wall_s = time.perf_counter() - wall_before
        user_s, system_s, minor_faults = (
            after - start for after, start in zip(broker_counters(process.pid), before, strict=True))
    finally:
        stop_broker(process)
        shutil.rmtree(scratch, ignore_errors=True)
    return {"tree": label, "codec": codec, "round": round_index,
            "cpu_s_per_gb": (user_s + system_s) / produced_bytes * 1e9,
            "system_s_per_gb": system_s / produced_bytes * 1e9,
            "minor_faults_per_mb": minor_faults / produced_bytes * 1e6,
            "mb_per_s": produced_bytes / wall_s / 1e6}


def parse_tree(text: str) -> tuple[str, Path]:
    label, _, path = text.rpartition("=")
    return (label or Path(path).resolve().name), Path(path).resolve()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", action="append", type=parse_tree, required=True,
                        help="LABEL=PATH of a headrace checkout (repeatable)")
    parser.add_argument("--codecs", default="lz4,zstd,gzip,snappy")
    parser.add_argument("--megabytes", type=int, default=300)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--linger-ms", type=float, default=5)
    parser.add_argument("--acks", default="1", choices=("1", "all"))
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/produce-codec-cost"))
    parser.add_argument("--profile-dir", type=Path)
    args = parser.parse_args()
    if args.profile_dir:
        args.profile_dir.mkdir(parents=True, exist_ok=True)
    corpus = json_like_corpus(CORPUS_BYTES)
    runs = []
    for round_index in range(args.rounds):
        for codec in args.codecs.split(","):
            for label, tree in args.tree:
                run = one_run(label, tree, codec, args, corpus, round_index)
                print(json.dumps(run), flush=True)
                runs.append(run)
    print(f"\n| codec | tree | broker CPU s/GB (median of {args.rounds}) | producer MB/s |")
    print("|---|---|---|---|")
    for codec in args.codecs.split(","):
        for label, _ in args.tree:
            mine = [run for run in runs if run["tree"] == label and run["codec"] == codec]
            print(f"| {codec} | {label} | "
                  f"{statistics.median(r['cpu_s_per_gb'] for r in mine):.2f} | "
                  f"{statistics.median(r['mb_per_s'] for r in mine):.0f} |")


if __name__ == "__main__":
    main()
