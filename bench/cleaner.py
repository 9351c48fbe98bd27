"""Cleaner benchmark: distinct keys per 128 MiB pass, and cleaning MB/s against a plain
sequential read + write of the same bytes on the same disk in the same run (median of 3).

One log is generated (bench/cleaner_workload.py: 36-byte keys, 100-byte values, every key
written ``--versions`` times in permuted order), then for each of ``--runs`` rounds it is
copied afresh, its closed segments are read and written once plainly (one reused 4 MiB
buffer, fsynced), and the copy is cleaned with a 128 MiB dedupe buffer -- in alternating
order from round to round, so neither side always runs second, each after ``os.sync()``
(no write-back or delete of the round's earlier steps overlaps a measurement; cached pages
stay, so both read the log hot); the figure is the median ratio of plain seconds to
cleaning seconds. The cleaner's spans run on the calling thread at its priority, unless
``--broker-spans``: as in the broker, on a helper thread ``CLEANER_SPAN_NICENESS`` nicer and
cooperative (on a machine with other load, a nicer thread gets less CPU). ``--busy-broker``
(implies ``--broker-spans``) also notes a broker request every millisecond throughout
(``note_broker_request``), so the spans pause as they do on a broker serving requests all
along: the cleaning speed's floor.

    .venv/bin/python bench/cleaner.py --megabytes 512 --records-per-batch 100
    .venv/bin/python bench/cleaner.py --megabytes 512 --records-per-batch 1
    .venv/bin/python bench/cleaner.py --megabytes 256 --skip-capacity --runs 5 --broker-spans
    .venv/bin/python bench/cleaner.py --megabytes 256 --skip-capacity --runs 5 --busy-broker
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from cleaner_workload import NOW_MS, BatchBuilder, permuted_ids  # noqa: E402

from headrace.broker.cleaner_service import CLEANER_SPAN_NICENESS  # noqa: E402
from headrace.broker.scheduling import note_broker_request  # noqa: E402
from headrace.storage.cleaner import Cleaner  # noqa: E402
from headrace.storage.config import LogConfig  # noqa: E402
from headrace.storage.fs import RealFileSystem  # noqa: E402
from headrace.storage.log import Log  # noqa: E402
from headrace.storage.offset_map import OffsetMap  # noqa: E402

KEY_BYTES = 36
VALUE_BYTES = 100
PERMUTATION_MULTIPLIER = 2_654_435_761  # prime: coprime to any key count below it
CONFIG = LogConfig(cleanup_policy=("compact",), segment_bytes=256 * 1024 * 1024)


def keys_per_pass() -> int:
    offset_map = OffsetMap()
    rng = np.random.default_rng(1)
    n = offset_map.max_entries + 1_000_000
    hashes = rng.integers(0, 2**64, size=(n, 2), dtype=np.uint64)
    return offset_map.put(hashes[:, 0], hashes[:, 1], np.arange(n, dtype=np.int64))


def open_log(path: Path) -> Log:
    return Log("bench", 0, path, CONFIG, RealFileSystem(), NOW_MS, recovery_point=0)


def write_log(path: Path, megabytes: int, versions: int, records_per_batch: int) -> int:
    """Write ``versions`` rounds over as many keys as fill ``megabytes``; returns the keys."""
    builder = BatchBuilder(records_per_batch, KEY_BYTES, VALUE_BYTES)
    record_bytes = len(builder.build(np.zeros(records_per_batch, np.int64), 0)) \
        / records_per_batch
    keys = int(megabytes * 1024 * 1024 / record_bytes / versions)
    log = open_log(path)
    for version in range(versions):
        for start in range(0, keys, records_per_batch):
            ids = permuted_ids(start, min(records_per_batch, keys - start), keys,
                               PERMUTATION_MULTIPLIER + version)
            log.append(builder.build(ids, version), NOW_MS)
    log.roll(NOW_MS)
    log.close()
    return keys


def plain_copy_secs(log: Log, target: Path) -> float:
    """A plain sequential copy of the closed segments (read into one reused 4 MiB buffer,
    write, fsync): the same bytes read and the same count written as a copy would."""
    buffer = bytearray(4 * 1024 * 1024)
    view = memoryview(buffer)
    started = time.perf_counter()
    out = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for segment in log.segments[:-1]:
            source = os.open(segment.log_path, os.O_RDONLY)
            try:
                while count := os.readv(source, [buffer]):
                    os.write(out, view[:count])
            finally:
                os.close(source)
        os.fsync(out)
    finally:
        os.close(out)
    return time.perf_counter() - started


def settle() -> None:
    """Before each measurement: write back every dirty page and commit pending deletes (with
    the ``discard`` mount option a commit trims the freed blocks), so neither side pays for
    the other's leftovers. Cached pages stay: both sides read hot, from the same cache."""
    os.sync()


BUSY_BROKER_REQUEST_INTERVAL_S = 0.001


class BusyBroker:
    """Notes a broker request every ``BUSY_BROKER_REQUEST_INTERVAL_S`` while in use."""

    def __enter__(self) -> BusyBroker:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        return self

    def _run(self) -> None:
        while not self.stop.wait(BUSY_BROKER_REQUEST_INTERVAL_S):
            note_broker_request()

    def __exit__(self, *_exception) -> None:
        self.stop.set()
        self.thread.join()


def one_round(source: Path, work: Path, clean_first: bool, span_niceness: int,
              busy_broker: bool) -> tuple[float, float, float, object]:
    shutil.rmtree(work, ignore_errors=True)
    shutil.copytree(source, work)
    log = open_log(work / "bench-0")
    size_mb = sum(s.size_bytes for s in log.segments[:-1]) / 2**20
    if not clean_first:
        settle()
        copy_secs = plain_copy_secs(log, work / "plain-copy")
        os.remove(work / "plain-copy")
    cleaner = Cleaner(OffsetMap(), span_niceness=span_niceness)
    settle()
    with BusyBroker() if busy_broker else contextlib.nullcontext():
        started = time.perf_counter()
        stats = cleaner.clean(log, 0, NOW_MS)
        clean_secs = time.perf_counter() - started
    if clean_first:  # the cleaned log replaced the source bytes: copy the untouched source
        settle()
        copy_secs = plain_copy_secs(open_log(source / "bench-0"), work / "plain-copy")
        os.remove(work / "plain-copy")
    log.close()
    return size_mb, copy_secs, clean_secs, stats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--megabytes", type=int, default=512)
    parser.add_argument("--versions", type=int, default=2)
    parser.add_argument("--records-per-batch", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/cleaner/bench"))
    parser.add_argument("--skip-capacity", action="store_true")
    parser.add_argument("--broker-spans", action="store_true",
                        help="spans as in the broker: on a nicer helper thread, cooperative")
    parser.add_argument("--busy-broker", action="store_true",
                        help="--broker-spans on a broker receiving requests all along")
    args = parser.parse_args()
    shutil.rmtree(args.dir, ignore_errors=True)
    args.dir.mkdir(parents=True)
    if not args.skip_capacity:
        started = time.perf_counter()
        print(f"distinct keys in one 128 MiB pass: {keys_per_pass():,} "
              f"({time.perf_counter() - started:.1f} s)")
    started = time.perf_counter()
    keys = write_log(args.dir / "source" / "bench-0", args.megabytes, args.versions,
                     args.records_per_batch)
    print(f"generated {keys:,} keys x {args.versions} versions, {args.records_per_batch} "
          f"records a batch in {time.perf_counter() - started:.1f} s")
    span_niceness = CLEANER_SPAN_NICENESS if args.broker_spans or args.busy_broker else 0
    ratios = []
    for run in range(args.runs):
        size_mb, copy_secs, clean_secs, stats = one_round(args.dir / "source",
                                                          args.dir / "work", run % 2 == 1,
                                                          span_niceness, args.busy_broker)
        ratios.append(copy_secs / clean_secs)
        print(f"run {run + 1}: {size_mb:.0f} MB: plain read+write {size_mb / copy_secs:.0f} "
              f"MB/s, cleaning {size_mb / clean_secs:.0f} MB/s, ratio {ratios[-1]:.2f}; "
              f"{stats.start_size_bytes / 2**20:.0f} -> {stats.end_size_bytes / 2**20:.0f} MB, "
              f"passes {stats.passes}, buffer utilisation "
              f"{100 * stats.max_buffer_utilization:.1f}%")
    print(f"median ratio cleaning / plain read+write: {statistics.median(ratios):.2f} "
          f"(load average {os.getloadavg()[0]:.1f})")
    shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
