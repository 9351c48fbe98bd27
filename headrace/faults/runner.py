"""One fault run: a seeded schedule of faults against a broker under a workload, then a check.

``run(RunConfig, work_dir)`` starts one broker (``BrokerNode``; inside a fresh network
namespace on 127.0.0.2 when a ``partition`` nemesis is asked for, under the power-cut shim for
``power``, with a skewable clock for ``clock``), creates the workload's topic, starts its
clients, and injects faults from ``schedule(config)``: faults one after another, each of a
kind drawn from the configured nemeses, lasting a seeded time, with seeded gaps, until
``duration_s``. Then every nemesis heals, the clients stop, the workload's final reads run,
and its checker judges the history. Everything started is removed in ``finally``: the broker
by pid, rules by id, the namespace by name.

The flush policy is the run's: ``flush_every_record`` sets log.flush.interval.messages=1, and
only then must a power cut keep every acknowledged record; otherwise the checker allows a cut
to drop an acknowledged suffix (never a hole). A SIGKILL keeps the page cache: nothing
acknowledged may be lost to it under either policy.

Result: ``RunResult.summary()``, the JSON line ``bench/faults.py`` prints: seed, workload,
nemeses, flush, ``faults`` (kind -> count injected), acked, lost, duplicated, inconsistent,
nonmonotonic, skipped, divergent, truncated, duplicated_non_idempotent, unavailable_s (the
sum of gaps longer than ``UNAVAILABLE_GAP_S`` between successive acknowledgements while the
clients wrote), valid, and, when invalid, the directory the history and logs were saved to
and the command that replays the seed. The schedule replays exactly; the interleaving of
clients and faults does not (threads and a real broker).

Thread-safety: ``run`` drives everything from the calling thread plus the workload's threads.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from headrace.faults.history import INFO, INVOKE, NEMESIS, OK, History, dump
from headrace.faults.namespace import Namespace
from headrace.faults.nemesis import Nemesis
from headrace.faults.nemesis.clock import ClockNemesis
from headrace.faults.nemesis.network import PartitionNemesis
from headrace.faults.nemesis.power import PowerNemesis
from headrace.faults.nemesis.process import KillNemesis, PauseNemesis
from headrace.faults.node import BrokerNode, free_port
from headrace.faults.power_cut import build_shim
from headrace.faults.workloads import Workload
from headrace.faults.workloads.list_append import ListAppendWorkload
from headrace.faults.workloads.queue import QueueConfig, QueueWorkload

NEMESIS_KINDS = ("kill", "pause", "clock", "power", "partition")
WORKLOADS = ("queue", "list-append")
BROKER_HOST = "127.0.0.2"
CLIENT_HOST = "127.0.0.1"
UNAVAILABLE_GAP_S = 1.0
FIRST_FAULT_AFTER_S = (1.0, 2.0)
GAP_BETWEEN_FAULTS_S = (0.5, 2.0)
SESSION_TIMEOUT_MS = 6_000
REPLAY_SCRIPT = "bench/faults.py"


@dataclass(frozen=True)
class RunConfig:
    seed: int
    nemeses: tuple[str, ...] = ("kill",)
    workload: str = "queue"
    duration_s: float = 10.0
    flush_every_record: bool = True
    drop_segment_fsyncs: bool = False  # a mutation: the shim turns .log fsyncs into no-ops

    def __post_init__(self) -> None:
        unknown = set(self.nemeses) - set(NEMESIS_KINDS)
        if unknown or not self.nemeses:
            raise ValueError(f"nemeses must be among {NEMESIS_KINDS}, not {sorted(unknown)}")
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}")

    def replay_command(self) -> str:
        flags = [f"--seed {self.seed}", "--runs 1", f"--nemesis {','.join(self.nemeses)}",
                 f"--workload {self.workload}", f"--duration-s {self.duration_s:g}"]
        if not self.flush_every_record:
            flags.append("--default-flush")
        if self.drop_segment_fsyncs:
            flags.append("--drop-segment-fsyncs")
        return f"{sys.executable} {REPLAY_SCRIPT} {' '.join(flags)}"


@dataclass(frozen=True)
class Fault:
    kind: str
    start_s: float
    duration_s: float


def schedule(config: RunConfig, durations: dict[str, tuple[float, float]]) -> list[Fault]:
    """Faults one after another from the seed: kind, start and length (within the kind's
    ``durations`` bounds); the last one starts before ``duration_s``."""
    rng = random.Random(config.seed)
    faults, start_s = [], rng.uniform(*FIRST_FAULT_AFTER_S)
    while start_s < config.duration_s:
        kind = rng.choice(config.nemeses)
        length_s = rng.uniform(*durations[kind])
        faults.append(Fault(kind, round(start_s, 3), round(length_s, 3)))
        start_s += length_s + rng.uniform(*GAP_BETWEEN_FAULTS_S)
    return faults


@dataclass
class RunResult:
    config: RunConfig
    faults: dict[str, int]
    counts: dict[str, int]
    acked: int
    truncated: int = 0
    duplicated_non_idempotent: int = 0
    unavailable_s: float = 0.0
    errors: list[str] = field(default_factory=list)
    examples: dict[str, list] = field(default_factory=dict)
    saved_to: Path | None = None

    @property
    def valid(self) -> bool:
        return not any(self.counts.values()) and not self.errors

    def summary(self) -> dict:
        line = {"seed": self.config.seed, "workload": self.config.workload,
                "nemeses": list(self.config.nemeses),
                "flush": "every-record" if self.config.flush_every_record else "default",
                "faults": self.faults, "acked": self.acked,
                **{kind: self.counts.get(kind, 0) for kind in (
                    "lost", "duplicated", "inconsistent", "nonmonotonic", "skipped",
                    "divergent")},
                "truncated": self.truncated,
                "duplicated_non_idempotent": self.duplicated_non_idempotent,
                "unavailable_s": round(self.unavailable_s, 3), "valid": self.valid}
        if self.errors:
            line["errors"] = self.errors
        if self.examples:
            line["examples"] = self.examples
        if self.saved_to is not None:
            line["saved_to"] = str(self.saved_to)
            line["replay"] = self.config.replay_command()
        return line


class _Run:
    """The resources of one run, so that ``close`` can remove exactly what was made."""

    def __init__(self, config: RunConfig, work_dir: Path) -> None:
        self.config = config
        self.work_dir = work_dir
        self.history = History()
        self.namespace: Namespace | None = None
        self.node: BrokerNode | None = None
        self.nemeses: dict[str, Nemesis] = {}

    def open(self) -> None:
        kinds = set(self.config.nemeses)
        host = "127.0.0.1"
        if "partition" in kinds:
            self.namespace = Namespace()
            self.namespace.create([CLIENT_HOST, BROKER_HOST])
            host = BROKER_HOST
        overrides = {"log.flush.interval.messages": "1"} if self.config.flush_every_record else {}
        shim = build_shim(self.work_dir / "shim") if "power" in kinds else None
        self.node = BrokerNode("broker-1", host, free_port(host, self.namespace),
                               self.work_dir / "data", overrides, self.namespace, shim,
                               self.work_dir / "clock" if "clock" in kinds else None,
                               drop_fsync_suffix=".log" if self.config.drop_segment_fsyncs
                               else "")
        self.node.start()
        self.nemeses = {kind: self._nemesis(kind) for kind in self.config.nemeses}

    def _nemesis(self, kind: str) -> Nemesis:
        return {"kill": lambda: KillNemesis(self.node),
                "pause": lambda: PauseNemesis(self.node, SESSION_TIMEOUT_MS),
                "clock": lambda: ClockNemesis(self.node),
                "power": lambda: PowerNemesis(self.node),
                "partition": lambda: PartitionNemesis(self.namespace, CLIENT_HOST, BROKER_HOST),
                }[kind]()

    def record(self, action) -> None:
        if action is not None:
            self.history.record(INFO, NEMESIS, action.name, action.details)

    def inject_schedule(self, faults: list[Fault], rng: random.Random) -> dict[str, int]:
        """Run ``faults`` at their times (measured from now); returns counts injected."""
        counts: dict[str, int] = {}
        origin = time.monotonic()
        idle = threading.Event()  # never set: a bounded wait between scheduled faults
        for fault in faults:
            idle.wait(max(0.0, origin + fault.start_s - time.monotonic()))
            nemesis = self.nemeses[fault.kind]
            self.record(nemesis.inject(rng))
            counts[fault.kind] = counts.get(fault.kind, 0) + 1
            idle.wait(fault.duration_s)
            self.record(nemesis.heal())
        idle.wait(max(0.0, origin + self.config.duration_s - time.monotonic()))
        return counts

    def heal_all(self) -> None:
        for nemesis in self.nemeses.values():
            self.record(nemesis.heal())

    def close(self) -> None:
        try:
            if self.node is not None:
                self.node.kill()
        finally:
            if self.namespace is not None:
                self.namespace.remove()

    def save(self, destination: Path) -> Path:
        destination.mkdir(parents=True, exist_ok=True)
        dump(self.history.ops(), destination / "history.jsonl")
        (destination / "config.json").write_text(json.dumps(
            {"seed": self.config.seed, "nemeses": list(self.config.nemeses),
             "workload": self.config.workload, "duration_s": self.config.duration_s,
             "flush_every_record": self.config.flush_every_record,
             "replay": self.config.replay_command()}, indent=1) + "\n")
        if self.node is not None and self.node.log_path.exists():
            shutil.copy(self.node.log_path, destination / self.node.log_path.name)
        return destination


def durations_of(nemeses: dict[str, Nemesis]) -> dict[str, tuple[float, float]]:
    return {kind: (n.min_duration_s, n.max_duration_s) for kind, n in nemeses.items()}


def unavailable_s(ops, f: str) -> float:
    """Sum of the gaps longer than ``UNAVAILABLE_GAP_S`` between successive acknowledged
    ``f`` operations, from the first invocation to the last (all of it when none was
    acknowledged)."""
    times = sorted([op.time_ns for op in ops if op.f == f and op.type == OK])
    invoked = [op.time_ns for op in ops if op.f == f and op.type == INVOKE]
    if not invoked:
        return 0.0
    edges = sorted([min(invoked), *times, max(invoked)])
    gaps = (b - a for a, b in zip(edges, edges[1:], strict=False))
    return sum(gap for gap in gaps if gap > UNAVAILABLE_GAP_S * 1e9) / 1e9


def _workload(config: RunConfig, run: _Run) -> Workload:
    loss_allowed = not config.flush_every_record
    if config.workload == "queue":
        return QueueWorkload(run.node.bootstrap, run.history, run.namespace,
                             QueueConfig(session_timeout_ms=SESSION_TIMEOUT_MS), loss_allowed)
    return ListAppendWorkload(run.node.bootstrap, run.history, run.namespace,
                              unsynced_loss_allowed=loss_allowed)


def run(config: RunConfig, work_dir: Path, failures_dir: Path | None = None) -> RunResult:
    """One run in ``work_dir`` (made fresh); when the check fails, history, config and broker
    log are saved under ``failures_dir`` (default ``work_dir/failed``)."""
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    current = _Run(config, work_dir)
    errors: list[str] = []
    faults: dict[str, int] = {}
    workload: Workload | None = None
    try:
        current.open()
        workload = _workload(config, current)
        workload.setup()
        workload.start()
        try:
            faults = current.inject_schedule(
                schedule(config, durations_of(current.nemeses)),
                random.Random(config.seed ^ 0x5EED))
        finally:
            current.heal_all()
            workload.stop()
        workload.final_reads()
        errors += workload.thread_errors
    except Exception as error:  # noqa: BLE001 -- a run that cannot finish is a finding
        errors.append(f"{type(error).__name__}: {error}")
    finally:
        current.close()
    ops = current.history.ops()
    result = _judge(config, workload, ops, faults, errors)
    if not result.valid:
        result.saved_to = current.save((failures_dir or work_dir / "failed")
                                       / f"seed-{config.seed}")
    return result


def _judge(config: RunConfig, workload: Workload | None, ops, faults, errors) -> RunResult:
    write = "send" if config.workload == "queue" else "append"
    if workload is None:
        return RunResult(config, faults, {}, 0, errors=errors)
    checked = workload.check(ops)
    return RunResult(config, faults, checked.counts(), checked.acked,
                     truncated=checked.truncated,
                     duplicated_non_idempotent=getattr(checked, "duplicated_non_idempotent", 0),
                     unavailable_s=unavailable_s(ops, write), errors=errors,
                     examples=checked.examples())
