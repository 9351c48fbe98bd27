"""The queue checker: what a history of sends and polls of unique values shows went wrong.

Input: a history (``headrace.faults.history``) of ``send`` operations (a unique value to a
partition; ``ok`` carries its offset), ``poll`` completions (records ``[partition, offset,
value]``) of consumer processes, ``assign`` info operations (a consumer's assignment changed:
its position may legitimately move), and the ``poll``s of the final drain (process
``"drain"``, which reads every partition from its start after the faults are healed).

Anomalies, as Jepsen's Kafka checker names them:
- ``lost``: acknowledged sends the final drain never read;
- ``duplicated``: values read at more than one offset (from idempotent producers: an
  anomaly; from the ``non_idempotent_processes``: ``duplicated_non_idempotent``, counted
  only, since a retry without idempotence may write twice);
- ``inconsistent``: two different values seen at one partition offset, across consumers,
  the drain and acknowledgements;
- ``nonmonotonic``: a consumer's polls of a partition going back to or below an offset it
  already polled, with no assignment change in between;
- ``skipped``: a consumer's successive polls of a partition jumping over an offset that holds
  a record.

With ``unsynced_loss_allowed`` (a power cut under a flush policy that does not sync every
record), acknowledged values a cut dropped as a suffix are ``truncated``, not lost; reads
made before a cut of records the cut then dropped are set aside; and every consumer's
position tracking restarts at each cut. A hole (a dropped value below a surviving one of
the same span between cuts) is still ``lost``.

Thread-safety: a pure function.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from headrace.faults.checkers import CheckResult, epoch_of, truncation_excuses
from headrace.faults.history import INFO, INVOKE, OK, Op, power_cut_times_ns

DRAIN_PROCESS = "drain"
ANOMALY_KINDS = ("lost", "duplicated", "inconsistent", "nonmonotonic", "skipped")


@dataclass(frozen=True)
class QueueExpectations:
    non_idempotent_processes: frozenset[str] = frozenset()
    unsynced_loss_allowed: bool = False


@dataclass
class QueueResult(CheckResult):
    ANOMALY_KINDS = ANOMALY_KINDS
    read: int = 0
    duplicated_non_idempotent: int = 0


@dataclass(frozen=True, slots=True)
class _Read:
    process: str
    time_ns: int
    partition: int
    offset: int
    value: str


def check(ops: list[Op], expectations: QueueExpectations = QueueExpectations()) -> QueueResult:
    cuts = power_cut_times_ns(ops) if expectations.unsynced_loss_allowed else []
    acked = {op.value: (op.partition, op.offset, op.time_ns)
             for op in ops if op.f == "send" and op.type == OK}
    senders = {op.value: op.process for op in ops if op.f == "send" and op.type == INVOKE}
    reads = [_Read(op.process, op.time_ns, partition, offset, value)
             for op in ops if op.f == "poll" and op.type == OK
             for partition, offset, value in op.value]
    drained = {(r.partition, r.offset): r.value for r in reads if r.process == DRAIN_PROCESS}
    result = QueueResult(acked=len(acked), read=len({r.value for r in reads}))
    lost = sorted(set(acked) - set(drained.values()))
    excused = truncation_excuses(acked, lost, cuts)
    result.truncated = len(excused)
    result.anomalies["lost"] = [value for value in lost if value not in excused]
    surviving = [r for r in reads
                 if epoch_of(r.time_ns, cuts) == len(cuts)
                 or drained.get((r.partition, r.offset)) == r.value]
    _find_duplicates(surviving, senders, expectations, result)
    _find_inconsistent(surviving, acked, excused, result)
    _find_position_anomalies(ops, surviving, drained, cuts, result)
    return result


def _find_duplicates(reads: list[_Read], senders: dict[str, str],
                     expectations: QueueExpectations, result: QueueResult) -> None:
    offsets_of: dict[str, set[tuple[int, int]]] = defaultdict(set)
    for read in reads:
        offsets_of[read.value].add((read.partition, read.offset))
    for value, offsets in sorted(offsets_of.items()):
        if len(offsets) < 2:
            continue
        if senders.get(value) in expectations.non_idempotent_processes:
            result.duplicated_non_idempotent += 1
        else:
            result.anomalies["duplicated"].append({"value": value, "at": sorted(offsets)})


def _find_inconsistent(reads: list[_Read], acked: dict, excused: set[str],
                       result: QueueResult) -> None:
    values_at: dict[tuple[int, int], set[str]] = defaultdict(set)
    for read in reads:
        values_at[read.partition, read.offset].add(read.value)
    for value, (partition, offset, _) in acked.items():
        if value not in excused:
            values_at[partition, offset].add(value)
    for (partition, offset), values in sorted(values_at.items()):
        if len(values) > 1:
            result.anomalies["inconsistent"].append(
                {"partition": partition, "offset": offset, "values": sorted(values)})


def _find_position_anomalies(ops: list[Op], reads: list[_Read], drained: dict,
                             cuts: list[int], result: QueueResult) -> None:
    """Walk each consumer's polls in order, tracking its last offset per partition."""
    occupied: dict[int, set[int]] = defaultdict(set)
    for partition, offset in drained:
        occupied[partition].add(offset)
    for read in reads:
        occupied[read.partition].add(read.offset)
    assignment_changes = [(op.process, op.time_ns) for op in ops
                          if op.f == "assign" and op.type in (INFO, OK)]
    last_offset: dict[tuple[str, int], tuple[int, int]] = {}  # -> (offset, epoch of reset)
    resets: dict[str, int] = defaultdict(int)
    change_index = 0
    for read in sorted(reads, key=lambda r: r.time_ns):
        while (change_index < len(assignment_changes)
               and assignment_changes[change_index][1] <= read.time_ns):
            resets[assignment_changes[change_index][0]] += 1
            change_index += 1
        era = (resets[read.process], epoch_of(read.time_ns, cuts))
        key = (read.process, read.partition)
        previous = last_offset.get(key)
        last_offset[key] = (read.offset, era)
        if previous is None or previous[1] != era:
            continue
        previous_offset = previous[0]
        where = {"process": read.process, "partition": read.partition,
                 "from": previous_offset, "to": read.offset}
        if read.offset <= previous_offset:
            result.anomalies["nonmonotonic"].append(where)
        elif any(o in occupied[read.partition]
                 for o in range(previous_offset + 1, read.offset)):
            result.anomalies["skipped"].append(where)
