"""Append throughput of headrace.storage.Log vs dd writing the same bytes to the same file system.

1 KiB records in 16 KiB and 1 MiB v2 batches, one batch per append (as a produce request
carries it), no fsync on either side (flush.messages default; dd without conv=fsync), compared
with ``dd bs=<batch size> count=<batches>`` of the same total into a fresh file in the same
directory (4 source buffers reused, as dd reuses one). A plain Python ``os.write`` loop of the
same buffers is printed too: the floor for any Python writer, so the per-append cost of
validation, offset assignment and index upkeep reads as the gap between it and headrace.

Fairness: the runs alternate headrace, dd, os.write (so machine load drifts hit all alike), each
starts from an empty directory after ``sync`` (no write-back of an earlier run's dirty pages
overlaps a timed run), and each side's figure is the median of 3. The ratio is dd time over
headrace time (goal >= 0.8). On a shared machine wall-clock time mostly measures the other
tenants (and dirty-page throttling when the disk is busy), so the ratio of CPU seconds (user +
system; dd's from its rusage) is printed too: the same work, without the time spent waiting for
a CPU or for write-back; and so is headrace's CPU time per append beyond the os.write loop's
(validation, offset assignment, index upkeep), the figure that load disturbs least. ``--dir``
on a tmpfs (/dev/shm) takes the disk out altogether.

    .venv/bin/python bench/storage_append.py [--total-mib 512] [--dir /tmp/storage/bench]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.protocol.kernel import crc32c  # noqa: E402
from headrace.protocol.varint import encode_signed  # noqa: E402
from headrace.storage.config import LogConfig  # noqa: E402
from headrace.storage.fs import RealFileSystem  # noqa: E402
from headrace.storage.log import Log  # noqa: E402

RECORD_VALUE_BYTES = 1024
RUNS = 3
NOW_MS = 1_700_000_000_000





def build_batch(batch_bytes: int, timestamp_ms: int = NOW_MS) -> bytes:
    """An uncompressed v2 batch of 1 KiB-value records, about ``batch_bytes`` long."""
    records, index, total = [], 0, 61
    while True:
        body = b"\x00" + encode_signed(0) + encode_signed(index) + encode_signed(-1)
        body += encode_signed(RECORD_VALUE_BYTES) + bytes(RECORD_VALUE_BYTES) + encode_signed(0)
        record = encode_signed(len(body)) + body
        if total + len(record) > batch_bytes:
            break
        records.append(record)
        total += len(record)
        index += 1
    after_crc = struct.pack(">hiqqqhii", 0, index - 1, timestamp_ms, timestamp_ms, -1, -1, -1,
                            index) + b"".join(records)
    body = struct.pack(">ibI", 0, 2, crc32c(after_crc)) + after_crc
    return struct.pack(">qi", 0, len(body)) + body


def fresh_directory(directory: Path) -> None:
    """An empty directory, with no dirty pages of an earlier run still being written back."""
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir(parents=True)
    os.sync()


class Stopwatch:
    """Wall-clock and CPU seconds (user + system, of this process or of waited-for children)
    of one timed run."""

    def __init__(self, children: bool = False) -> None:
        self.children = children
        self.wall_s = self.cpu_s = 0.0

    def _cpu_now(self) -> float:
        if self.children:
            usage = resource.getrusage(resource.RUSAGE_CHILDREN)
            return usage.ru_utime + usage.ru_stime
        return time.process_time()

    def __enter__(self) -> Stopwatch:
        self._wall_start, self._cpu_start = time.perf_counter(), self._cpu_now()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.wall_s = time.perf_counter() - self._wall_start
        self.cpu_s = self._cpu_now() - self._cpu_start


def time_log_append(directory: Path, batch: bytes, count: int) -> Stopwatch:
    fresh_directory(directory)
    log = Log("bench", 0, directory / "bench-0", LogConfig(), RealFileSystem(), NOW_MS,
              clean_shutdown=True)
    buffers = [bytearray(batch) for _ in range(min(count, 4))]
    with Stopwatch() as watch:
        for i in range(count):
            log.append(buffers[i % len(buffers)], NOW_MS)
    log.close_without_flush()
    return watch


def time_dd(directory: Path, batch: bytes, count: int) -> Stopwatch:
    """dd of ``count`` blocks of the batch's size (dd writes zeros; the size is what counts)."""
    fresh_directory(directory)
    with Stopwatch(children=True) as watch:
        subprocess.run(["dd", "if=/dev/zero", f"of={directory / 'dd.out'}", f"bs={len(batch)}",
                        f"count={count}"], check=True, capture_output=True)
    return watch


def time_os_write(directory: Path, batch: bytes, count: int) -> Stopwatch:
    fresh_directory(directory)
    buffers = [bytearray(batch) for _ in range(min(count, 4))]
    fd = os.open(directory / "raw.out", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    with Stopwatch() as watch:
        for i in range(count):
            os.write(fd, buffers[i % len(buffers)])
    os.close(fd)
    return watch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--total-mib", type=int, default=512)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/storage/bench-append"))
    args = parser.parse_args()
    total_bytes = args.total_mib << 20
    print(f"load average before: {os.getloadavg()[0]:.1f}")
    print("| batch | headrace MB/s | dd MB/s | Python os.write MB/s | ratio to dd "
          "| ratio to dd, CPU seconds | headrace CPU us per append over os.write |")
    print("|---|---|---|---|---|---|---|")
    sides = (("headrace", time_log_append), ("dd", time_dd), ("os.write", time_os_write))
    for label, batch_bytes in (("16 KiB", 16 << 10), ("1 MiB", 1 << 20)):
        batch = build_batch(batch_bytes)
        count = total_bytes // len(batch)
        watches: dict[str, list[Stopwatch]] = {name: [] for name, _ in sides}
        for _ in range(RUNS):
            for name, timer in sides:
                watches[name].append(timer(args.dir, batch, count))
        wall = {name: statistics.median(w.wall_s for w in runs) for name, runs in watches.items()}
        cpu = {name: statistics.median(w.cpu_s for w in runs) for name, runs in watches.items()}
        megabytes = count * len(batch) / 1e6
        print(f"| {label} | {megabytes / wall['headrace']:.0f} | {megabytes / wall['dd']:.0f} | "
              f"{megabytes / wall['os.write']:.0f} | {wall['dd'] / wall['headrace']:.2f} | "
              f"{cpu['dd'] / cpu['headrace']:.2f} | "
              f"{(cpu['headrace'] - cpu['os.write']) / count * 1e6:.2f} |")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
