"""Cleaner benchmark: distinct keys per 128 MiB pass, cleaning MB/s against a plain sequential
read + write of the same bytes on the same disk in the same run, and peak RSS growth.

    .venv/bin/python bench/cleaner.py --megabytes 2048 --keys 2000000 --dir /tmp/cleaner/bench
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.protocol.records import build_batch  # noqa: E402
from headrace.storage.cleaner import Cleaner  # noqa: E402
from headrace.storage.config import LogConfig  # noqa: E402
from headrace.storage.fs import RealFileSystem  # noqa: E402
from headrace.storage.log import Log  # noqa: E402
from headrace.storage.offset_map import OffsetMap  # noqa: E402

NOW_MS = 1_700_000_000_000
RECORDS_PER_BATCH = 1
VALUE_BYTES = 100


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def keys_per_pass() -> int:
    offset_map = OffsetMap()
    rng = np.random.default_rng(1)
    n = offset_map.max_entries + 1_000_000
    hashes = rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)
    return offset_map.put(hashes[:, 0], hashes[:, 1], np.arange(n, dtype=np.int64))


def write_log(path: Path, megabytes: int, keys: int) -> Log:
    config = LogConfig(cleanup_policy=("compact",), segment_bytes=256 * 1024 * 1024)
    log = Log("bench", 0, path, config, RealFileSystem(), NOW_MS)
    rng = np.random.default_rng(2)
    value = b"x" * VALUE_BYTES
    while log.size_bytes < megabytes * 1024 * 1024:
        chunk = bytearray()
        for key in rng.integers(0, keys, 2000).tolist():
            chunk += build_batch([(b"key-%d" % key, value, [], NOW_MS)])
        log.append(chunk, NOW_MS)
    log.roll(NOW_MS)
    log.flush()
    return log


def plain_copy_secs(log: Log, target: Path) -> float:
    started = time.perf_counter()
    with open(target, "wb") as out:
        for segment in log.segments[:-1]:
            with open(segment.log_path, "rb") as source:
                shutil.copyfileobj(source, out, 4 * 1024 * 1024)
        out.flush()
        os.fsync(out.fileno())
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=int, default=512)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/cleaner/bench"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    started = time.perf_counter()
    print(f"distinct keys in one 128 MiB pass: {keys_per_pass():,} "
          f"({time.perf_counter() - started:.1f} s)")
    log = write_log(args.dir / "bench-0", args.megabytes, args.keys)
    size_mb = log.size_bytes / 1024 / 1024
    copy_secs = plain_copy_secs(log, args.dir / "plain-copy")
    os.remove(args.dir / "plain-copy")
    cleaner = Cleaner(OffsetMap())
    rss_before = peak_rss_mb()
    started = time.perf_counter()
    stats = cleaner.clean(log, 0, NOW_MS)
    clean_secs = time.perf_counter() - started
    print(f"log {size_mb:.0f} MB, {args.keys:,} keys: plain read+write {size_mb / copy_secs:.0f} "
          f"MB/s, cleaning {size_mb / clean_secs:.0f} MB/s, ratio {copy_secs / clean_secs:.2f}")
    print(f"size {stats.start_size_bytes / 2**20:.0f} -> {stats.end_size_bytes / 2**20:.0f} MB, "
          f"passes {stats.passes}, buffer utilisation {100 * stats.max_buffer_utilization:.1f}%, "
          f"peak RSS growth during cleaning {peak_rss_mb() - rss_before:.0f} MB")
    log.close()
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
