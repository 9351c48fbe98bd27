"""Checkers: pure functions from a history (``headrace.faults.history``) to the anomalies in it.

Shared here: ``CheckResult`` (anomalies by kind, counts, a few examples each) and the rule
for writes a power cut may drop (``truncation_excuses``).
Thread-safety: pure functions.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

EXAMPLES_PER_ANOMALY = 5


@dataclass
class CheckResult:
    """What a checker found: ``anomalies`` maps each of the checker's ``ANOMALY_KINDS`` to
    the instances found (empty lists when the history is valid)."""

    ANOMALY_KINDS: ClassVar[tuple[str, ...]] = ()
    acked: int = 0
    truncated: int = 0
    anomalies: dict[str, list] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for kind in self.ANOMALY_KINDS:
            self.anomalies.setdefault(kind, [])

    @property
    def valid(self) -> bool:
        return not any(self.anomalies.values())

    def counts(self) -> dict[str, int]:
        return {kind: len(found) for kind, found in self.anomalies.items()}

    def examples(self) -> dict[str, list]:
        return {kind: found[:EXAMPLES_PER_ANOMALY] for kind, found in self.anomalies.items()
                if found}


def epoch_of(time_ns: int, power_cut_times_ns: list[int]) -> int:
    """How many power cuts happened before ``time_ns``."""
    return bisect.bisect_left(power_cut_times_ns, time_ns)


def truncation_excuses(acked: dict[str, tuple[int, int, int]], lost: Iterable[str],
                       power_cut_times_ns: list[int]) -> set[str]:
    """The lost values a power cut may have dropped under a flush policy that syncs
    periodically: acknowledged (``acked``: value -> (partition, offset, ok time)) before a cut,
    and forming, with every other lost value of the same partition and the same span between
    cuts, a suffix of what that span acknowledged (no surviving value above them: no hole)."""
    lost = set(lost)
    by_span: dict[tuple[int, int], list[tuple[int, str]]] = defaultdict(list)
    for value, (partition, offset, ok_ns) in acked.items():
        by_span[partition, epoch_of(ok_ns, power_cut_times_ns)].append((offset, value))
    excused = set()
    for (_, epoch), entries in by_span.items():
        if epoch >= len(power_cut_times_ns):
            continue  # acknowledged after the last cut: nothing may drop it
        lowest_surviving_above = None
        for offset, value in sorted(entries, reverse=True):
            if value not in lost:
                lowest_surviving_above = offset
                break
        for offset, value in entries:
            if value in lost and (lowest_surviving_above is None
                                  or offset > lowest_surviving_above):
                excused.add(value)
    return excused
