"""The transactional checker: aborted reads (G1a), circular information flow (G1c), and lost
committed writes, from a history of transactions and read_committed polls.

Input operations:

- ``txn`` (one per transaction, by a transactional producer): ``ok`` when its commit was
  acknowledged, ``fail`` when the workload aborted it (certainly not committed), ``info``
  when the outcome is unknown. The completion's value is ``{"sends": [[partition, value,
  offset], ...], "reads": [[partition, offset, value], ...]}``: what it produced (offset
  null when not known) and what its consumer read inside it.
- ``poll`` (``ok``): ``[[partition, offset, value], ...]`` a read_committed consumer returned,
  outside any transaction (the final drain among them).

Anomalies:

- ``g1a``: a value written only by an aborted transaction was read (by a poll or by a
  transaction): Adya's aborted read.
- ``g1c``: a cycle of committed transactions in the graph of write-write edges (T1 -> T2
  when, in one partition, every value of T1 precedes every value of T2 in offset order, as any
  read or acknowledgement placed them, and T1 completed before T2 was invoked) and
  write-read edges (T1 -> T2 when T2 read a value T1 wrote); each strongly connected
  component of two or more transactions is one anomaly, reported as the transactions'
  indexes (their ``txn`` completions). Kafka orders concurrent transactions in each
  partition by their appends, so two transactions open at once may be ordered one way in one
  partition and the other way in another (a write cycle Kafka allows): write-write edges
  between transactions open at once are left out. A transaction reads before it is invoked
  (the workload polls, then begins it), so every edge goes forward in invocation order, and
  a cycle means a transaction read a value of one invoked after it, directly or by a chain.
- ``lost``: a value of a committed transaction that the drain (process ``drain``) did not
  read.

Values are unique across the run, so a value names the transaction that wrote it.
Thread-safety: a pure function.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass

from headrace.faults.checkers import CheckResult
from headrace.faults.checkers.queue import DRAIN_PROCESS
from headrace.faults.history import FAIL, INVOKE, OK, Op

ANOMALY_KINDS = ("g1a", "g1c", "lost")


@dataclass
class TransactionsResult(CheckResult):
    ANOMALY_KINDS = ANOMALY_KINDS
    committed: int = 0
    aborted: int = 0


@dataclass(frozen=True)
class _Observations:
    """Every (partition, offset, value) seen, and what each reader read."""

    placed: dict[tuple[int, int], set[str]]
    reads: list[tuple[Op, list]]


def check(ops: list[Op]) -> TransactionsResult:
    transactions = [op for op in ops if op.f == "txn" and op.type in (OK, FAIL, "info")]
    writer = {}
    for txn in transactions:
        for _, value, _ in txn.value["sends"]:
            writer[value] = txn
    committed = [txn for txn in transactions if txn.type == OK]
    result = TransactionsResult(acked=sum(len(t.value["sends"]) for t in committed),
                                committed=len(committed),
                                aborted=sum(t.type == FAIL for t in transactions))
    observed = _observations(ops, transactions)
    result.anomalies["g1a"] = _aborted_reads(observed, writer)
    result.anomalies["g1c"] = _cycles(ops, committed, writer, observed)
    result.anomalies["lost"] = _lost(ops, committed)
    return result


def _observations(ops: list[Op], transactions: list[Op]) -> _Observations:
    placed: dict[tuple[int, int], set[str]] = defaultdict(set)
    reads = []
    for op in ops:
        if op.f == "poll" and op.type == OK:
            reads.append((op, op.value))
    for txn in transactions:
        reads.append((txn, txn.value.get("reads", [])))
        if txn.type == OK:
            for partition, value, offset in txn.value["sends"]:
                if offset is not None:
                    placed[partition, offset].add(value)
    for _, records in reads:
        for partition, offset, value in records:
            placed[partition, offset].add(value)
    return _Observations(placed, reads)


def _aborted_reads(observed: _Observations, writer: dict[str, Op]) -> list[dict]:
    found = []
    for reader, records in observed.reads:
        for partition, offset, value in records:
            source = writer.get(value)
            if source is not None and source.type == FAIL:
                found.append({"reader": reader.process, "index": reader.index,
                              "partition": partition, "offset": offset, "value": value,
                              "aborted_txn": source.index})
    return found


def _times(ops: list[Op], committed: list[Op]) -> tuple[dict[int, int], dict[int, int]]:
    """When each committed transaction (by completion index) was invoked and completed."""
    wanted = {txn.index for txn in committed}
    invoked, last_invoke_ns = {}, {}
    for op in ops:
        if op.f != "txn":
            continue
        if op.type == INVOKE:
            last_invoke_ns[op.process] = op.time_ns
        elif op.index in wanted:
            invoked[op.index] = last_invoke_ns.get(op.process, op.time_ns)
    return invoked, {txn.index: txn.time_ns for txn in committed}


def _cycles(ops: list[Op], committed: list[Op], writer: dict[str, Op],
            observed: _Observations) -> list[list[int]]:
    members = {txn.index for txn in committed}
    edges: dict[int, set[int]] = defaultdict(set)
    spans: dict[int, dict[int, list[int]]] = defaultdict(dict)  # partition -> txn -> [lo, hi]
    for (partition, offset), values in observed.placed.items():
        for value in values:
            txn = writer.get(value)
            if txn is not None and txn.index in members:
                span = spans[partition].setdefault(txn.index, [offset, offset])
                span[0], span[1] = min(span[0], offset), max(span[1], offset)
    invoked_ns, completed_ns = _times(ops, committed)
    for partition_spans in spans.values():
        _add_write_order(partition_spans, invoked_ns, completed_ns, edges)
    for reader, records in observed.reads:
        if reader.f != "txn" or reader.index not in members:
            continue
        for _, _, value in records:
            txn = writer.get(value)
            if txn is not None and txn.index in members and txn.index != reader.index:
                edges[txn.index].add(reader.index)
    return [sorted(component) for component in _strongly_connected(members, edges)
            if len(component) > 1]


def _add_write_order(spans: dict[int, list[int]], invoked_ns: dict[int, int],
                     completed_ns: dict[int, int], edges: dict[int, set[int]]) -> None:
    """Edges T1 -> T2 where every value of T1 precedes every value of T2 in the partition and
    T1 completed before T2 was invoked."""
    ordered = sorted((low, high, txn) for txn, (low, high) in spans.items())
    lows = [low for low, _, _ in ordered]
    for _, high, txn in ordered:
        for _, _, later in ordered[bisect.bisect_right(lows, high):]:
            if completed_ns[txn] < invoked_ns[later]:
                edges[txn].add(later)


def _strongly_connected(nodes: set[int], edges: dict[int, set[int]]) -> list[list[int]]:
    """Tarjan's strongly connected components, iteratively (no recursion limit)."""
    index_of: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    components = []
    counter = 0
    for root in sorted(nodes):
        if root in index_of:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index_of[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for successor in successors:
                if successor not in index_of:
                    index_of[successor] = low[successor] = counter
                    counter += 1
                    stack.append(successor)
                    on_stack.add(successor)
                    work.append((successor, iter(sorted(edges[successor]))))
                    advanced = True
                    break
                if successor in on_stack:
                    low[node] = min(low[node], index_of[successor])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index_of[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return components


def _lost(ops: list[Op], committed: list[Op]) -> list[dict]:
    drained = {value for op in ops if op.f == "poll" and op.type == OK
               and op.process == DRAIN_PROCESS for _, _, value in op.value}
    return [{"partition": partition, "value": value, "txn": txn.index}
            for txn in committed for partition, value, _ in txn.value["sends"]
            if value not in drained]
