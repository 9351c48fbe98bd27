"""Seeded power cuts on a real broker: how many acknowledged records are lost (goal: 0).

Each of ``--cuts`` cuts runs a fresh broker under the power-cut shim (``tests/power_cut.py``:
the production append path stays in use; after SIGKILL the data directory keeps only what was
fsynced, plus a seeded torn tail of the rest), produces up to ``--records`` records with
confluent-kafka (acks=all, idempotent, at most 20 awaiting acknowledgement), cuts the power
after a seeded number of acknowledgements, restarts, produces ``--records-after-recovery`` more
and reads the partition back. Cut ``i``'s seed is drawn from ``--seed``; a failing cut prints
it, and ``--seed`` with ``--cuts 1 --first-cut i`` replays it.

Counts per run: acknowledged records lost (absent from or different at their offset), cuts
whose log is not a prefix of what was produced followed by the records produced after
recovery, unsynced bytes dropped and torn-tail bytes kept. ``--flush-messages`` sets
log.flush.interval.messages (default 1: every acknowledged record must survive; 0 keeps
Kafka's default, where only the prefix rule holds).

    nice -n 5 .venv/bin/python bench/power_cuts.py --cuts 100 --seed 1

Scratch data under a temporary directory, removed after a run without failures (or
``--scratch``, kept); a failing cut's directory is kept. Brokers bind 127.0.0.1 only.
"""

from __future__ import annotations

import argparse
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.power_cut import (  # noqa: E402
    RECORDS_PER_CUT,
    build_shim,
    cut_and_recover,
    log_anomalies,
    lost_acknowledged,
)


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cuts", type=int, default=100)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--first-cut", type=int, default=0)
    parser.add_argument("--records", type=int, default=RECORDS_PER_CUT)
    parser.add_argument("--records-after-recovery", type=int, default=20)
    parser.add_argument("--flush-messages", type=int, default=1)
    parser.add_argument("--scratch", type=Path, default=None)
    return parser.parse_args()


def cut_seeds(seed: int, first_cut: int, cuts: int) -> list[tuple[int, int]]:
    rng = random.Random(seed)
    seeds = [rng.getrandbits(32) for _ in range(first_cut + cuts)]
    return list(enumerate(seeds))[first_cut:]


def main() -> int:
    args = parse_arguments()
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="power-cuts-"))
    scratch.mkdir(parents=True, exist_ok=True)
    shim = build_shim(scratch / "shim")
    overrides = ({"log.flush.interval.messages": str(args.flush_messages)}
                 if args.flush_messages > 0 else {})
    totals = {"acknowledged": 0, "lost": 0, "bad_logs": 0, "dropped": 0, "torn": 0}
    seconds = []
    for index, cut_seed in cut_seeds(args.seed, args.first_cut, args.cuts):
        work_dir = scratch / f"cut-{index}"
        shutil.rmtree(work_dir, ignore_errors=True)
        work_dir.mkdir()
        started = time.monotonic()
        run = cut_and_recover(work_dir, shim, cut_seed, overrides, records=args.records,
                              records_after_recovery=args.records_after_recovery)
        seconds.append(time.monotonic() - started)
        lost = lost_acknowledged(run.acknowledged, run.stored)
        anomalies = log_anomalies(run.stored, run.appended)
        totals["acknowledged"] += len(run.acknowledged)
        totals["lost"] += len(lost)
        totals["bad_logs"] += bool(anomalies)
        totals["dropped"] += run.outcome.dropped_bytes
        totals["torn"] += run.outcome.torn_tail_bytes
        if lost or anomalies:
            print(f"cut {index} (seed {cut_seed}): {len(lost)} acknowledged lost "
                  f"{lost[:3]}, log anomalies {anomalies[:3]}", flush=True)
        else:
            shutil.rmtree(work_dir)
    print(f"cuts {args.cuts} (seed {args.seed}, records {args.records}, flush.messages "
          f"{args.flush_messages or 'default'}): acknowledged {totals['acknowledged']}, "
          f"acknowledged lost {totals['lost']}, logs not a prefix {totals['bad_logs']}, "
          f"unsynced bytes dropped {totals['dropped']}, torn-tail bytes kept {totals['torn']}, "
          f"median {statistics.median(seconds):.1f} s per cut")
    must_keep_every_ack = args.flush_messages == 1
    failed = totals["bad_logs"] or (must_keep_every_ack and totals["lost"])
    if not failed and args.scratch is None:
        shutil.rmtree(scratch)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
