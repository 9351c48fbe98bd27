"""Serving a cached 1 GiB log with sendfile: Log.read FileSlices vs sendfile of the raw file.

Builds a 1 GiB log of 1 MiB batches (1 GiB segments), warms the page cache, then streams it to a
loopback TCP socket (a thread drains the other end) twice: through ``Log.read(offset,
max_bytes)`` + ``os.sendfile`` of each FileSlice, and as ``os.sendfile`` of the segment file in
chunks of the same size. Median of 3; prints the ratio (goal >= 0.9).

    .venv/bin/python bench/storage_sendfile.py [--max-bytes 1048576] [--dir /tmp/storage/bench]
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from storage_append import NOW_MS, build_batch  # noqa: E402

from headrace.storage.config import LogConfig  # noqa: E402
from headrace.storage.fs import RealFileSystem  # noqa: E402
from headrace.storage.log import Log  # noqa: E402

LOG_BYTES = 1 << 30
RUNS = 3


def drain(server: socket.socket, expected_bytes: int, done: threading.Event) -> None:
    connection, _ = server.accept()
    received = 0
    while received < expected_bytes:
        chunk = connection.recv(1 << 20)
        if not chunk:
            break
        received += len(chunk)
    connection.close()
    done.set()


def stream(send, total_bytes: int) -> float:
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()
    threading.Thread(target=drain, args=(server, total_bytes, done), daemon=True).start()
    client = socket.create_connection(server.getsockname())
    started = time.perf_counter()
    send(client.fileno())
    client.shutdown(socket.SHUT_WR)
    done.wait()
    elapsed = time.perf_counter() - started
    client.close()
    server.close()
    return elapsed


def sendfile_all(out_fd: int, in_fd: int, position: int, length: int) -> None:
    while length:
        sent = os.sendfile(out_fd, in_fd, position, length)
        position += sent
        length -= sent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-bytes", type=int, default=1 << 20)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/storage/bench-sendfile"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    log = Log("bench", 0, args.dir / "bench-0", LogConfig(), RealFileSystem(), NOW_MS,
              clean_shutdown=True)
    batch = build_batch(1 << 20)
    for _ in range(LOG_BYTES // len(batch)):
        log.append(bytearray(batch), NOW_MS)
    total = log.size_bytes
    segment_fd = log.segments[0].fd

    records_per_batch = log.log_end_offset // (total // len(batch))

    def through_log(out_fd: int) -> None:
        offset = 0
        while offset < log.log_end_offset:
            result = log.read(offset, args.max_bytes)
            for piece in result.slices:
                sendfile_all(out_fd, piece.fd, piece.position, piece.length)
            offset += result.size_bytes // len(batch) * records_per_batch

    def raw(out_fd: int) -> None:
        for position in range(0, total, args.max_bytes):
            sendfile_all(out_fd, segment_fd, position, min(args.max_bytes, total - position))

    stream(raw, total)  # warm the page cache
    ours = statistics.median(stream(through_log, total) for _ in range(RUNS))
    theirs = statistics.median(stream(raw, total) for _ in range(RUNS))
    print("| read size | Log.read+sendfile MB/s | raw sendfile MB/s | ratio |")
    print("|---|---|---|---|")
    print(f"| {args.max_bytes} | {total / ours / 1e6:.0f} | {total / theirs / 1e6:.0f} | "
          f"{theirs / ours:.2f} |")
    log.close_without_flush()
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
