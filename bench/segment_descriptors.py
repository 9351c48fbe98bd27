"""Descriptors a process holds after loading logs with many sealed segments.

Writes ``--partitions`` logs of ``--batches`` small batches each into segments of
``--segment-bytes`` (several per log), closes them, then opens them all again (a clean
start) and prints how many descriptors the loaded logs hold against how many segment files
there are, with the load time and the peak RSS. Active segments keep their three files open;
sealed ones count against the open-segment budget (``headrace.storage.segment_files``), an
eighth of the soft RLIMIT_NOFILE: run under ``ulimit -n`` to see it bound the figure.
Removes its directory afterwards.

    (ulimit -n 1024; .venv/bin/python bench/segment_descriptors.py [--partitions 20]
                                                                    [--batches 100])
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from storage_append import NOW_MS, build_batch  # noqa: E402

from headrace.storage.config import LogConfig  # noqa: E402
from headrace.storage.fs import RealFileSystem  # noqa: E402
from headrace.storage.log import Log  # noqa: E402
from headrace.storage.segment_files import sealed_segment_files  # noqa: E402

BATCH_BYTES = 1200  # one 1 KiB record (see storage_append.build_batch)


def open_logs(root: Path, partitions: int, config: LogConfig) -> list[Log]:
    return [Log("bench", p, root / f"bench-{p}", config, RealFileSystem(), NOW_MS,
                clean_shutdown=True) for p in range(partitions)]


def open_descriptor_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--partitions", type=int, default=20)
    parser.add_argument("--batches", type=int, default=100)
    parser.add_argument("--segment-bytes", type=int, default=8192)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/storage/bench-descriptors"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    config = LogConfig(segment_bytes=args.segment_bytes)
    try:
        for log in open_logs(args.dir, args.partitions, config):
            for _ in range(args.batches):
                log.append(bytearray(build_batch(BATCH_BYTES)), NOW_MS)
            log.close()
        files = sum(1 for _ in args.dir.glob("*/*"))
        before = open_descriptor_count()
        start = time.perf_counter()
        logs = open_logs(args.dir, args.partitions, config)
        load_s = time.perf_counter() - start
        held = open_descriptor_count() - before
        segments = sum(len(log.segments) for log in logs)
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        print(f"soft RLIMIT_NOFILE {soft}, open-segment budget "
              f"{sealed_segment_files().max_open_segments}: {args.partitions} logs, {segments} "
              f"segments, {files} files; {held} descriptors held after loading; load "
              f"{load_s:.2f} s; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss} KiB")
        for log in logs:
            log.close()
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
