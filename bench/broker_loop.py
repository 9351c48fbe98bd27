"""Which asyncio style and event loop the broker should use, measured on Kafka framing.

A minimal server (int32 length-prefixed frames; every request answered in order with a
response frame carrying its correlation id) runs in a child process in each of four set-ups:
``asyncio.Protocol`` or streams (``StreamReader``/``StreamWriter``), on the default selector
loop or on uvloop. A blocking client in this process measures

* small requests (a 60-byte request answered by a ~200-byte ApiVersions-sized response), one
  at a time (round trips) and pipelined (``--pipeline`` requests in flight): requests/s and
  the server's CPU microseconds per request (utime+stime from /proc);
* a fetch-like response (``--fetch-bytes`` of a page-cached file after a small header) sent
  with ``loop.sendfile`` (native ``os.sendfile`` on the default loop): MB/s and server
  CPU-seconds per GB. uvloop's ``loop.sendfile`` raises NotImplementedError, so there the
  server does what the broker would have to: ``os.pread`` the slice and write it.

Each figure is the median of ``--runs``; ratios are against Protocol on the default loop.

    .venv/bin/python bench/broker_loop.py [--requests 20000] [--pipeline 64] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time

INT32 = struct.Struct(">i")
REQUEST_BODY_BYTES = 56  # api_key, version, correlation id, client id, body
SMALL_RESPONSE_BODY_BYTES = 200
FETCH_API_KEY = 1
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
SETUPS = [("protocol", "default"), ("streams", "default"),
          ("protocol", "uvloop"), ("streams", "uvloop")]


# --- the servers (child process) ------------------------------------------------------------

class FileAtOffset:
    """The file-object face ``loop.sendfile`` needs around a descriptor."""

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def fileno(self) -> int:
        return self._fd

    def seek(self, position: int, whence: int = 0) -> int:
        return os.lseek(self._fd, position, whence)


def response_head(frame: bytes, fetch_bytes: int) -> tuple[bytes, int]:
    """(bytes to write, file bytes to sendfile after them) for one request frame."""
    api_key = struct.unpack_from(">h", frame)[0]
    correlation_id = frame[4:8]
    if api_key == FETCH_API_KEY:
        return INT32.pack(4 + fetch_bytes) + correlation_id, fetch_bytes
    body = b"\x00" * SMALL_RESPONSE_BODY_BYTES
    return INT32.pack(4 + len(body)) + correlation_id + body, 0


async def send_file(transport, file: FileAtOffset, count: int) -> None:
    """Zero-copy ``loop.sendfile`` where the loop has it, else pread and write (uvloop)."""
    loop = asyncio.get_running_loop()
    try:
        await loop.sendfile(transport, file, 0, count)
    except NotImplementedError:
        transport.write(os.pread(file.fileno(), count, 0))


class FramingProtocol(asyncio.Protocol):
    def __init__(self, file: FileAtOffset, fetch_bytes: int) -> None:
        self.file, self.fetch_bytes = file, fetch_bytes
        self.buffer = bytearray()
        self.queue: list[bytes] = []
        self.worker: asyncio.Task | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= 4:
            (size,) = INT32.unpack_from(self.buffer)
            if len(self.buffer) < 4 + size:
                break
            self.queue.append(bytes(self.buffer[4 : 4 + size]))
            del self.buffer[: 4 + size]
        if self.queue and (self.worker is None or self.worker.done()):
            self.worker = asyncio.get_running_loop().create_task(self.work())

    async def work(self) -> None:
        while self.queue:
            head, file_bytes = response_head(self.queue.pop(0), self.fetch_bytes)
            self.transport.write(head)
            if file_bytes:
                await send_file(self.transport, self.file, file_bytes)


async def serve_streams(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                        file: FileAtOffset, fetch_bytes: int) -> None:
    try:
        while True:
            (size,) = INT32.unpack(await reader.readexactly(4))
            head, file_bytes = response_head(await reader.readexactly(size), fetch_bytes)
            writer.write(head)
            if file_bytes:
                await send_file(writer.transport, file, file_bytes)
            await writer.drain()
    except asyncio.IncompleteReadError:
        writer.close()


async def serve(style: str, port: int, file_path: str, fetch_bytes: int) -> None:
    file = FileAtOffset(os.open(file_path, os.O_RDONLY))
    loop = asyncio.get_running_loop()
    if style == "protocol":
        server = await loop.create_server(lambda: FramingProtocol(file, fetch_bytes),
                                          "127.0.0.1", port)
    else:
        server = await asyncio.start_server(
            lambda r, w: serve_streams(r, w, file, fetch_bytes), "127.0.0.1", port)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with server:
        await stop.wait()


def run_server(style: str, loop_name: str, port: int, file_path: str, fetch_bytes: int) -> None:
    if loop_name == "uvloop":
        import uvloop

        uvloop.run(serve(style, port, file_path, fetch_bytes))
    else:
        asyncio.run(serve(style, port, file_path, fetch_bytes))


# --- the client (this process) --------------------------------------------------------------

def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS_PER_S


def request_frame(api_key: int, correlation_id: int) -> bytes:
    body = struct.pack(">hhi", api_key, 3, correlation_id)
    body += b"\x00" * (REQUEST_BODY_BYTES - len(body))
    return INT32.pack(len(body)) + body


def receive_exactly(sock: socket.socket, count: int, buffer: bytearray) -> None:
    view = memoryview(buffer)
    done = 0
    while done < count:
        received = sock.recv_into(view[done:count])
        if not received:
            raise ConnectionError("server closed the connection")
        done += received


def exchange(sock: socket.socket, api_key: int, requests: int, in_flight: int,
             buffer: bytearray) -> None:
    """Send ``requests`` frames keeping at most ``in_flight`` unanswered; read every answer."""
    sent = answered = 0
    while answered < requests:
        burst = min(in_flight - (sent - answered), requests - sent)
        if burst > 0:
            sock.sendall(b"".join(request_frame(api_key, sent + i) for i in range(burst)))
            sent += burst
        receive_exactly(sock, 8, buffer)
        size, correlation_id = struct.unpack_from(">ii", buffer)
        if correlation_id != answered:
            raise RuntimeError(f"answer {correlation_id} out of order (expected {answered})")
        receive_exactly(sock, size - 4, buffer)
        answered += 1


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(style: str, loop_name: str, file_path: str, fetch_bytes: int):
    port = free_port()
    process = subprocess.Popen([sys.executable, __file__, "--serve", style, loop_name,
                                str(port), file_path, str(fetch_bytes)])
    deadline = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=60)
            break
        except OSError:
            if time.monotonic() > deadline or process.poll() is not None:
                raise RuntimeError("server did not start") from None
            time.sleep(0.02)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return process, sock


def measure(setup: tuple[str, str], args, file_path: str) -> dict[str, float]:
    process, sock = start_server(*setup, file_path, args.fetch_bytes)
    buffer = bytearray(args.fetch_bytes + 64)
    figures: dict[str, float] = {}
    try:
        exchange(sock, 18, 200, 1, buffer)  # warm-up
        cases = [("round_trip", 18, args.requests // 4, 1),
                 ("pipelined", 18, args.requests, args.pipeline),
                 ("fetch", FETCH_API_KEY, args.fetches, 1)]
        for name, api_key, requests, in_flight in cases:
            cpu_before, started = cpu_seconds(process.pid), time.perf_counter()
            exchange(sock, api_key, requests, in_flight, buffer)
            elapsed = time.perf_counter() - started
            server_cpu = cpu_seconds(process.pid) - cpu_before
            if api_key == FETCH_API_KEY:
                gigabytes = requests * args.fetch_bytes / 1e9
                figures["fetch_MB_per_s"] = gigabytes * 1000 / elapsed
                figures["fetch_cpu_s_per_GB"] = server_cpu / gigabytes
            else:
                figures[f"{name}_per_s"] = requests / elapsed
                figures[f"{name}_cpu_us"] = server_cpu / requests * 1e6
    finally:
        sock.close()
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    return figures


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        style, loop_name, port, file_path, fetch_bytes = sys.argv[2:7]
        run_server(style, loop_name, int(port), file_path, int(fetch_bytes))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--pipeline", type=int, default=64)
    parser.add_argument("--fetches", type=int, default=500)
    parser.add_argument("--fetch-bytes", type=int, default=1 << 20)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    with tempfile.NamedTemporaryFile(prefix="broker-loop-", dir="/tmp") as data:
        data.write(os.urandom(args.fetch_bytes))
        data.flush()
        results = {}
        for setup in SETUPS:
            runs = [measure(setup, args, data.name) for _ in range(args.runs)]
            results[setup] = {key: statistics.median(run[key] for run in runs)
                              for key in runs[0]}
    base = results[SETUPS[0]]
    print(f"{'style/loop':18} {'round trips/s':>14} {'us CPU':>7} {'pipelined/s':>12} "
          f"{'us CPU':>7} {'fetch MB/s':>11} {'CPU s/GB':>9}")
    for (style, loop_name), figures in results.items():
        print(f"{style + '/' + loop_name:18} {figures['round_trip_per_s']:14.0f} "
              f"{figures['round_trip_cpu_us']:7.1f} {figures['pipelined_per_s']:12.0f} "
              f"{figures['pipelined_cpu_us']:7.1f} {figures['fetch_MB_per_s']:11.0f} "
              f"{figures['fetch_cpu_s_per_GB']:9.2f}")
    print("ratios to protocol/default (throughput: higher is better; CPU: lower is better)")
    for setup, figures in results.items():
        ratios = "  ".join(f"{key}={figures[key] / base[key]:.2f}" for key in figures)
        print(f"{setup[0] + '/' + setup[1]:18} {ratios}")


if __name__ == "__main__":
    main()
