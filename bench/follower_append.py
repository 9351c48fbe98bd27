"""CPU-seconds per GB of a follower's appends (``Log.append_as_follower``) in one process, the
one-pass path against the per-header path (the fallback kept for refused batches), both fed
the same fetches: a leader log of ``--batches`` batches of ``--records-per-batch`` records of
``--record-bytes`` each (idempotent, or plain with ``--plain``), cut into fetches of at most
``--fetch-bytes`` whole batches. Real files under ``--scratch``; each path runs ``--rounds``
times on a fresh log, alternating, and the median is printed (JSON, one line).

    PYTHONPATH=. nice -n 5 .venv/bin/python bench/follower_append.py --records-per-batch 1

CPU time (``time.process_time``), not wall time: the figure holds on a busy machine.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.protocol.records import build_batch  # noqa: E402
from headrace.storage.config import LogConfig  # noqa: E402
from headrace.storage.fs import RealFileSystem  # noqa: E402
from headrace.storage.log import Log  # noqa: E402
from tests.storage.helpers import read_all  # noqa: E402

NOW_MS = 1_700_000_000_000
PRODUCER_ID = 7


def open_log(directory: Path) -> Log:
    return Log("bench", 0, directory / "bench-0", LogConfig(), RealFileSystem(), NOW_MS,
               clean_shutdown=True)


def leader_fetches(directory: Path, args) -> list[bytes]:
    """The leader's batches, joined into fetches of at most ``args.fetch_bytes`` each."""
    leader = open_log(directory)
    value = b"x" * args.record_bytes
    for index in range(args.batches):
        records = [(None, value, (), NOW_MS)] * args.records_per_batch
        producer = {} if args.plain else {
            "producer_id": PRODUCER_ID, "producer_epoch": 0,
            "base_sequence": index * args.records_per_batch}
        leader.append(build_batch(records, **producer), NOW_MS, leader_epoch=1)
    fetches, pending, pending_bytes = [], [], 0
    for _, batch in read_all(leader):
        if pending and pending_bytes + len(batch) > args.fetch_bytes:
            fetches.append(b"".join(pending))
            pending, pending_bytes = [], 0
        pending.append(batch)
        pending_bytes += len(batch)
    fetches.append(b"".join(pending))
    leader.close()
    return fetches


def cpu_s_per_gb(directory: Path, fetches: list[bytes], one_pass: bool) -> float:
    shutil.rmtree(directory, ignore_errors=True)
    follower = open_log(directory)
    if not one_pass:
        follower._append_follower_scanned = lambda *arguments: None
    started = time.process_time()
    for fetch in fetches:
        follower.append_as_follower(fetch, NOW_MS)
    elapsed = time.process_time() - started
    follower.close()
    shutil.rmtree(directory, ignore_errors=True)
    return elapsed / (sum(map(len, fetches)) / 1e9)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=50_000)
    parser.add_argument("--records-per-batch", type=int, default=1)
    parser.add_argument("--record-bytes", type=int, default=1024)
    parser.add_argument("--fetch-bytes", type=int, default=1 << 20)  # replica.fetch.max.bytes
    parser.add_argument("--plain", action="store_true")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/follower-append-bench"))
    args = parser.parse_args()
    shutil.rmtree(args.scratch, ignore_errors=True)
    fetches = leader_fetches(args.scratch / "leader", args)
    figures: dict[str, list[float]] = {"one_pass": [], "per_header": []}
    for _ in range(args.rounds):
        for name in figures:
            figures[name].append(cpu_s_per_gb(args.scratch / name, fetches, name == "one_pass"))
    shutil.rmtree(args.scratch, ignore_errors=True)
    medians = {name: round(statistics.median(values), 2) for name, values in figures.items()}
    print(json.dumps({"batches": args.batches, "records_per_batch": args.records_per_batch,
                      "record_bytes": args.record_bytes, "plain": args.plain,
                      "fetches": len(fetches),
                      "one_pass_cpu_s_per_gb": medians["one_pass"],
                      "per_header_cpu_s_per_gb": medians["per_header"]}))


if __name__ == "__main__":
    main()
