"""CPU cost of produce validation per batch: the CRC alone against the CRC plus Kafka's record
checks (every record parsed right after the CRC, as ``storage.validation`` runs them).

Owns no state and writes no files: builds uncompressed v2 batches of several record counts and
sizes (``records.build_batch``), then times ``kernel.validate_batches(batch)`` (structure and
CRC-32C only, the append path's work before record validation) and
``kernel.validate_batches(batch, checks)`` (the same plus every record parsed, offset deltas,
keys and timestamps checked, the max timestamp computed) on the same buffer, alternating, as
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

from headrace.protocol import kernel  # noqa: E402
from headrace.protocol.records import build_batch  # noqa: E402

NOW_MS = 1_700_000_000_000
HOUR_MS = 3_600_000
# (compacted, check timestamps, from a client, now, before.max.ms, after.max.ms)
CHECKS = (False, True, True, NOW_MS, 2**63 - 1, HOUR_MS)
SHAPES = ((15, 1024), (1000, 1024), (150, 100), (10_000, 100), (1000, 10))  # records, value bytes
TIMED_BYTES_PER_SAMPLE = 2_000_000


def batch_of(records: int, value_bytes: int) -> bytearray:
    return bytearray(build_batch([(b"key-%d" % i, b"x" * value_bytes, [], NOW_MS + i)
                                  for i in range(records)]))


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
    print("| records x value bytes | batch bytes | CRC only us | CRC + records us "
          "| extra ns per record | ratio |")
    print("|---|---|---|---|---|---|")
    for records, value_bytes in SHAPES:
        batch = batch_of(records, value_bytes)
        loops = max(20, TIMED_BYTES_PER_SAMPLE // len(batch))
        crc_only, with_records = [], []
        for _ in range(args.repeat):
            crc_only.append(per_call_ns(lambda b=batch: kernel.validate_batches(b), loops))
            with_records.append(per_call_ns(
                lambda b=batch: kernel.validate_batches(b, CHECKS), loops))
        base, full = statistics.median(crc_only), statistics.median(with_records)
        print(f"| {records} x {value_bytes} | {len(batch)} | {base / 1000:.2f} | "
              f"{full / 1000:.2f} | {(full - base) / records:.1f} | {full / base:.2f} |")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")


if __name__ == "__main__":
    main()
