"""Append throughput of headrace.storage.Log vs dd writing the same bytes to the same file system.

1 KiB records in 16 KiB and 1 MiB v2 batches, one batch per append (as a produce request
carries it), no fsync (flush.messages default), compared with ``dd bs=<batch size>`` of the
same total (4 source buffers reused, as dd reuses one). Prints the median of 3 runs of each and the ratio (goal >= 0.8).

    .venv/bin/python bench/storage_append.py [--total-mib 512] [--dir /tmp/storage/bench]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

import crc32c

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.storage.config import LogConfig  # noqa: E402
from headrace.storage.fs import RealFileSystem  # noqa: E402
from headrace.storage.log import Log  # noqa: E402

RECORD_VALUE_BYTES = 1024
RUNS = 3
NOW_MS = 1_700_000_000_000


def _varint(value: int) -> bytes:
    zigzag, out = (value << 1) ^ (value >> 63), bytearray()
    while zigzag >= 0x80:
        out.append((zigzag & 0x7F) | 0x80)
        zigzag >>= 7
    out.append(zigzag)
    return bytes(out)


def build_batch(batch_bytes: int, timestamp_ms: int = NOW_MS) -> bytes:
    """An uncompressed v2 batch of 1 KiB-value records, about ``batch_bytes`` long."""
    records, index, total = [], 0, 61
    while True:
        body = b"\x00" + _varint(0) + _varint(index) + _varint(-1)
        body += _varint(RECORD_VALUE_BYTES) + bytes(RECORD_VALUE_BYTES) + _varint(0)
        record = _varint(len(body)) + body
        if total + len(record) > batch_bytes:
            break
        records.append(record)
        total += len(record)
        index += 1
    after_crc = struct.pack(">hiqqqhii", 0, index - 1, timestamp_ms, timestamp_ms, -1, -1, -1,
                            index) + b"".join(records)
    body = struct.pack(">ibI", 0, 2, crc32c.crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(body)) + body


def time_log_append(directory: Path, batch: bytes, count: int) -> float:
    shutil.rmtree(directory, ignore_errors=True)
    log = Log("bench", 0, directory / "bench-0", LogConfig(), RealFileSystem(), NOW_MS,
              clean_shutdown=True)
    buffers = [bytearray(batch) for _ in range(min(count, 4))]
    started = time.perf_counter()
    for i in range(count):
        log.append(buffers[i % len(buffers)], NOW_MS)
    elapsed = time.perf_counter() - started
    log.close_without_flush()
    return elapsed


def time_dd(directory: Path, block_bytes: int, count: int) -> float:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    started = time.perf_counter()
    subprocess.run(["dd", "if=/dev/zero", f"of={directory / 'dd.out'}", f"bs={block_bytes}",
                    f"count={count}"], check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--total-mib", type=int, default=512)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/storage/bench-append"))
    args = parser.parse_args()
    total_bytes = args.total_mib << 20
    print("| batch | headrace MB/s | dd MB/s | ratio |")
    print("|---|---|---|---|")
    for label, batch_bytes in (("16 KiB", 16 << 10), ("1 MiB", 1 << 20)):
        batch = build_batch(batch_bytes)
        count = total_bytes // len(batch)
        ours = statistics.median(time_log_append(args.dir, batch, count) for _ in range(RUNS))
        theirs = statistics.median(time_dd(args.dir, len(batch), count) for _ in range(RUNS))
        megabytes = count * len(batch) / 1e6
        print(f"| {label} | {megabytes / ours:.0f} | {megabytes / theirs:.0f} | "
              f"{theirs / ours:.2f} |")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
