"""Connection flood: many connections announce maximum-size frames and trickle them.

Spawns ``headrace broker`` on a free loopback port with a fresh data directory (extra configs
with ``--override key=value``), reads its idle resident memory, then opens ``--connections``
connections that each send a 4-byte frame length of ``--announced-bytes`` (default 100 MiB,
``socket.request.max.bytes``) and then one byte every ``--trickle-interval-s`` seconds (the
connections' bytes spread evenly over the interval), for ``--duration-s`` seconds in all.
``--burst-bytes`` N: each connection first sends N bytes of its frame as fast as the broker
reads them (non-blocking sends, in turns with the trickle), so that the broker holds what it
received and ``queued.max.request.bytes`` is what bounds it.
Meanwhile, every ``--sample-interval-s``, it samples the broker's VmRSS and times one ApiVersions
round trip on a separate connection (counted unanswered after ``--probe-timeout-s``: at
``queued.max.request.bytes`` the broker reads from no other connection until requests drain or
the stuck ones are closed).

Prints the idle RSS, the peak sampled RSS and the kernel's high-water mark (VmHWM, over the
whole process life), the goal (idle RSS + ``queued.max.request.bytes`` + 64 MiB) and whether
the peak met it, the connections the broker closed (``connections.max.idle.ms``), the slowest
ApiVersions round trip and the broker's CPU time over the flood.

    .venv/bin/python bench/connection_flood.py [--connections 200] [--duration-s 60]
        [--override queued.max.request.bytes=67108864]
"""

from __future__ import annotations

import argparse
import re
import select
import shutil
import signal
import socket
import struct
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from broker_request_cost import Connection, cpu_ms, free_port, spawn_broker  # noqa: E402

from headrace.broker.config import BROKER_CONFIGS  # noqa: E402

API_VERSIONS = 18
GOAL_SLACK_BYTES = 64 * 1024 * 1024
MIB = 1024 * 1024


def status_bytes(pid: int, field: str) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE).group(1)) * 1024


def closed_by_broker(sockets: list[socket.socket]) -> set[socket.socket]:
    """Those of ``sockets`` the broker has closed (readable with nothing to read)."""
    closed = set()
    readable, _, _ = select.select(sockets, [], [], 0)
    for sock in readable:
        try:
            if sock.recv(1) == b"":
                closed.add(sock)
        except OSError:
            closed.add(sock)
    return closed


def flood(port: int, pid: int, args: argparse.Namespace) -> dict:
    probe = Connection(port)
    probe.sock.settimeout(args.probe_timeout_s)
    unanswered = 0
    flooders = [socket.create_connection(("127.0.0.1", port)) for _ in range(args.connections)]
    for sock in flooders:
        sock.sendall(struct.pack(">i", args.announced_bytes))
        sock.setblocking(False)  # a paused broker does not block the flood
    burst_left = {sock: args.burst_bytes for sock in flooders}
    burst_chunk = b"x" * 65536
    open_flooders, closed_count = list(flooders), 0
    peak_rss, slowest_round_trip_s = 0, 0.0
    cpu_before_ms, start = cpu_ms(pid), time.monotonic()
    next_sample, turn = start, 0
    byte_interval_s = args.trickle_interval_s / max(1, args.connections)
    while time.monotonic() - start < args.duration_s and open_flooders:
        sock = open_flooders[turn % len(open_flooders)]
        turn += 1
        try:
            if burst_left[sock] > 0:
                burst_left[sock] -= sock.send(burst_chunk[:burst_left[sock]])
            else:
                sock.send(b"x")
        except OSError:
            pass  # the broker is not reading it (or closed it: counted below)
        if time.monotonic() >= next_sample:
            next_sample += args.sample_interval_s
            peak_rss = max(peak_rss, status_bytes(pid, "VmRSS"))
            sent = time.monotonic()
            try:
                probe.request(API_VERSIONS, 0, {})
                slowest_round_trip_s = max(slowest_round_trip_s, time.monotonic() - sent)
            except TimeoutError:  # reading paused at queued.max.request.bytes
                unanswered += 1
                probe.sock.close()
                probe = Connection(port)
                probe.sock.settimeout(args.probe_timeout_s)
            closed = closed_by_broker(open_flooders)
            closed_count += len(closed)
            open_flooders = [s for s in open_flooders if s not in closed]
        if not any(burst_left.values()):
            time.sleep(byte_interval_s)  # pacing the trickle, the load itself
    peak_rss = max(peak_rss, status_bytes(pid, "VmRSS"))
    cpu_spent_ms = cpu_ms(pid) - cpu_before_ms
    for sock in flooders:
        sock.close()
    probe.sock.close()
    return {"peak_rss": peak_rss, "closed": closed_count, "slowest_s": slowest_round_trip_s,
            "unanswered": unanswered,
            "cpu_ms": cpu_spent_ms, "elapsed_s": time.monotonic() - start}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--announced-bytes", type=int, default=104857600)
    parser.add_argument("--trickle-interval-s", type=float, default=2.0)
    parser.add_argument("--burst-bytes", type=int, default=0)
    parser.add_argument("--probe-timeout-s", type=float, default=2.0)
    parser.add_argument("--duration-s", type=float, default=60.0)
    parser.add_argument("--sample-interval-s", type=float, default=0.5)
    parser.add_argument("--override", action="append", default=[],
                        help="broker config key=value")
    parser.add_argument("--dir", type=Path, default=Path("/tmp/connection-flood"))
    args = parser.parse_args()
    overrides = dict(item.split("=", 1) for item in args.override)
    queued_limit = int(overrides.get("queued.max.request.bytes",
                                     BROKER_CONFIGS["queued.max.request.bytes"].default))
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    port = free_port()
    process = spawn_broker(args.dir / "data", port, overrides)
    try:
        idle_rss = status_bytes(process.pid, "VmRSS")
        result = flood(port, process.pid, args)
        high_water = status_bytes(process.pid, "VmHWM")
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(60)
        shutil.rmtree(args.dir, ignore_errors=True)
    goal = idle_rss + max(queued_limit, 0) + GOAL_SLACK_BYTES
    print(f"{args.connections} connections announcing {args.announced_bytes} bytes, sending "
          f"{args.burst_bytes} at once, then one byte each per {args.trickle_interval_s:g} s, "
          f"for {result['elapsed_s']:.0f} s")
    print(f"idle RSS {idle_rss / MIB:.1f} MiB, peak RSS {result['peak_rss'] / MIB:.1f} MiB "
          f"(+{(result['peak_rss'] - idle_rss) / MIB:.1f}), VmHWM {high_water / MIB:.1f} MiB")
    print(f"goal <= idle + queued.max.request.bytes ({queued_limit}) + 64 MiB = "
          f"{goal / MIB:.1f} MiB: {'met' if result['peak_rss'] <= goal else 'MISSED'}")
    print(f"closed by the broker: {result['closed']}; slowest answered ApiVersions round trip "
          f"{result['slowest_s'] * 1000:.1f} ms, unanswered within {args.probe_timeout_s:g} s: "
          f"{result['unanswered']}; broker CPU {result['cpu_ms']:.0f} ms")


if __name__ == "__main__":
    main()
