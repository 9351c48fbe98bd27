"""The runner's pure parts: the seeded schedule and the unavailability measure."""

from __future__ import annotations

from headrace.faults.history import INVOKE, OK, Op
from headrace.faults.runner import RunConfig, schedule, unavailable_s

DURATIONS = {"kill": (0.5, 2.0), "pause": (7.0, 9.0)}


def test_a_seed_gives_the_same_schedule_and_another_seed_another():
    config = RunConfig(seed=3, nemeses=("kill", "pause"), duration_s=30)
    assert schedule(config, DURATIONS) == schedule(config, DURATIONS)
    other = RunConfig(seed=4, nemeses=("kill", "pause"), duration_s=30)
    assert schedule(other, DURATIONS) != schedule(config, DURATIONS)


def test_faults_follow_each_other_within_their_bounds_and_the_run():
    config = RunConfig(seed=5, nemeses=("kill", "pause"), duration_s=60)
    faults = schedule(config, DURATIONS)
    assert {fault.kind for fault in faults} == {"kill", "pause"}
    for earlier, later in zip(faults, faults[1:], strict=False):
        assert later.start_s >= earlier.start_s + earlier.duration_s
    for fault in faults:
        low, high = DURATIONS[fault.kind]
        assert low <= fault.duration_s <= high
        assert fault.start_s < config.duration_s


def at(seconds: float, type_: str) -> Op:
    return Op(0, type_, "p", int(seconds * 1e9), "send", "v", 0, 0)


def test_unavailability_sums_the_long_gaps_between_acknowledgements():
    ops = [at(0, INVOKE), at(0.5, OK), at(3.0, OK), at(3.5, OK), at(5.0, INVOKE)]
    assert unavailable_s(ops, "send") == 2.5 + 1.5


def test_a_run_without_acknowledgements_was_unavailable_throughout():
    ops = [at(1.0, INVOKE), at(9.0, INVOKE)]
    assert unavailable_s(ops, "send") == 8.0
