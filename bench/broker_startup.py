"""Broker start-up time and idle memory: spawn ``headrace broker``, time it until a Metadata
request is answered, then read its resident memory after a few idle seconds.

Two cases, each the median of ``--runs`` spawns:

* ``fresh``: an empty data directory (first start: ``meta.properties``, the 50
  ``__consumer_offsets`` partitions are created);
* ``existing``: a data directory left by a clean shutdown holding ``--partitions`` partitions
  of one topic with a record batch in each, besides ``__consumer_offsets``.

Start-up is measured from just before ``Popen`` until the Metadata v1 response arrives (the
client retries connecting every ``CONNECT_RETRY_S``), together with the CPU time the broker
process used until then (utime+stime from /proc: less sensitive than wall time to other
load on a shared machine). Idle RSS is ``VmRSS`` from
``/proc/PID/status`` after ``--idle-seconds``. Goals (issue #3): start-up <= 1 s, idle RSS <=
100 MB. Scratch data goes under ``--dir``.

    .venv/bin/python bench/broker_startup.py [--runs 5] [--partitions 100] [--idle-seconds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.client.broker_connection import receive_frame_bytes  # noqa: E402
from headrace.protocol import records as record_codec  # noqa: E402
from headrace.protocol import wire  # noqa: E402

METADATA, CREATE_TOPICS, PRODUCE = 3, 19, 0
CONNECT_RETRY_S = 0.005
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 30.0
TOPIC = "startup-bench"
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def spawn(data_dir: Path, port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "headrace.cli.main", "broker",
               "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
               "--override", f"log.dirs={data_dir}"]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def request(sock: socket.socket, api_key: int, version: int, values: dict):
    body = wire.build(wire.request_class(api_key, version), values)
    sock.sendall(wire.encode_request(api_key, version, 1, "startup-bench", body))
    return wire.decode_response(api_key, version, bytes(receive_frame_bytes(sock)))[1]


def connect_when_listening(process: subprocess.Popen, port: int) -> socket.socket:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"broker exited with {process.returncode} during start-up")
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=STARTUP_TIMEOUT_S)
        except OSError:
            time.sleep(CONNECT_RETRY_S)
    raise RuntimeError(f"broker not listening after {STARTUP_TIMEOUT_S} s")


def rss_megabytes(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS line")


def cpu_milliseconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / CLOCK_TICKS_PER_S


def stop(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def measure_once(data_dir: Path, idle_seconds: float) -> tuple[float, float, float]:
    """(ms from spawn to a Metadata answer, broker CPU ms until then, idle RSS in MB)."""
    port = free_port()
    started = time.perf_counter()
    process = spawn(data_dir, port)
    try:
        with connect_when_listening(process, port) as sock:
            request(sock, METADATA, 1, {"topics": []})
            startup_ms = (time.perf_counter() - started) * 1000
            startup_cpu_ms = cpu_milliseconds(process.pid)
        time.sleep(idle_seconds)
        return startup_ms, startup_cpu_ms, rss_megabytes(process.pid)
    finally:
        stop(process)


def fill(data_dir: Path, partitions: int) -> None:
    """Leave ``partitions`` partitions with one batch each, shut down cleanly."""
    port = free_port()
    process = spawn(data_dir, port)
    try:
        with connect_when_listening(process, port) as sock:
            created = request(sock, CREATE_TOPICS, 4, {"topics": [{
                "name": TOPIC, "num_partitions": partitions, "replication_factor": 1,
                "assignments": [], "configs": []}], "timeout": 30000, "validate_only": False})
            assert created.topics[0].error_code == 0, created
            batch = record_codec.build_batch([(b"k", b"v" * 100, [], int(time.time() * 1000))])
            produced = request(sock, PRODUCE, 9, {"acks": -1, "timeout": 30000, "topic_data": [{
                "name": TOPIC,
                "partition_data": [{"index": i, "records": batch} for i in range(partitions)]}]})
            errors = {p.error_code for p in produced.responses[0].partition_responses}
            assert errors == {0}, errors
    finally:
        stop(process)


def run_case(name: str, make_dir, runs: int, idle_seconds: float) -> None:
    startups, cpus, rss = [], [], []
    for _ in range(runs):
        data_dir = make_dir()
        startup_ms, startup_cpu_ms, rss_mb = measure_once(data_dir, idle_seconds)
        startups.append(startup_ms)
        cpus.append(startup_cpu_ms)
        rss.append(rss_mb)
    print(f"{name:9} start-up to Metadata answered: median {statistics.median(startups):6.0f} ms "
          f"(min {min(startups):.0f}, max {max(startups):.0f}), broker CPU until then median "
          f"{statistics.median(cpus):.0f} ms; idle RSS median "
          f"{statistics.median(rss):5.1f} MB (max {max(rss):.1f})  [goals: 1000 ms, 100 MB]")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=5.0)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/broker-startup-bench"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    counter = iter(range(1_000_000))

    def fresh_dir() -> Path:
        return args.dir / f"fresh-{next(counter)}"

    existing = args.dir / "existing"
    fill(existing, args.partitions)
    try:
        run_case("fresh", fresh_dir, args.runs, args.idle_seconds)
        run_case("existing", lambda: existing, args.runs, args.idle_seconds)
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
