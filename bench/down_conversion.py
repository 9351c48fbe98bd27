"""Fetch throughput with down-conversion (Fetch v1: magic 0, v2: magic 1) against Fetch v4
(the stored v2 batches, zero-copy) over the same data.

Spawns ``headrace broker`` on a free loopback port with a fresh data directory under
``--scratch``, and for each codec in ``--codecs`` produces ``--records`` JSON-like values of
``--record-bytes`` to a one-partition topic (librdkafka, as ``fetch_cost.py`` does). Then,
``--repeat`` times per Fetch version, one raw socket reads the whole partition from offset 0
with back-to-back Fetch requests (one in flight, ``max_wait_ms`` 0, partition_max_bytes
1 MiB), taking each next offset from the last whole entry of the previous answer -- no
client-side decoding, so the figure is the broker's.

Prints per codec and version the median over the repeats of:

* ``log_mb_per_s``: megabytes of the stored log read per second of wall time (the same data
  for every version: the figure to compare);
* ``response_mb``: record bytes the client received (down-converted sets are larger);
* ``broker_cpu_s_per_gb``: broker CPU seconds per GB of stored log read.

    .venv/bin/python bench/down_conversion.py [--records 200000] [--codecs none,lz4]
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import struct
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fetch_cost import broker_cpu_s, free_port, produce, start_broker  # noqa: E402

from headrace.protocol import wire  # noqa: E402

FETCH = 1
PARTITION_MAX_BYTES = 1024 * 1024
SOCKET_TIMEOUT_S = 30.0
READ_TIMEOUT_S = 600.0  # one whole read of the partition, at most
VERSIONS = {"v4 (v2 batches)": 4, "v2 (magic 1)": 2, "v1 (magic 0)": 1}
_ENTRY_HEAD = struct.Struct(">qi")


def fetch_frame(version: int, topic: str, offset: int, correlation_id: int) -> bytes:
    if version >= 4:
        body = wire.build(wire.request_class(FETCH, version), {
            "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 50_000_000,
            "topics": [{"topic": topic, "partitions": [{
                "partition": 0, "fetch_offset": offset,
                "partition_max_bytes": PARTITION_MAX_BYTES}]}]})
        return wire.encode_request(FETCH, version, correlation_id, "bench", body)
    body = struct.pack(">iii", -1, 0, 0) + (struct.pack(">i", 50_000_000) if version >= 3 else b"")
    body += struct.pack(">ih", 1, len(topic)) + topic.encode()
    body += struct.pack(">iiqi", 1, 0, offset, PARTITION_MAX_BYTES)
    header = struct.pack(">hhih", FETCH, version, correlation_id, 5) + b"bench"
    return struct.pack(">i", len(header) + len(body)) + header + body


def receive_frame(sock: socket.socket) -> bytes:
    size = struct.unpack(">i", receive_exactly(sock, 4))[0]
    return receive_exactly(sock, size)


def receive_exactly(sock: socket.socket, count: int) -> bytes:
    buffer = bytearray(count)
    view, done = memoryview(buffer), 0
    while done < count:
        received = sock.recv_into(view[done:])
        if not received:
            raise ConnectionError("broker closed the connection")
        done += received
    return bytes(buffer)


def records_of(frame: bytes, version: int, topic: str) -> tuple[int, memoryview]:
    """(high watermark, records) of partition 0 of a Fetch response of ``version``."""
    position = 4 + (4 if version >= 1 else 0) + (6 if version >= 7 else 0)
    position += 4 + 2 + len(topic) + 4 + 4 + 2  # topics, name, partitions, index, error
    (high_watermark,) = struct.unpack_from(">q", frame, position)
    position += 8
    if version >= 4:
        position += 8 + (8 if version >= 5 else 0) + 4  # last stable, log start, aborted
    (size,) = struct.unpack_from(">i", frame, position)
    return high_watermark, memoryview(frame)[position + 4:position + 4 + size]


def next_offset(records: memoryview, version: int) -> int:
    """The offset after the last whole entry: a v2 batch's last offset, or a legacy
    (wrapper) message's own offset; -1 when there is none."""
    position, following = 0, -1
    while len(records) - position >= 12:
        offset, size = _ENTRY_HEAD.unpack_from(records, position)
        if offset < 0 or position + 12 + size > len(records):
            break
        if version >= 4:
            (last_offset_delta,) = struct.unpack_from(">i", records, position + 23)
            following = offset + last_offset_delta + 1
        else:
            following = offset + 1
        position += 12 + size
    return following


def read_partition(bootstrap: str, topic: str, version: int) -> int:
    """Read the whole partition with Fetch ``version``; returns record bytes received."""
    host, port = bootstrap.rsplit(":", 1)
    received_bytes, offset, correlation_id = 0, 0, 0
    deadline = time.monotonic() + READ_TIMEOUT_S
    with socket.create_connection((host, int(port)), timeout=SOCKET_TIMEOUT_S) as sock:
        while time.monotonic() < deadline:
            correlation_id += 1
            sock.sendall(fetch_frame(version, topic, offset, correlation_id))
            high_watermark, records = records_of(receive_frame(sock), version, topic)
            received_bytes += len(records)
            following = next_offset(records, version)
            if following < 0:
                raise SystemExit(f"Fetch v{version} at offset {offset} returned no whole entry")
            offset = following
            if offset >= high_watermark:
                return received_bytes
    raise SystemExit(f"Fetch v{version} did not reach the end in {READ_TIMEOUT_S} s")


def log_bytes(data_dir: Path, topic: str) -> int:
    return sum(path.stat().st_size for path in (data_dir / f"{topic}-0").glob("*.log"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--record-bytes", type=int, default=200)
    parser.add_argument("--codecs", default="none,lz4")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--scratch", default=tempfile.gettempdir())
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="down-conversion-", dir=args.scratch))
    data_dir = scratch / "data"
    data_dir.mkdir()
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker = start_broker(data_dir, port)
    try:
        for codec in args.codecs.split(","):
            topic = f"down-conversion-{codec}"
            produce(bootstrap, topic, codec, args.records, args.record_bytes)
            stored_bytes = log_bytes(data_dir, topic)
            for name, version in VERSIONS.items():
                rates, cpu_per_gb, received = [], [], []
                for _ in range(args.repeat):
                    cpu_before, start = broker_cpu_s(broker.pid), time.perf_counter()
                    received.append(read_partition(bootstrap, topic, version))
                    elapsed = time.perf_counter() - start
                    cpu = broker_cpu_s(broker.pid) - cpu_before
                    rates.append(stored_bytes / elapsed / 1e6)
                    cpu_per_gb.append(cpu / (stored_bytes / 1e9))
                print(f"{codec:5} Fetch {name:16} log_mb_per_s {statistics.median(rates):8.1f}"
                      f"  response_mb {statistics.median(received) / 1e6:7.1f}"
                      f"  broker_cpu_s_per_gb {statistics.median(cpu_per_gb):6.2f}"
                      f"  (log {stored_bytes / 1e6:.1f} MB)", flush=True)
    finally:
        broker.terminate()
        broker.wait(30)
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
