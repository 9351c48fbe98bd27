"""The broker's fixed cost per request: one small Produce, one 1 MiB Fetch.

Spawns ``headrace broker`` on a free loopback port with a fresh data directory, creates a
one-partition topic, then from one connection, one request at a time (no pipelining):

* ``produce``: ``--produces`` Produce v9 requests (acks as ``--acks``), each one lz4 batch of
  ``--records-per-batch`` records of 1 KiB JSON-like values (kbench's paced cell: about ten
  records per linger.ms=5 batch at 2000 records/s);
* ``fetch 1``: Fetch v12 requests for one of those small batches each (partition_max_bytes
  1; KIP-74 returns one whole batch): the fixed cost of a fetch without the copy;
* ``fetch``: after filling the partition with ``--fill-mib`` MiB, Fetch v12 requests with
  Kafka's default ``max.partition.fetch.bytes`` (1 MiB) reading it from the start to the end,
  ``--fetch-passes`` times.

Prints, per phase, the round-trip time per request (median, p99, from just before ``send``
to the whole response read) and the broker's CPU time per request (utime+stime from
/proc/PID/stat over the phase, divided by the requests). CPU per request is the figure to
compare between versions on a shared machine; the round trip also holds the client's time.

    .venv/bin/python bench/broker_request_cost.py [--produces 5000] [--fill-mib 256]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.protocol import compression as codecs  # noqa: E402
from headrace.protocol import records as record_codec  # noqa: E402
from headrace.protocol import wire  # noqa: E402

PRODUCE, FETCH, CREATE_TOPICS = 0, 1, 19
PRODUCE_VERSION, FETCH_VERSION = 9, 12
TOPIC = "request-cost"
VALUE_BYTES = 1024
FILL_BATCH_RECORDS = 500
DEFAULT_PARTITION_FETCH_BYTES = 1024 * 1024
DEFAULT_FETCH_MAX_BYTES = 50 * 1024 * 1024
STARTUP_TIMEOUT_S = 30.0
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
_LAST_OFFSET_DELTA = struct.Struct(">i")
BATCH_LENGTH_OFFSET, LAST_OFFSET_DELTA_OFFSET, LOG_OVERHEAD_BYTES = 8, 23, 12


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Connection:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=STARTUP_TIMEOUT_S)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.correlation_id = 0

    def encode(self, api_key: int, version: int, values: dict) -> bytes:
        self.correlation_id += 1
        body = wire.build(wire.request_class(api_key, version), values)
        return wire.encode_request(api_key, version, self.correlation_id, "request-cost", body)

    def round_trip(self, frame: bytes) -> bytes:
        self.sock.sendall(frame)
        return self._exactly(struct.unpack(">i", self._exactly(4))[0])

    def _exactly(self, count: int) -> bytes:
        view = bytearray(count)
        received = 0
        while received < count:
            got = self.sock.recv_into(memoryview(view)[received:])
            if not got:
                raise ConnectionError("broker closed the connection")
            received += got
        return bytes(view)

    def request(self, api_key: int, version: int, values: dict):
        frame = self.round_trip(self.encode(api_key, version, values))
        return wire.decode_response(api_key, version, frame)[1]


def spawn_broker(data_dir: Path, port: int,
                 overrides: dict[str, str] | None = None) -> subprocess.Popen:
    command = [sys.executable, "-m", "headrace.cli.main", "broker",
               "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
               "--override", f"log.dirs={data_dir}"]
    for key, value in (overrides or {}).items():
        command += ["--override", f"{key}={value}"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"broker exited with {process.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process
        except OSError:
            time.sleep(0.02)
    process.kill()
    raise RuntimeError("broker did not start")


def cpu_ms(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) * 1000 / CLOCK_TICKS_PER_S


def value(index: int) -> bytes:
    text = json.dumps({"id": index, "user": f"user-{index % 977}", "event": "click",
                       "page": f"/products/{index % 1013}", "ts": 1_700_000_000_000 + index})
    return (text + " " * VALUE_BYTES)[:VALUE_BYTES].encode()


def lz4_batch(first_index: int, count: int) -> bytes:
    now_ms = int(time.time() * 1000)
    return record_codec.build_batch([(None, value(first_index + i), [], now_ms)
                                     for i in range(count)], compression=codecs.LZ4)


def produce_frame(connection: Connection, batch: bytes, acks: int) -> bytes:
    return connection.encode(PRODUCE, PRODUCE_VERSION, {
        "acks": acks, "timeout": 30000, "transactional_id": None,
        "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": batch}]}]})


def last_offset_in(records: bytes) -> int:
    """The last offset of the whole batches in a Fetch response's record bytes."""
    position, last = 0, -1
    while position + LOG_OVERHEAD_BYTES <= len(records):
        size = LOG_OVERHEAD_BYTES + _LAST_OFFSET_DELTA.unpack_from(
            records, position + BATCH_LENGTH_OFFSET)[0]
        if position + size > len(records):
            break
        base = struct.unpack_from(">q", records, position)[0]
        last = base + _LAST_OFFSET_DELTA.unpack_from(
            records, position + LAST_OFFSET_DELTA_OFFSET)[0]
        position += size
    return last


def summary(name: str, round_trips_s: list[float], broker_cpu_ms: float) -> str:
    ordered = sorted(round_trips_s)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return (f"{name:8} {len(ordered)} requests: round trip median "
            f"{statistics.median(ordered) * 1e3:.3f} ms, p99 {p99 * 1e3:.3f} ms; broker CPU "
            f"{broker_cpu_ms * 1e3 / len(ordered):.0f} us per request")


def produce_phase(connection: Connection, pid: int, produces: int, records_per_batch: int,
                  acks: int) -> str:
    batches = [lz4_batch(i * records_per_batch, records_per_batch) for i in range(64)]
    round_trips = []
    cpu_before = cpu_ms(pid)
    for i in range(produces):
        frame = produce_frame(connection, batches[i % len(batches)], acks)
        started = time.perf_counter()
        connection.round_trip(frame)
        round_trips.append(time.perf_counter() - started)
    return summary("produce", round_trips, cpu_ms(pid) - cpu_before)


def fill(connection: Connection, fill_mib: int) -> int:
    """Append about ``fill_mib`` MiB of lz4 batches; return the log end offset."""
    batch = lz4_batch(0, FILL_BATCH_RECORDS)
    appended, offset = 0, 0
    while appended < fill_mib * 1024 * 1024:
        connection.round_trip(produce_frame(connection, batch, 1))
        appended += len(batch)
        offset += FILL_BATCH_RECORDS
    return offset


def fetch_frame(connection: Connection, offset: int,
                partition_max_bytes: int = DEFAULT_PARTITION_FETCH_BYTES) -> bytes:
    return connection.encode(FETCH, FETCH_VERSION, {
        "replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": DEFAULT_FETCH_MAX_BYTES,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1, "rack_id": "",
        "forgotten_topics_data": [], "topics": [{"topic": TOPIC, "partitions": [{
            "partition": 0, "fetch_offset": offset, "current_leader_epoch": -1,
            "last_fetched_epoch": -1, "log_start_offset": -1,
            "partition_max_bytes": partition_max_bytes}]}]})


def small_fetch_phase(connection: Connection, pid: int, end_offset: int) -> str:
    """One batch per Fetch (partition_max_bytes 1: KIP-74 still returns one whole batch)
    over the produce phase's small batches: the fixed cost of a fetch, without the copy."""
    round_trips, offset = [], 0
    cpu_before = cpu_ms(pid)
    while offset < end_offset:
        frame = fetch_frame(connection, offset, partition_max_bytes=1)
        started = time.perf_counter()
        response = connection.round_trip(frame)
        round_trips.append(time.perf_counter() - started)
        partition = wire.decode_response(FETCH, FETCH_VERSION, response)[1].responses[0]
        offset = last_offset_in(partition.partitions[0].records) + 1
    return summary("fetch 1", round_trips, cpu_ms(pid) - cpu_before)


def fetch_phase(connection: Connection, pid: int, end_offset: int, passes: int) -> str:
    round_trips, cpu_total_ms = [], 0.0
    for _ in range(passes):
        offset = 0
        cpu_before = cpu_ms(pid)
        while offset < end_offset:
            frame = fetch_frame(connection, offset)
            started = time.perf_counter()
            response = connection.round_trip(frame)
            round_trips.append(time.perf_counter() - started)
            body = wire.decode_response(FETCH, FETCH_VERSION, response)[1]
            partition = body.responses[0].partitions[0]
            assert partition.error_code == 0, partition
            offset = last_offset_in(partition.records) + 1
        cpu_total_ms += cpu_ms(pid) - cpu_before
    return summary("fetch", round_trips, cpu_total_ms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--produces", type=int, default=5000)
    parser.add_argument("--records-per-batch", type=int, default=10)
    parser.add_argument("--acks", type=int, default=1, choices=(1, -1))
    parser.add_argument("--fill-mib", type=int, default=256)
    parser.add_argument("--fetch-passes", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/broker-request-cost"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    port = free_port()
    process = spawn_broker(args.dir / "data", port)
    try:
        connection = Connection(port)
        created = connection.request(CREATE_TOPICS, 4, {"topics": [{
            "name": TOPIC, "num_partitions": 1, "replication_factor": 1, "assignments": [],
            "configs": []}], "timeout": 30000, "validate_only": False})
        assert created.topics[0].error_code == 0, created
        print(produce_phase(connection, process.pid, args.produces, args.records_per_batch,
                            args.acks))
        print(small_fetch_phase(connection, process.pid, args.produces * args.records_per_batch))
        end_offset = fill(connection, args.fill_mib)
        print(fetch_phase(connection, process.pid, end_offset, args.fetch_passes))
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
