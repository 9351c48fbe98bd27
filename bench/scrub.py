"""The background scrub: its read rate, and produce p99 while it runs against idle.

Two parts, both on scratch data under /tmp/scrub-bench (or ``--scratch``):

1. ``rate``: ``--gigabytes`` of sealed segments written with ``Log`` (1 GiB segments of
   ``--batch-bytes`` batches), then one ``Scrubber`` pass over them unthrottled and one at the
   default ``log.scrub.io.max.bytes.per.second`` (through the broker's ``Throttler``; the
   throttled pass is cut at ``--throttled-seconds`` and its rate taken over what it read).
   The pages written are still cached unless the machine dropped them: for a cold figure run
   ``sync; echo 1 > /proc/sys/vm/drop_caches`` (root) between writing and the first pass with
   ``--pause-before-scrub``; the scrub itself reads uncached chunks with O_DIRECT.
2. ``latency``: a broker (scrub disabled) gets ``--broker-megabytes`` in the topic ``dirty``
   (64 MiB segments, infinite retention); it is restarted with the scrub disabled and a paced
   producer (the cleaner bench's ``PacedProducer``) runs ``--seconds`` (idle); it is restarted
   with the scrub enabled at the default rate (``log.scrub.interval.ms`` one day: one pass,
   starting at start-up) and the paced producer runs ``--seconds`` again while the pass runs
   (the broker log says whether the pass ended inside the window). Goal: p99 during the
   scrub <= 1.2x idle.

    .venv/bin/python bench/scrub.py --gigabytes 4 --broker-megabytes 2000 --seconds 20

Timings need a quiet machine; the broker binds 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from cleaner_produce_latency import (  # noqa: E402
    Broker,
    PacedProducer,
    create_topics,
    fill,
    free_port,
    p99_ms,
)

from headrace.broker.cleaner_service import Throttler  # noqa: E402
from headrace.broker.config import BROKER_CONFIGS  # noqa: E402
from headrace.storage.clock import SystemClock  # noqa: E402
from headrace.storage.config import LogConfig  # noqa: E402
from headrace.storage.fs import RealFileSystem  # noqa: E402
from headrace.storage.log import Log  # noqa: E402
from headrace.storage.scrub import Scrubber  # noqa: E402

NOW_MS = 1_700_000_000_000
LOG_SEGMENT_BYTES = 1024 * 1024 * 1024
DEFAULT_RATE = float(BROKER_CONFIGS["log.scrub.io.max.bytes.per.second"].default)
SCRUBBING_OVERRIDES = {"log.scrub.enable": "true", "log.scrub.interval.ms": "86400000"}


def batch_of(total_bytes: int) -> bytes:
    """One valid v2 batch of about ``total_bytes`` (one record), built by the test helper."""
    from tests.storage.batches import build_batch
    return bytes(build_batch([b"s" * max(1, total_bytes - 80)]))


def write_segments(directory: Path, gigabytes: float, batch_bytes: int) -> Log:
    log = Log("scrub", 0, directory / "scrub-0", LogConfig(segment_bytes=LOG_SEGMENT_BYTES),
              RealFileSystem(), NOW_MS, clean_shutdown=True)
    batch = batch_of(batch_bytes)
    for _ in range(int(gigabytes * 1024**3 // len(batch))):
        log.append(batch, NOW_MS)
    log.roll(NOW_MS)  # everything written is sealed
    log.flush()
    return log


def timed_pass(log: Log, rate: float, limit_s: float) -> tuple[int, float]:
    """Bytes read and seconds taken by one scrub pass at ``rate`` bytes/s (cut at
    ``limit_s``)."""
    clock = SystemClock()
    throttler = Throttler(rate, clock, time.sleep)
    read = [0]
    start = time.perf_counter()

    def on_bytes(count: int) -> None:
        read[0] += count
        throttler.maybe_throttle(count)

    def on_damage(_log, damage) -> None:
        raise AssertionError(f"damage in freshly written data: {damage}")

    scrubber = Scrubber(RealFileSystem(), clock, on_bytes, on_damage,
                        stopped=lambda: time.perf_counter() - start > limit_s)
    scrubber.scrub_pass([log])
    return read[0], time.perf_counter() - start


def rate_part(args) -> None:
    log = write_segments(args.scratch / "rate", args.gigabytes, args.batch_bytes)
    if args.pause_before_scrub:
        input("segments written; drop the page cache now, then press Enter")
    for name, rate, limit_s in (("unthrottled", float("inf"), float("inf")),
                                ("default rate", DEFAULT_RATE, args.throttled_seconds)):
        read, seconds = timed_pass(log, rate, limit_s)
        print(f"scrub {name}: {read / 1e6:.0f} MB in {seconds:.2f} s = "
              f"{read / 1e6 / seconds:.1f} MB/s (limit {rate / 1e6:.1f} MB/s)", flush=True)
    log.close()


def paced_window(data_dir: Path, overrides: dict[str, str], args) -> tuple[float, str]:
    port = free_port()
    broker = Broker(data_dir, port, overrides)
    mark = broker.log_path.stat().st_size
    try:
        producer = PacedProducer(f"127.0.0.1:{port}", args.rate, args.record_bytes)
        records = producer.pace(args.seconds)
    finally:
        broker.stop()
    with open(broker.log_path, "rb") as log_file:
        log_file.seek(mark)
        logged = log_file.read().decode(errors="replace")
    return p99_ms(records), logged


def latency_part(args) -> None:
    data_dir = args.scratch / "broker" / "data"
    data_dir.mkdir(parents=True)
    port = free_port()
    broker = Broker(data_dir, port, {"log.scrub.enable": "false"})
    try:
        create_topics(f"127.0.0.1:{port}")
        fill(f"127.0.0.1:{port}", args.broker_megabytes, 1_000_000, 1000, 0)
    finally:
        broker.stop()
    idle_p99, _ = paced_window(data_dir, {"log.scrub.enable": "false"}, args)
    scrub_p99, logged = paced_window(data_dir, SCRUBBING_OVERRIDES, args)
    ended = "log scrub pass completed" in logged
    print(f"produce p99 idle {idle_p99:.2f} ms, during the scrub {scrub_p99:.2f} ms = "
          f"{scrub_p99 / idle_p99:.2f}x idle (goal <= 1.2x); the pass "
          f"{'ended inside' if ended else 'outlasted'} the window; load {os.getloadavg()[0]:.2f}",
          flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=["rate", "latency", "both"], default="both")
    parser.add_argument("--gigabytes", type=float, default=4.0)
    parser.add_argument("--batch-bytes", type=int, default=16384)
    parser.add_argument("--throttled-seconds", type=float, default=10.0)
    parser.add_argument("--pause-before-scrub", action="store_true")
    parser.add_argument("--broker-megabytes", type=int, default=2000)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--record-bytes", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/scrub-bench"))
    args = parser.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    try:
        if args.part in ("rate", "both"):
            rate_part(args)
        if args.part in ("latency", "both"):
            latency_part(args)
    finally:
        shutil.rmtree(args.scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
