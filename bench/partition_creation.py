"""Time to create topics of many partitions on a fresh broker, and how long another
connection waits meanwhile.

For each count in ``--partitions`` a confluent-kafka admin client creates one topic of that
many partitions (a new topic each time, on one broker started under ``--dir``); while it
waits, a raw connection sends ApiVersions requests one after another (at most
``MAX_PROBES`` per creation) and the slowest answer is kept. Prints one JSON line per count:
creation seconds, the slowest ApiVersions answer in milliseconds, and the broker's open
descriptors afterwards (``/proc/PID/fd``). The descriptor budget of the log manager refuses
counts that would leave less than a quarter of RLIMIT_NOFILE free.

    PYTHONPATH=. .venv/bin/python bench/partition_creation.py [--partitions 1000 3000]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import struct
import tempfile
import threading
import time
from pathlib import Path

from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import _start

CREATE_TIMEOUT_S = 300.0
MAX_PROBES = 100_000
API_VERSIONS_V0 = struct.pack(">hhih", 18, 0, 1, 5) + b"bench"
API_VERSIONS_FRAME = struct.pack(">i", len(API_VERSIONS_V0)) + API_VERSIONS_V0


def _receive_frame(sock: socket.socket) -> None:
    size = struct.unpack(">i", sock.recv(4, socket.MSG_WAITALL))[0]
    sock.recv(size, socket.MSG_WAITALL)


def _probe(port: int, done: threading.Event, slowest_ms: list[float]) -> None:
    with socket.create_connection(("127.0.0.1", port), timeout=CREATE_TIMEOUT_S) as sock:
        for _ in range(MAX_PROBES):
            if done.is_set():
                return
            started = time.monotonic()
            sock.sendall(API_VERSIONS_FRAME)
            _receive_frame(sock)
            slowest_ms[0] = max(slowest_ms[0], (time.monotonic() - started) * 1000)


def _create(broker, admin: AdminClient, partitions: int) -> dict:
    done, slowest_ms = threading.Event(), [0.0]
    prober = threading.Thread(target=_probe, args=(broker.port, done, slowest_ms))
    prober.start()
    started = time.monotonic()
    name = f"bench-{partitions}"
    error = admin.create_topics([NewTopic(name, partitions, 1)])[name].exception(CREATE_TIMEOUT_S)
    seconds = time.monotonic() - started
    done.set()
    prober.join()
    return {"partitions": partitions, "seconds": round(seconds, 2),
            "error": str(error) if error else None,
            "slowest_api_versions_ms": round(slowest_ms[0], 1),
            "open_descriptors": len(os.listdir(f"/proc/{broker.pid}/fd"))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[1000, 3000])
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    scratch = args.dir or Path(tempfile.mkdtemp(prefix="partition-creation-"))
    broker = _start(scratch)
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        for partitions in args.partitions:
            print(json.dumps(_create(broker, admin, partitions)), flush=True)
    finally:
        broker.stop()


if __name__ == "__main__":
    main()
