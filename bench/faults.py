"""Fault campaigns against a headrace broker or cluster: seeded runs of the fault harness, one
JSON line each, a summary table at the end; exit status 1 when any run finds an anomaly or
cannot finish.

Run ``i`` of ``--runs N --seed S`` has seed ``S + i``; its faults are drawn from ``--nemesis``
(for ``--target node``: any of kill, pause, clock, power, partition; default all) on a seeded
schedule for ``--duration-s`` seconds of workload (``--workload queue``, ``list-append`` or
``transactional`` (one node only), default alternating among those of the target). ``log.flush.interval.messages=1`` unless ``--default-flush``: then a power cut
may drop an acknowledged suffix, never a hole. A failing run keeps its history, config and
broker log and prints the command that replays its seed (``headrace/faults/runner.py``).

    nice -n 5 .venv/bin/python bench/faults.py --runs 20 --seed 1

``--drop-segment-fsyncs`` is a mutation (the power-cut shim turns .log fsyncs into no-ops):
with power cuts and flush per record, runs must then find lost writes.
``--target cluster``: three brokers (RF=3, min.insync.replicas=2, acks=all) and three ZooKeeper
nodes in a network namespace (``headrace/faults/cluster.py``), with the cluster's nemeses
(kill, pause, power, zk-kill, leader-zk, leader-followers, split, one-way) overlapping on the
seeded schedule. ``recovery_s``: seconds from healing until every partition acknowledged a
write again; a run that is not back within 30 s is invalid. Brokers bind loopback addresses
only.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from headrace.faults.runner import (  # noqa: E402
    KINDS_OF_TARGET,
    TARGETS,
    WORKLOADS,
    WORKLOADS_OF_TARGET,
    RunConfig,
    run,
)

COUNTED = ("acked", "lost", "duplicated", "inconsistent", "nonmonotonic", "skipped",
           "divergent", "g1a", "g1c", "truncated", "duplicated_non_idempotent")


def parse_arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--target", choices=TARGETS, default="node")
    parser.add_argument("--nemesis", default=None,
                        help="comma-separated kinds (default: every kind of the target)")
    parser.add_argument("--workload", choices=WORKLOADS, default=None)
    parser.add_argument("--duration-s", type=float, default=15.0)
    parser.add_argument("--default-flush", action="store_true")
    parser.add_argument("--drop-segment-fsyncs", action="store_true")
    parser.add_argument("--scratch", type=Path, default=None)
    return parser.parse_args()


def summary_table(lines: list[dict]) -> str:
    faults: Counter = Counter()
    totals: Counter = Counter()
    for line in lines:
        faults.update(line["faults"])
        totals.update({key: line[key] for key in COUNTED})
    unavailable = sorted(line["unavailable_s"] for line in lines)
    recoveries = [line["recovery_s"] for line in lines]
    slowest = "never" if None in recoveries else max(recoveries, default=0)
    rows = ["| runs | invalid | faults | " + " | ".join(COUNTED)
            + " | unavailable_s median | recovery_s max |",
            "|" + "---|" * (len(COUNTED) + 5),
            f"| {len(lines)} | {sum(not line['valid'] for line in lines)} | "
            + ", ".join(f"{kind} {count}" for kind, count in sorted(faults.items())) + " | "
            + " | ".join(str(totals[key]) for key in COUNTED)
            + f" | {unavailable[len(unavailable) // 2] if unavailable else 0} | {slowest} |"]
    return "\n".join(rows)


def main() -> int:
    args = parse_arguments()
    nemeses = tuple(kind for kind in (args.nemesis or ",".join(KINDS_OF_TARGET[args.target]))
                    .split(",") if kind)
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="faults-"))
    lines = []
    for index in range(args.runs):
        workloads = WORKLOADS_OF_TARGET[args.target]
        workload = args.workload or workloads[index % len(workloads)]
        config = RunConfig(seed=args.seed + index, nemeses=nemeses, workload=workload,
                           duration_s=args.duration_s,
                           flush_every_record=not args.default_flush,
                           drop_segment_fsyncs=args.drop_segment_fsyncs, target=args.target)
        result = run(config, scratch / f"run-{index}", failures_dir=scratch / "failed")
        line = result.summary()
        lines.append(line)
        print(json.dumps(line), flush=True)
        if not result.valid:
            print(f"run {index} failed; saved to {result.saved_to}; replay: "
                  f"{config.replay_command()}", file=sys.stderr, flush=True)
    print(summary_table(lines))
    return 1 if any(not line["valid"] for line in lines) else 0


if __name__ == "__main__":
    sys.exit(main())
