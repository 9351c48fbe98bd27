"""The list-append checker: each partition is a list; appends add to it, reads return all of it.

Input: a history of ``append`` operations (a unique value to a partition; ``ok`` carries the
offset it got) and ``read`` completions (the partition; ``ok`` carries ``[[offset, value],
...]``, the whole partition from its start). The last read of each partition is taken after
the faults are healed.

Anomalies:
- ``lost``: an acknowledged append missing from a read invoked after the acknowledgement;
- ``duplicated``: a value twice in one read;
- ``inconsistent``: a read holding another value at the offset an append was acknowledged at;
- ``divergent``: two reads of a partition neither of which is a prefix of the other;
- ``skipped``: a read whose offsets are not consecutive (a gap inside the list).

With ``unsynced_loss_allowed`` (a power cut under a periodic flush policy), an acknowledged
value a cut dropped as a suffix of its span between cuts (``checkers.truncation_excuses``,
judged by the last read) is ``truncated``, and comparisons across a cut set aside what the cut
dropped: a read before it may extend past what survived, and appends it dropped may be
missing from, or replaced in, later reads.

Thread-safety: a pure function.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from headrace.faults.checkers import CheckResult, epoch_of, truncation_excuses
from headrace.faults.history import INVOKE, OK, Op, power_cut_times_ns

ANOMALY_KINDS = ("lost", "duplicated", "inconsistent", "divergent", "skipped")


@dataclass(frozen=True)
class ListAppendExpectations:
    unsynced_loss_allowed: bool = False


@dataclass
class ListAppendResult(CheckResult):
    ANOMALY_KINDS = ANOMALY_KINDS
    reads: int = 0


@dataclass(frozen=True)
class _Read:
    partition: int
    invoked_ns: int
    completed_ns: int
    entries: list[tuple[int, str]]


def check(ops: list[Op],
          expectations: ListAppendExpectations = ListAppendExpectations()) -> ListAppendResult:
    cuts = power_cut_times_ns(ops) if expectations.unsynced_loss_allowed else []
    acked = {op.value: (op.partition, op.offset, op.time_ns)
             for op in ops if op.f == "append" and op.type == OK}
    reads = _reads(ops)
    result = ListAppendResult(acked=len(acked), reads=len(reads))
    last_values: dict[int, set[str]] = defaultdict(set)
    for read in reads:
        last_values[read.partition] = {value for _, value in read.entries}
    dropped = [value for value, (partition, _, _) in acked.items()
               if value not in last_values[partition]]
    excused = truncation_excuses(acked, dropped, cuts)
    result.truncated = len(excused)
    for read in reads:
        _check_one_read(read, acked, excused, cuts, result)
    by_partition: dict[int, list[_Read]] = defaultdict(list)
    for read in reads:
        by_partition[read.partition].append(read)
    for partition_reads in by_partition.values():
        _find_divergent(partition_reads, cuts, result)
    return result


def _reads(ops: list[Op]) -> list[_Read]:
    invoked: dict[str, int] = {}
    reads = []
    for op in ops:
        if op.f != "read":
            continue
        if op.type == INVOKE:
            invoked[op.process] = op.time_ns
        elif op.type == OK:
            entries = [(offset, value) for offset, value in op.value]
            reads.append(_Read(op.partition, invoked.get(op.process, op.time_ns), op.time_ns,
                               entries))
    return reads


def _check_one_read(read: _Read, acked: dict, excused: set[str], cuts: list[int],
                    result: ListAppendResult) -> None:
    at_offset = dict(read.entries)
    seen: set[str] = set()
    for position, (offset, value) in enumerate(read.entries):
        if value in seen:
            result.anomalies["duplicated"].append({"partition": read.partition, "value": value})
        seen.add(value)
        if position and offset != read.entries[position - 1][0] + 1:
            result.anomalies["skipped"].append(
                {"partition": read.partition, "from": read.entries[position - 1][0],
                 "to": offset})
    for value, (partition, offset, ok_ns) in acked.items():
        if partition != read.partition or ok_ns >= read.invoked_ns:
            continue
        dropped_by_cut = value in excused and epoch_of(ok_ns, cuts) < epoch_of(
            read.invoked_ns, cuts)
        if value not in seen and not dropped_by_cut:
            result.anomalies["lost"].append({"partition": partition, "value": value})
        elif offset in at_offset and at_offset[offset] != value and not dropped_by_cut:
            result.anomalies["inconsistent"].append(
                {"partition": partition, "offset": offset, "acked": value,
                 "read": at_offset[offset]})


def _find_divergent(reads: list[_Read], cuts: list[int], result: ListAppendResult) -> None:
    """Compare each read, in invocation order, with the longest read before it: reads that
    each agree with a longer one agree with each other. Across a cut, the longer read's
    values from the first difference on may all be gone from the partition's last read (the
    cut dropped them); the later read then starts the new longest."""
    ordered = sorted(reads, key=lambda r: r.invoked_ns)
    surviving = {value for _, value in ordered[-1].entries} if ordered else set()
    longest: _Read | None = None
    for read in ordered:
        if longest is not None:
            difference = _first_difference(longest, read)
            if difference is not None:
                across_cut = epoch_of(longest.completed_ns, cuts) < epoch_of(read.invoked_ns,
                                                                               cuts)
                dropped = {value for _, value in longest.entries[difference:]}
                if not (across_cut and not dropped & surviving):
                    result.anomalies["divergent"].append(
                        {"partition": read.partition, "offset": read.entries[difference][0],
                         "earlier": longest.entries[difference][1],
                         "later": read.entries[difference][1]})
                longest = read
                continue
        if longest is None or len(read.entries) > len(longest.entries):
            longest = read


def _first_difference(one: _Read, other: _Read) -> int | None:
    common = min(len(one.entries), len(other.entries))
    return next((i for i in range(common) if one.entries[i][1] != other.entries[i][1]), None)
