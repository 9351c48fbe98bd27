"""Benchmark of the compiled record kernel's decode_columns against a pure-Python reader.

Owns no state: builds a segment-like buffer of v2 batches of 1 KiB records with
kafka-python's DefaultRecordBatchBuilder (uncompressed and lz4), then times in one run
``headrace.protocol.kernel.decode_columns`` (CRC check included) and kafka-python's
pure-Python ``DefaultRecordBatch`` reader (CRC check included, every key/value/header
touched) as the reference. Prints records/s and MB/s (MB = 10^6 bytes of the input
buffer as stored: compressed bytes for lz4) as medians over repeats, the ratio, and the
command line to quote in BENCHMARKS.md.

Run: ``.venv/bin/python bench/kernel.py [--records N] [--batch-records K] [--repeat R]``.
Single-threaded; no files written.
"""

from __future__ import annotations

import argparse
import random
import shlex
import statistics
import struct
import sys
import time
from collections.abc import Callable

from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from headrace.protocol import kernel

RECORD_VALUE_BYTES = 1024
KEY_BYTES = 16
CODECS = {"none": 0, "lz4": 3}
WORDS = [b"alpha", b"bravo", b"charlie", b"delta", b"echo", b"foxtrot", b"golf", b"hotel"]
BATCH_BUILD_LIMIT_BYTES = 1 << 30  # kafka-python builder cap; batches are cut by count


def payload(rng: random.Random) -> bytes:
    """A 1 KiB value that compresses like log text (roughly 2-4x with lz4)."""
    words = b" ".join(rng.choice(WORDS) + b"=%d" % rng.randrange(10**6) for _ in range(120))
    return words[:RECORD_VALUE_BYTES].ljust(RECORD_VALUE_BYTES, b".")


def build_log(records: int, batch_records: int, codec: int) -> bytes:
    rng = random.Random(1)
    values = [payload(rng) for _ in range(256)]
    out, base_offset = [], 0
    while base_offset < records:
        count = min(batch_records, records - base_offset)
        builder = DefaultRecordBatchBuilder(2, codec, False, -1, -1, -1, BATCH_BUILD_LIMIT_BYTES)
        for delta in range(count):
            key = b"key-%012d" % ((base_offset + delta) % 10_000)
            builder.append(
                delta, 1_700_000_000_000 + delta, key[:KEY_BYTES], values[delta % 256], []
            )
        batch = bytearray(builder.build())
        struct.pack_into(">q", batch, 0, base_offset)
        out.append(bytes(batch))
        base_offset += count
    return b"".join(out)


def reference_decode(buf: bytes) -> int:
    """kafka-python's pure-Python reader over every whole batch; returns the record count."""
    view, pos, count = memoryview(buf), 0, 0
    while len(buf) - pos >= 12:
        size = struct.unpack_from(">i", buf, pos + 8)[0] + 12
        batch = DefaultRecordBatch(view[pos : pos + size])
        if not batch.validate_crc():
            raise ValueError(f"CRC mismatch at byte {pos}")
        for record in batch:
            _ = (record.offset, record.timestamp, record.key, record.value, record.headers)
            count += 1
        pos += size
    return count


def kernel_decode(buf: bytes) -> int:
    return kernel.decode_columns(buf).count


def median_seconds(decode: Callable[[bytes], int], buf: bytes, repeat: int, expected: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        decoded = decode(buf)
        times.append(time.perf_counter() - start)
        if decoded != expected:
            raise SystemExit(f"{decode.__name__} decoded {decoded} records, expected {expected}")
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--batch-records", type=int, default=16, help="records per batch")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--reference-repeat", type=int, default=3)
    args = parser.parse_args()
    print(f"command: .venv/bin/python bench/kernel.py {shlex.join(sys.argv[1:])}".rstrip())
    print(f"{args.records} records x {RECORD_VALUE_BYTES} B values, {args.batch_records}/batch")
    header = f"{'codec':6} {'reader':22} {'records/s':>12} {'MB/s':>9} {'input MB':>9}"
    print(header)
    for name, codec in CODECS.items():
        buf = build_log(args.records, args.batch_records, codec)
        megabytes = len(buf) / 1e6
        ours = median_seconds(kernel_decode, buf, args.repeat, args.records)
        ref = median_seconds(reference_decode, buf, args.reference_repeat, args.records)
        for label, seconds in (("kernel.decode_columns", ours), ("kafka-python reader", ref)):
            rate = args.records / seconds
            print(f"{name:6} {label:22} {rate:12,.0f} {megabytes / seconds:9,.1f} {megabytes:9.1f}")
        print(f"{name:6} {'speed-up':22} {ref / ours:12.1f}x")


if __name__ == "__main__":
    main()
