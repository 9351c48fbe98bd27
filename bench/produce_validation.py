"""CPU cost of produce validation per batch: the CRC alone against the CRC plus Kafka's record
checks (every record parsed right after the CRC, as ``storage.validation`` runs them).

Owns no state and writes no files: builds v2 batches of several record counts and sizes,
uncompressed and lz4/zstd (``records.build_batch``), then times
``kernel.validate_batches(batch)`` (structure and CRC-32C only, the append path's work before
record validation) and ``kernel.validate_batches(batch, checks)`` (the same plus every record
parsed, offset deltas, keys and timestamps checked, the max timestamp computed; for a
compressed batch also its decompression and ``check_compressed_batch``, as the append path
runs them) on the same buffer, alternating, as
medians over repeats of the thread's CPU time. Prints microseconds per batch for each, the extra nanoseconds per record
and the ratio. Single-threaded; a shared machine's load moves the figures, the ratio less.

    .venv/bin/python bench/produce_validation.py [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.protocol import compression as codecs  # noqa: E402
from headrace.protocol import kernel  # noqa: E402
from headrace.protocol.batch import COMPRESSION_MASK  # noqa: E402
from headrace.protocol.records import build_batch  # noqa: E402
from headrace.storage.validation import check_compressed_batch  # noqa: E402

NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
# (compacted, check timestamps, from a client, now, before.max.ms, after.max.ms)
CHECKS = (False, True, True, NOW_MS, 2**63 - 1, HOUR_MS)
# records, value bytes, codec
SHAPES = ((15, 1024, codecs.NONE), (1000, 1024, codecs.NONE), (150, 100, codecs.NONE),
          (10_000, 100, codecs.NONE), (1000, 10, codecs.NONE), (15, 1024, codecs.LZ4),
          (1000, 1024, codecs.LZ4), (15, 1024, codecs.ZSTD), (1000, 1024, codecs.ZSTD))
TIMED_BYTES_PER_SAMPLE = 2_000_000


def batch_of(records: int, value_bytes: int, codec: int) -> bytearray:
    """A batch of ``records`` records whose values read like log text (lz4 takes them to
    about a third)."""
    return bytearray(build_batch(
        [(b"key-%d" % i, (b"offset=%d level=info msg=ok " % i * value_bytes)[:value_bytes], [],
          NOW_MS + i) for i in range(records)], compression=codec))


def validate_with_records(batch: bytearray) -> None:
    """What the append path runs: the kernel pass, then a compressed batch's records."""
    kernel.validate_batches(batch, CHECKS)
    if batch[22] & COMPRESSION_MASK:
        check_compressed_batch(batch, 0, CHECKS, "bench-0")


def per_call_ns(call, loops: int) -> float:
    """CPU time of the thread per call (not wall-clock: on a shared machine that mostly
    measures the waits for a CPU)."""
    start = time.thread_time_ns()
    for _ in range(loops):
        call()
    return (time.thread_time_ns() - start) / loops


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    print("| records x value bytes, codec | batch bytes | CRC only us | CRC + records us "
          "| extra ns per record | ratio |")
    print("|---|---|---|---|---|---|")
    for records, value_bytes, codec in SHAPES:
        batch = batch_of(records, value_bytes, codec)
        loops = max(20, TIMED_BYTES_PER_SAMPLE // len(batch))
        crc_only, with_records = [], []
        for _ in range(args.repeat):
            crc_only.append(per_call_ns(lambda b=batch: kernel.validate_batches(b), loops))
            with_records.append(per_call_ns(lambda b=batch: validate_with_records(b), loops))
        base, full = statistics.median(crc_only), statistics.median(with_records)
        print(f"| {records} x {value_bytes}, {codecs.codec_name(codec)} | {len(batch)} | "
              f"{base / 1000:.2f} | {full / 1000:.2f} | {(full - base) / records:.1f} | "
              f"{full / base:.2f} |")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")


if __name__ == "__main__":
    main()
