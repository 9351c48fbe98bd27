"""Recovery time of a 10 GiB log with a 64 MiB unflushed tail after an unclean shutdown.

Builds the log from 1 MiB batches (1 GiB segments), flushes it (the recovery point), appends a
64 MiB tail without flushing, abandons the log without closing it (no clean-shutdown state),
then times opening it again with the recovery point: index files of the flushed segments are
loaded and sanity-checked, only the tail is CRC-scanned. Also times a clean reopen. Goal < 2 s.
Checks free space first and removes the log afterwards.

    .venv/bin/python bench/storage_recovery.py [--log-gib 10] [--tail-mib 64]
"""

from __future__ import annotations

import argparse
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

FREE_SPACE_MARGIN_BYTES = 4 << 30


def open_log(path: Path, **kwargs) -> Log:
    return Log("bench", 0, path, LogConfig(), RealFileSystem(), NOW_MS, **kwargs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--log-gib", type=int, default=10)
    parser.add_argument("--tail-mib", type=int, default=64)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/storage/bench-recovery"))
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    needed = (args.log_gib << 30) + (args.tail_mib << 20) + FREE_SPACE_MARGIN_BYTES
    if shutil.disk_usage(args.dir).free < needed:
        sys.exit(f"need {needed >> 30} GiB free under {args.dir}")
    path = args.dir / "bench-0"
    try:
        log = open_log(path, clean_shutdown=True)
        batch = build_batch(1 << 20)
        for _ in range((args.log_gib << 30) // len(batch)):
            log.append(bytearray(batch), NOW_MS)
        log.flush()
        recovery_point = log.recovery_point
        for _ in range((args.tail_mib << 20) // len(batch)):
            log.append(bytearray(batch), NOW_MS)
        log_end = log.log_end_offset
        size_bytes = log.size_bytes
        log.close_without_flush()

        started = time.perf_counter()
        recovered = open_log(path, recovery_point=recovery_point)
        unclean_s = time.perf_counter() - started
        assert recovered.log_end_offset == log_end, (recovered.log_end_offset, log_end)
        recovered.close()
        started = time.perf_counter()
        reopened = open_log(path, clean_shutdown=True)
        clean_s = time.perf_counter() - started
        reopened.close_without_flush()
        print("| log | unflushed tail | unclean recovery s | clean open s |")
        print("|---|---|---|---|")
        print(f"| {size_bytes / 2**30:.1f} GiB | {args.tail_mib} MiB | {unclean_s:.3f} | "
              f"{clean_s:.3f} |")
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
