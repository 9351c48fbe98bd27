"""One fault run: a seeded schedule of faults against a target under a workload, then a check.

Targets (``RunConfig.target``):

- ``node``: ``run(RunConfig, work_dir)`` starts one broker (``BrokerNode``; inside a fresh
  network namespace on 127.0.0.2 when a ``partition`` nemesis is asked for, under the
  power-cut shim for ``power``, with a skewable clock for ``clock``), and injects faults one
  after another (``sequential_schedule``): each of a kind drawn from the configured nemeses
  (``NEMESIS_KINDS``), lasting a seeded time, with seeded gaps, until ``duration_s``.
- ``cluster``: three ZooKeeper nodes and three brokers (RF=3, min.insync.replicas=2; clients
  send with acks=all) in a namespace (``cluster.FaultCluster``), with the cluster's nemeses
  (``nemesis.cluster``) overlapping (``overlapping_schedule``: each kind once, in a seeded
  order, before any kind repeats; starts a seeded 1-5 s apart; a kind never twice at once).

Then the run creates the workload's topic, starts its clients, injects the faults (each
action at its time; an action that takes long, such as a restart waiting for a registration
to expire, delays the later ones), heals every nemesis, measures ``recovery_s`` (clients still
writing: seconds from healing until every partition acknowledged a write again; a run not back
within ``RECOVERY_LIMIT_S`` is invalid), stops the clients, runs the workload's final reads,
and its checker judges the history. Everything started is removed in ``finally``: nodes by
pid, rules by id, the namespace by name.

The flush policy is the run's: ``flush_every_record`` sets log.flush.interval.messages=1, and
only then must a power cut keep every acknowledged record; otherwise the checker allows a cut
to drop an acknowledged suffix (never a hole). A SIGKILL keeps the page cache: nothing
acknowledged may be lost to it under either policy.

Workloads: ``queue``, ``list-append``, and ``transactional`` (G1a / G1c; one-node target: the
transaction coordinator is single-node).

Result: ``RunResult.summary()``, the JSON line ``bench/faults.py`` prints: seed, target,
workload, nemeses, flush, ``faults`` (kind -> count injected), acked, lost, duplicated,
inconsistent, nonmonotonic, skipped, divergent, g1a, g1c, truncated,
duplicated_non_idempotent, unavailable_s (the sum of gaps longer than ``UNAVAILABLE_GAP_S``
between successive acknowledgements while the clients wrote), recovery_s, judged (false when
the run ended before its final reads: then no anomaly is counted), valid, and, when
invalid, the directory the history and node logs were saved to and the command that replays
the seed. The schedule replays exactly; the interleaving of clients and faults does not
(threads and real processes).

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

from headrace.faults.cluster import BROKER_HOSTS, ZOOKEEPER_HOSTS, FaultCluster
from headrace.faults.history import INFO, INVOKE, NEMESIS, OK, History, dump
from headrace.faults.namespace import Namespace
from headrace.faults.nemesis import Action, Nemesis
from headrace.faults.nemesis.clock import ClockNemesis
from headrace.faults.nemesis.cluster import CLUSTER_NEMESIS_KINDS, cluster_nemeses
from headrace.faults.nemesis.network import PartitionNemesis
from headrace.faults.nemesis.power import PowerNemesis
from headrace.faults.nemesis.process import KillNemesis, PauseNemesis
from headrace.faults.node import BrokerNode, free_port
from headrace.faults.power_cut import build_shim
from headrace.faults.workloads import Workload
from headrace.faults.workloads.list_append import ListAppendWorkload
from headrace.faults.workloads.queue import QueueConfig, QueueWorkload
from headrace.faults.workloads.transactional import TransactionalConfig, TransactionalWorkload

NEMESIS_KINDS = ("kill", "pause", "clock", "power", "partition")
TARGETS = ("node", "cluster")
KINDS_OF_TARGET = {"node": NEMESIS_KINDS, "cluster": CLUSTER_NEMESIS_KINDS}
WORKLOADS = ("queue", "list-append", "transactional")
# The transaction coordinator is single-node: transactions run against one broker only.
WORKLOADS_OF_TARGET = {"node": WORKLOADS, "cluster": ("queue", "list-append")}
BROKER_HOST = "127.0.0.2"
CLIENT_HOST = "127.0.0.1"
UNAVAILABLE_GAP_S = 1.0
FIRST_FAULT_AFTER_S = (1.0, 2.0)
GAP_BETWEEN_FAULTS_S = (0.5, 2.0)
GAP_BETWEEN_OVERLAPPING_STARTS_S = (1.0, 5.0)
RECOVERY_LIMIT_S = 30.0
RECOVERY_POLL_S = 0.1
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
    target: str = "node"

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {TARGETS}")
        kinds = KINDS_OF_TARGET[self.target]
        unknown = set(self.nemeses) - set(kinds)
        if unknown or not self.nemeses:
            raise ValueError(f"nemeses of target {self.target} must be among {kinds}, "
                             f"not {sorted(unknown)}")
        if self.workload not in WORKLOADS_OF_TARGET[self.target]:
            raise ValueError(f"workload of target {self.target} must be one of "
                             f"{WORKLOADS_OF_TARGET[self.target]}")

    def replay_command(self) -> str:
        flags = [f"--seed {self.seed}", "--runs 1", f"--target {self.target}",
                 f"--nemesis {','.join(self.nemeses)}",
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
    """The run's faults: one after another for one node, overlapping for the cluster."""
    if config.target == "cluster":
        return overlapping_schedule(config, durations)
    return sequential_schedule(config, durations)


def sequential_schedule(config: RunConfig, durations: dict[str, tuple[float, float]]
                        ) -> list[Fault]:
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


def overlapping_schedule(config: RunConfig, durations: dict[str, tuple[float, float]]
                         ) -> list[Fault]:
    """Faults from the seed whose starts are ``GAP_BETWEEN_OVERLAPPING_STARTS_S`` apart, so
    that they overlap: each kind once (in a seeded order) before any kind repeats, and a kind
    never twice at once (a start waits for its kind's previous fault to end when every kind is
    in effect). The last one starts before ``duration_s``."""
    rng = random.Random(config.seed)
    first_round = rng.sample(config.nemeses, len(config.nemeses))
    faults: list[Fault] = []
    ends_s: dict[str, float] = {}
    start_s = rng.uniform(*FIRST_FAULT_AFTER_S)
    while start_s < config.duration_s:
        idle = [kind for kind in config.nemeses if ends_s.get(kind, 0.0) <= start_s]
        if not idle:
            start_s = min(ends_s.values())
            continue
        unused = [kind for kind in first_round if kind in idle]
        kind = unused[0] if unused else rng.choice(idle)
        if unused:
            first_round.remove(kind)
        length_s = rng.uniform(*durations[kind])
        faults.append(Fault(kind, round(start_s, 3), round(length_s, 3)))
        ends_s[kind] = start_s + length_s
        start_s += rng.uniform(*GAP_BETWEEN_OVERLAPPING_STARTS_S)
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
    recovery_s: float | None = None
    judged: bool = True  # False: the run ended before its final reads; no anomaly counted
    errors: list[str] = field(default_factory=list)
    examples: dict[str, list] = field(default_factory=dict)
    saved_to: Path | None = None

    @property
    def valid(self) -> bool:
        return not any(self.counts.values()) and not self.errors

    def summary(self) -> dict:
        line = {"seed": self.config.seed, "target": self.config.target,
                "workload": self.config.workload,
                "nemeses": list(self.config.nemeses),
                "flush": "every-record" if self.config.flush_every_record else "default",
                "faults": self.faults, "acked": self.acked,
                **{kind: self.counts.get(kind, 0) for kind in (
                    "lost", "duplicated", "inconsistent", "nonmonotonic", "skipped",
                    "divergent", "g1a", "g1c")},
                "truncated": self.truncated,
                "duplicated_non_idempotent": self.duplicated_non_idempotent,
                "unavailable_s": round(self.unavailable_s, 3),
                "recovery_s": None if self.recovery_s is None else round(self.recovery_s, 3),
                "judged": self.judged, "valid": self.valid}
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
        self.cluster: FaultCluster | None = None
        self.nemeses: dict[str, Nemesis] = {}

    @property
    def bootstrap(self) -> str:
        return self.cluster.bootstrap if self.cluster is not None else self.node.bootstrap

    def open(self) -> None:
        if self.config.target == "cluster":
            self._open_cluster()
        else:
            self._open_node()

    def _open_cluster(self) -> None:
        self.namespace = Namespace()
        self.namespace.create([CLIENT_HOST, *BROKER_HOSTS.values(), *ZOOKEEPER_HOSTS.values()])
        overrides = {"log.flush.interval.messages": "1"} if self.config.flush_every_record else {}
        shim = build_shim(self.work_dir / "shim") if "power" in self.config.nemeses else None
        self.cluster = FaultCluster(self.work_dir, self.namespace, overrides, shim,
                                    ".log" if self.config.drop_segment_fsyncs else "")
        self.cluster.start()

    def arm(self, topic: str, partitions: int) -> None:
        """Make the nemeses (the cluster's find the leaders of ``topic``'s partitions)."""
        if self.cluster is not None:
            self.nemeses = cluster_nemeses(self.config.nemeses, self.cluster, topic, partitions)
        else:
            self.nemeses = {kind: self._nemesis(kind) for kind in self.config.nemeses}

    def _open_node(self) -> None:
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
        """Inject and heal ``faults`` at their times (measured from now; an action that takes
        long, such as a restart, delays the later ones); returns counts injected."""
        counts: dict[str, int] = {}
        origin = time.monotonic()
        idle = threading.Event()  # never set: a bounded wait between scheduled actions
        events = sorted([(f.start_s, 1, "inject", f) for f in faults]
                        + [(f.start_s + f.duration_s, 0, "heal", f) for f in faults],
                        key=lambda event: event[:2])
        for at_s, _, action, fault in events:
            idle.wait(max(0.0, origin + at_s - time.monotonic()))
            nemesis = self.nemeses[fault.kind]
            if action == "inject":
                self.record(nemesis.inject(rng))
                counts[fault.kind] = counts.get(fault.kind, 0) + 1
            else:
                self.record(nemesis.heal())
            self.retry_put_off_restarts()
        idle.wait(max(0.0, origin + self.config.duration_s - time.monotonic()))
        return counts

    def retry_put_off_restarts(self) -> None:
        """One more try at each broker restart put off (cluster target)."""
        if self.cluster is None:
            return
        for broker_id in sorted(self.cluster.pending_restarts):
            if self.cluster.restart_broker(broker_id):
                broker = self.cluster.brokers[broker_id]
                self.record(Action("restart", {"node": broker.name, "pid": broker.pid}))

    def heal_all(self) -> None:
        for nemesis in self.nemeses.values():
            self.record(nemesis.heal())
        if self.cluster is not None and self.cluster.pending_restarts:
            put_off = sorted(self.cluster.pending_restarts)
            self.cluster.restart_pending()
            self.record(Action("restart", {"brokers put off": put_off}))

    def close(self) -> None:
        try:
            if self.node is not None:
                self.node.kill()
            if self.cluster is not None:
                self.cluster.close()
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
             "target": self.config.target,
             "replay": self.config.replay_command()}, indent=1) + "\n")
        nodes = self.cluster.nodes() if self.cluster is not None else [self.node]
        for node in nodes:
            if node is not None and node.log_path.exists():
                shutil.copy(node.log_path, destination / f"{node.name}.log")
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


def recovery_s(history: History, f: str, partitions: int, healed_ns: int,
               limit_s: float = RECOVERY_LIMIT_S) -> float | None:
    """Seconds from ``healed_ns`` until every partition acknowledged an ``f`` again, waiting
    (bounded by ``limit_s``) while the clients keep writing; None when one did not in time."""
    deadline = time.monotonic() + limit_s
    idle = threading.Event()  # never set: a bounded wait between looks at the history
    while True:
        first_ok_ns: dict[int, int] = {}
        for op in history.ops():
            if op.f == f and op.type == OK and op.time_ns >= healed_ns:
                first_ok_ns.setdefault(op.partition, op.time_ns)
        if len(first_ok_ns) >= partitions:
            return (max(first_ok_ns.values()) - healed_ns) / 1e9
        if time.monotonic() > deadline:
            return None
        idle.wait(RECOVERY_POLL_S)


def _workload(config: RunConfig, run: _Run) -> Workload:
    loss_allowed = not config.flush_every_record
    if config.workload == "queue":
        return QueueWorkload(run.bootstrap, run.history, run.namespace,
                             QueueConfig(session_timeout_ms=SESSION_TIMEOUT_MS), loss_allowed)
    if config.workload == "transactional":
        return TransactionalWorkload(run.bootstrap, run.history, run.namespace,
                                     TransactionalConfig(seed=config.seed))
    return ListAppendWorkload(run.bootstrap, run.history, run.namespace,
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
    recovered_s: float | None = None
    final_reads_done = False
    try:
        current.open()
        workload = _workload(config, current)
        current.arm(workload.config.topic, workload.config.partitions)
        workload.setup()
        workload.start()
        try:
            faults = current.inject_schedule(
                schedule(config, durations_of(current.nemeses)),
                random.Random(config.seed ^ 0x5EED))
        finally:
            try:
                current.heal_all()
                healed = current.history.record(INFO, NEMESIS, "healed")
                recovered_s = recovery_s(current.history, _write_f(config),
                                         _write_keys(config, workload), healed.time_ns)
                if current.cluster is not None:
                    current.cluster.wait_until_whole()
            finally:
                workload.stop()
        if recovered_s is None:
            errors.append(f"not back to full availability within {RECOVERY_LIMIT_S:g} s of "
                          "healing: a partition acknowledged no write")
        workload.final_reads()
        final_reads_done = True
        errors += workload.thread_errors
    except Exception as error:  # noqa: BLE001 -- a run that cannot finish is a finding
        errors.append(f"{type(error).__name__}: {error}")
    finally:
        current.close()
    ops = current.history.ops()
    # Without the final reads, every acknowledged write would count as lost: not judged.
    result = _judge(config, workload if final_reads_done else None, ops, faults, errors)
    result.recovery_s = recovered_s
    if not result.valid:
        result.saved_to = current.save((failures_dir or work_dir / "failed")
                                       / f"seed-{config.seed}")
    return result


def _write_f(config: RunConfig) -> str:
    return {"queue": "send", "list-append": "append", "transactional": "txn"}[config.workload]


def _write_keys(config: RunConfig, workload: Workload) -> int:
    """How many partitions must acknowledge a write again (a transaction names none: one)."""
    return 1 if config.workload == "transactional" else workload.config.partitions


def _judge(config: RunConfig, workload: Workload | None, ops, faults, errors) -> RunResult:
    write = _write_f(config)
    if workload is None:
        return RunResult(config, faults, {}, 0, errors=errors, judged=False)
    checked = workload.check(ops)
    return RunResult(config, faults, checked.counts(), checked.acked,
                     truncated=checked.truncated,
                     duplicated_non_idempotent=getattr(checked, "duplicated_non_idempotent", 0),
                     unavailable_s=unavailable_s(ops, write), errors=errors,
                     examples=checked.examples())
