"""The runner's pure parts: the seeded schedules (one after another for one node, overlapping
for the cluster) and the unavailability and recovery measures."""

from __future__ import annotations

from headrace.faults.history import INFO, INVOKE, OK, History, Op
from headrace.faults.runner import RunConfig, recovery_s, schedule, unavailable_s

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


CLUSTER_KINDS = ("kill", "pause", "zk-kill", "leader-zk", "split", "one-way")
CLUSTER_DURATIONS = {"kill": (0.5, 2.0), "pause": (7.0, 9.0), "zk-kill": (0.5, 2.0),
                     "leader-zk": (3.0, 8.0), "split": (3.0, 8.0), "one-way": (3.0, 8.0)}


def cluster_schedule(seed: int, duration_s: float = 60) -> list:
    config = RunConfig(seed=seed, nemeses=CLUSTER_KINDS, duration_s=duration_s,
                       target="cluster")
    return schedule(config, CLUSTER_DURATIONS)


def test_a_cluster_schedule_injects_every_kind_once_before_any_kind_twice():
    for seed in range(20):
        first = [fault.kind for fault in cluster_schedule(seed)[:len(CLUSTER_KINDS)]]
        assert sorted(first) == sorted(CLUSTER_KINDS), (seed, first)


def test_cluster_faults_overlap_but_a_kind_is_never_in_effect_twice_at_once():
    overlaps = 0
    for seed in range(20):
        faults = cluster_schedule(seed)
        assert faults == cluster_schedule(seed)
        for index, fault in enumerate(faults):
            for later in faults[index + 1:]:
                if later.start_s < fault.start_s + fault.duration_s:
                    overlaps += 1
                    assert later.kind != fault.kind, (seed, fault, later)
        assert all(fault.start_s < 60 for fault in faults)
    assert overlaps > 0


def test_recovery_is_the_time_until_every_partition_acknowledged_after_healing():
    ticks = iter(range(0, 10**12, 10**9))  # the history's clock: one second per record
    history = History(clock_ns=lambda: next(ticks))
    history.record(OK, "p", "send", "before", partition=1)
    healed = history.record(INFO, "nemesis", "healed")
    history.record(OK, "p", "send", "a", partition=0)
    history.record(INFO, "p", "send", "b", partition=1)
    history.record(OK, "p", "send", "c", partition=1)
    assert recovery_s(history, "send", 2, healed.time_ns, limit_s=0) == 3.0


def test_a_partition_without_an_acknowledgement_after_healing_has_not_recovered():
    ticks = iter(range(0, 10**12, 10**9))
    history = History(clock_ns=lambda: next(ticks))
    history.record(OK, "p", "send", "before", partition=1)
    healed = history.record(INFO, "nemesis", "healed")
    history.record(OK, "p", "send", "a", partition=0)
    assert recovery_s(history, "send", 2, healed.time_ns, limit_s=0) is None
