"""The consumer protocol bytes (headrace.protocol.consumer_protocol decodes, the tests' group
leader, tests/coordinator/group_leader.py, encodes) and Kafka's range / roundrobin assignors."""

from __future__ import annotations

import pytest

from headrace.errors import CorruptMessage
from headrace.protocol.consumer_protocol import Subscription, decode_subscription
from tests.coordinator.group_leader import (
    ASSIGNORS,
    Assignment,
    AssignorMember,
    decode_assignment,
    encode_assignment,
    encode_subscription,
    range_assign,
    round_robin_assign,
)

TOPICS = "000000010001" + b"t".hex()  # ["t"]
OWNED = "000000010001" + b"t".hex() + "000000020000000000000001"  # t: [0, 1]


@pytest.mark.parametrize(
    "version,hex_bytes",
    [
        (0, "0000" + TOPICS + "00000001ab"),
        (1, "0001" + TOPICS + "00000001ab" + OWNED),
        (2, "0002" + TOPICS + "00000001ab" + OWNED + "00000009"),
        (3, "0003" + TOPICS + "00000001ab" + OWNED + "00000009" + "0002" + b"r1".hex()),
    ],
)
def test_subscription_golden_bytes(version, hex_bytes):
    full = Subscription(("t",), b"\xab", (("t", (0, 1)),), 9, "r1")
    golden = bytes.fromhex(hex_bytes)
    assert encode_subscription(full, version) == golden
    decoded = decode_subscription(golden)
    assert decoded.topics == ("t",) and decoded.user_data == b"\xab"
    if version >= 1:
        assert decoded.owned_partitions == (("t", (0, 1)),)
    assert decoded.generation_id == (9 if version >= 2 else -1)
    assert decoded.rack_id == ("r1" if version >= 3 else None)


def test_newer_subscription_version_reads_known_fields_and_ignores_the_rest():
    newer = bytes.fromhex("0004" + TOPICS + "ffffffff" + "00000000" + "00000001" + "ffff" + "beef")
    decoded = decode_subscription(newer)
    assert decoded == Subscription(("t",), None, (), 1, None)


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_assignment_golden_bytes(version):
    golden = bytes.fromhex(f"{version:04x}" + OWNED + "ffffffff")
    assignment = Assignment((("t", (0, 1)),))
    assert encode_assignment(assignment, version) == golden
    assert decode_assignment(golden) == assignment
    assert decode_assignment(golden).topic_partitions() == [("t", 0), ("t", 1)]


def test_empty_assignment_bytes_mean_no_partitions():
    assert decode_assignment(b"") == Assignment()


def test_truncated_subscription_is_corrupt():
    with pytest.raises(CorruptMessage):
        decode_subscription(bytes.fromhex("0000000000010005ab"))


def members(*specs):
    return [AssignorMember(member_id, Subscription(tuple(topics))) for member_id, topics in specs]


def flat(assignment):
    return assignment.topic_partitions()


def test_range_gives_contiguous_ranges_and_extras_to_the_first_members():
    plan = range_assign({"t": 7}, members(("c", ["t"]), ("a", ["t"]), ("b", ["t"])))
    assert flat(plan["a"]) == [("t", 0), ("t", 1), ("t", 2)]
    assert flat(plan["b"]) == [("t", 3), ("t", 4)]
    assert flat(plan["c"]) == [("t", 5), ("t", 6)]


def test_range_is_per_topic_and_respects_subscriptions():
    plan = range_assign(
        {"t0": 3, "t1": 3, "unknown-to-nobody": 2},
        members(("c0", ["t0", "t1"]), ("c1", ["t0", "t1"]), ("c2", ["t1", "missing"])),
    )
    assert flat(plan["c0"]) == [("t0", 0), ("t0", 1), ("t1", 0)]
    assert flat(plan["c1"]) == [("t0", 2), ("t1", 1)]
    assert flat(plan["c2"]) == [("t1", 2)]


def test_static_members_are_ordered_by_instance_id_first():
    ordered = [
        AssignorMember("a-dynamic", Subscription(("t",))),
        AssignorMember("z-static", Subscription(("t",)), group_instance_id="instance-0"),
    ]
    plan = range_assign({"t": 2}, ordered)
    assert flat(plan["z-static"]) == [("t", 0)] and flat(plan["a-dynamic"]) == [("t", 1)]


def test_round_robin_kafka_documentation_example():
    # RoundRobinAssignor javadoc: C0 subscribes t0; C1 t0, t1; C2 t0, t1, t2 (1, 2, 3 partitions)
    plan = round_robin_assign(
        {"t0": 1, "t1": 2, "t2": 3},
        members(("C0", ["t0"]), ("C1", ["t0", "t1"]), ("C2", ["t0", "t1", "t2"])),
    )
    assert flat(plan["C0"]) == [("t0", 0)]
    assert flat(plan["C1"]) == [("t1", 0)]
    assert flat(plan["C2"]) == [("t1", 1), ("t2", 0), ("t2", 1), ("t2", 2)]


@pytest.mark.parametrize("name", sorted(ASSIGNORS))
def test_every_partition_is_assigned_exactly_once(name):
    group = members(("a", ["x", "y"]), ("b", ["x"]), ("c", ["y", "x"]))
    plan = ASSIGNORS[name]({"x": 5, "y": 4}, group)
    owned = [tp for assignment in plan.values() for tp in flat(assignment)]
    assert sorted(owned) == sorted([("x", p) for p in range(5)] + [("y", p) for p in range(4)])
