"""Checkers: pure functions from a history (``headrace.faults.history``) to the anomalies in it.

Shared here: the rule for writes a power cut may drop (``truncation_excuses``).
Thread-safety: pure functions.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable


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
