"""Property: random interleavings of join / sync / heartbeat / leave / commit / time, with
offsets-topic appends that stall, succeed or fail, never give a partition to two consumers in
one generation, never show a committed offset before its commit was acknowledged, and every
answer carries a defined error code."""

from __future__ import annotations

from dataclasses import dataclass, field

from coordinator_driver import Driver, consumer_protocols
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace import errors
from headrace.coordinator.messages import (
    LeaveGroupRequest,
    MemberIdentity,
    OffsetAndMetadata,
    OffsetCommitRequest,
    OffsetFetchRequest,
    Pending,
)
from headrace.protocol.consumer_protocol import decode_subscription
from tests.coordinator.group_leader import (
    AssignorMember,
    decode_assignment,
    encode_assignment,
    range_assign,
)

GROUP = "property-group"
PARTITIONS = {"orders": 6}
CLIENTS = 4
DEFINED_CODES = {0} | set(errors.ERRORS_BY_CODE)


@dataclass
class SimulatedConsumer:
    index: int
    member_id: str = ""
    generation_id: int = -1
    leader_view: tuple = ()
    is_leader: bool = False
    parked_joins: list[int] = field(default_factory=list)
    parked_syncs: dict[int, int] = field(default_factory=dict)  # token -> generation

    @property
    def instance_id(self):
        return "static-consumer" if self.index == CLIENTS - 1 else None


class Simulation:
    def __init__(self) -> None:
        self.driver = Driver()
        self.consumers = [SimulatedConsumer(i) for i in range(CLIENTS)]
        self.owner_by_generation_partition: dict[tuple[int, tuple[str, int]], int] = {}
        self.parked_commits: dict[int, tuple[str, int]] = {}  # token -> partition
        self.acknowledged_commits: set[tuple[str, int]] = set()

    def check_code(self, code: int) -> None:
        assert code in DEFINED_CODES, code

    def on_join(self, consumer: SimulatedConsumer, response) -> None:
        self.check_code(response.error_code)
        if response.error_code == 0:
            consumer.member_id = response.member_id
            consumer.generation_id = response.generation_id
            consumer.is_leader = response.leader == response.member_id
            consumer.leader_view = response.members
        elif response.error_code == errors.MemberIdRequired.code:
            consumer.member_id = response.member_id
        elif response.error_code in (errors.UnknownMemberId.code, errors.FencedInstanceId.code):
            consumer.member_id, consumer.generation_id = "", -1

    def on_sync(self, consumer: SimulatedConsumer, generation_id: int, response) -> None:
        self.check_code(response.error_code)
        if response.error_code != 0:
            return
        for tp in decode_assignment(response.assignment).topic_partitions():
            owner = self.owner_by_generation_partition.setdefault(
                (generation_id, tp), consumer.index
            )
            assert owner == consumer.index, f"{tp} owned twice in generation {generation_id}"

    def collect_completions(self) -> None:
        completed = self.driver.completed
        for consumer in self.consumers:
            for token in [t for t in consumer.parked_joins if t in completed]:
                consumer.parked_joins.remove(token)
                self.on_join(consumer, completed.pop(token))
            for token in [t for t in consumer.parked_syncs if t in completed]:
                self.on_sync(consumer, consumer.parked_syncs.pop(token), completed.pop(token))
        for token in [t for t in self.parked_commits if t in completed]:
            self.on_commit(self.parked_commits.pop(token), completed.pop(token))

    def on_commit(self, tp: tuple[str, int], response) -> None:
        code = response.partition_errors[tp]
        self.check_code(code)
        if code == 0:
            self.acknowledged_commits.add(tp)

    def check_fetch_shows_only_acknowledged_commits(self) -> None:
        fetched = self.driver.call(OffsetFetchRequest(GROUP))
        assert fetched.error_code == 0
        assert set(fetched.offsets) <= self.acknowledged_commits

    def join(self, consumer: SimulatedConsumer) -> None:
        response = self.driver.join(
            member_id=consumer.member_id,
            group=GROUP,
            instance_id=consumer.instance_id,
            client_id=f"consumer{consumer.index}",
            protocols=consumer_protocols(),
        )
        if isinstance(response, Pending):
            consumer.parked_joins.append(response.token)
        else:
            self.on_join(consumer, response)

    def sync(self, consumer: SimulatedConsumer) -> None:
        assignments = {}
        if consumer.is_leader and consumer.leader_view:
            members = [
                AssignorMember(m.member_id, decode_subscription(m.metadata), m.group_instance_id)
                for m in consumer.leader_view
            ]
            plan = range_assign(PARTITIONS, members)
            assignments = {m: encode_assignment(a) for m, a in plan.items()}
        generation_id = consumer.generation_id
        response = self.driver.sync(
            consumer.member_id, generation_id, assignments, GROUP, consumer.instance_id
        )
        if isinstance(response, Pending):
            consumer.parked_syncs[response.token] = generation_id
        else:
            self.on_sync(consumer, generation_id, response)

    def heartbeat(self, consumer: SimulatedConsumer) -> None:
        self.check_code(
            self.driver.heartbeat(
                consumer.member_id, consumer.generation_id, GROUP, consumer.instance_id
            )
        )

    def leave(self, consumer: SimulatedConsumer) -> None:
        identity = MemberIdentity(consumer.member_id, consumer.instance_id)
        response = self.driver.call(LeaveGroupRequest(GROUP, (identity,)))
        self.check_code(response.error_code)
        for member in response.members:
            self.check_code(member.error_code)
        consumer.member_id, consumer.generation_id = "", -1

    def commit(self, consumer: SimulatedConsumer) -> None:
        request = OffsetCommitRequest(
            GROUP,
            {("orders", consumer.index): OffsetAndMetadata(consumer.index * 10)},
            consumer.generation_id,
            consumer.member_id,
            consumer.instance_id,
        )
        response = self.driver.call(request)
        tp = ("orders", consumer.index)
        if isinstance(response, Pending):
            self.parked_commits[response.token] = tp
        else:
            self.on_commit(tp, response)

    def stall_appends(self, consumer: SimulatedConsumer) -> None:
        self.driver.hold_appends = True

    def release_appends(self, consumer: SimulatedConsumer) -> None:
        self.driver.hold_appends = False
        self.driver.finish_appends()

    def fail_appends(self, consumer: SimulatedConsumer) -> None:
        self.driver.hold_appends = False
        self.driver.finish_appends(errors.NotLeaderOrFollower.code)


ACTIONS = [
    "join", "sync", "heartbeat", "leave", "commit", "wait",
    "stall_appends", "release_appends", "fail_appends",
]
steps = st.lists(
    st.tuples(st.sampled_from(ACTIONS), st.integers(0, CLIENTS - 1), st.integers(1, 15_000)),
    max_size=80,
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps)
def test_no_partition_has_two_owners_in_a_generation(script):
    simulation = Simulation()
    for action, index, elapsed_ms in script:
        consumer = simulation.consumers[index]
        if action == "wait":
            simulation.driver.advance(elapsed_ms)
        else:
            getattr(simulation, action)(consumer)
        simulation.collect_completions()
        simulation.check_fetch_shows_only_acknowledged_commits()
