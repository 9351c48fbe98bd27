"""Test helpers: drives a GroupCoordinator the way the broker will: requests in, effects carried out.

``Driver`` keeps an injected clock (``now_ms``), records every completed parked response by
token and every record handed to ``__consumer_offsets`` (in order, per partition). Appends are
acknowledged as successful right away unless ``hold_appends`` is set; then they wait in
``in_flight`` until ``finish_appends(error_code)`` reports them, as a slow or failing log would.
"""

from __future__ import annotations

import itertools

from headrace import errors
from headrace.coordinator.config import CoordinatorConfig
from headrace.coordinator.coordinator import GroupCoordinator
from headrace.coordinator.messages import (
    AppendResult,
    AppendToOffsetsTopic,
    Completed,
    HeartbeatRequest,
    JoinGroupRequest,
    OffsetAndMetadata,
    OffsetCommitRequest,
    Outcome,
    Pending,
    SyncGroupRequest,
)
from headrace.protocol.consumer_protocol import Subscription
from tests.coordinator.group_leader import encode_subscription

GROUP = "payments"
SESSION_TIMEOUT_MS = 10_000
REBALANCE_TIMEOUT_MS = 30_000

# (the log's error, what members get) when a group record's append fails: Kafka's mapping.
GROUP_APPEND_ERRORS = [
    (errors.NotLeaderOrFollower, errors.NotCoordinator),
    (errors.UnknownTopicOrPartition, errors.CoordinatorNotAvailable),
    (errors.RequestTimedOut, errors.RebalanceInProgress),
    (errors.MessageTooLarge, errors.UnknownServerError),
]


def consumer_protocols(topics=("orders",), names=("range",)):
    metadata = encode_subscription(Subscription(tuple(topics)))
    return tuple((name, metadata) for name in names)


class Driver:
    def __init__(self, config: CoordinatorConfig | None = None) -> None:
        ids = itertools.count(1)
        self.coordinator = GroupCoordinator(
            config or CoordinatorConfig(group_initial_rebalance_delay_ms=0),
            member_id_factory=lambda client_id: f"{client_id}-{next(ids):04d}",
        )
        self.now_ms = 0
        self.completed: dict[int, object] = {}
        self.appended: dict[int, list[tuple[bytes, bytes | None]]] = {}
        self.hold_appends = False
        self.in_flight: list[AppendToOffsetsTopic] = []

    def carry_out(self, effects) -> None:
        for effect in effects:
            if isinstance(effect, Completed):
                assert effect.token not in self.completed
                self.completed[effect.token] = effect.response
            else:
                assert isinstance(effect, AppendToOffsetsTopic)
                self.appended.setdefault(effect.partition, []).extend(effect.records)
                self.in_flight.append(effect)
        if not self.hold_appends:
            self.finish_appends()

    def finish_appends(self, error_code: int = 0) -> None:
        """Report every in-flight append as ended with ``error_code`` (0: appended)."""
        while self.in_flight:
            effect = self.in_flight.pop(0)
            outcome = self.coordinator.handle(AppendResult(effect.append_id, error_code), self.now_ms)
            assert outcome.response is None
            self.carry_out(outcome.effects)

    def call(self, request) -> object:
        outcome: Outcome = self.coordinator.handle(request, self.now_ms)
        self.carry_out(outcome.effects)
        return outcome.response

    def advance(self, elapsed_ms: int) -> None:
        self.now_ms += elapsed_ms
        self.carry_out(self.coordinator.tick(self.now_ms))

    def result(self, response):
        """The final response for a possibly parked request (None while still parked)."""
        if isinstance(response, Pending):
            return self.completed.get(response.token)
        return response

    def join(
        self,
        member_id="",
        group=GROUP,
        instance_id=None,
        protocols=None,
        session_timeout_ms=SESSION_TIMEOUT_MS,
        rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
        client_id="client",
        protocol_type="consumer",
        require_known_member_id=True,
        supports_skip_assignment=True,
    ):
        return self.call(
            JoinGroupRequest(
                group_id=group,
                member_id=member_id,
                protocol_type=protocol_type,
                protocols=protocols if protocols is not None else consumer_protocols(),
                session_timeout_ms=session_timeout_ms,
                rebalance_timeout_ms=rebalance_timeout_ms,
                group_instance_id=instance_id,
                client_id=client_id,
                client_host="/127.0.0.1",
                require_known_member_id=require_known_member_id,
                supports_skip_assignment=supports_skip_assignment,
            )
        )

    def join_new(self, client_id="client", **kwargs):
        """MEMBER_ID_REQUIRED handshake, then the real join; returns (member_id, response)."""
        first = self.join(client_id=client_id, **kwargs)
        assert first.error_code == 79
        return first.member_id, self.join(member_id=first.member_id, client_id=client_id, **kwargs)

    def sync(self, member_id, generation_id, assignments=None, group=GROUP, instance_id=None):
        """The response, or ``Pending`` while the request is still parked."""
        response = self.call(
            SyncGroupRequest(
                group_id=group,
                member_id=member_id,
                generation_id=generation_id,
                assignments=assignments or {},
                group_instance_id=instance_id,
            )
        )
        return self.result(response) or response

    def heartbeat(self, member_id, generation_id, group=GROUP, instance_id=None) -> int:
        request = HeartbeatRequest(group, member_id, generation_id, instance_id)
        return self.call(request).error_code

    def commit(self, offsets, generation_id=-1, member_id="", group=GROUP, instance_id=None):
        request = OffsetCommitRequest(
            group_id=group,
            offsets={tp: OffsetAndMetadata(*value) for tp, value in offsets.items()},
            generation_id=generation_id,
            member_id=member_id,
            group_instance_id=instance_id,
        )
        return self.result(self.call(request)).partition_errors


def form_group(driver, count, topics=("orders",)):
    """Join ``count`` members into one generation; returns (member ids, leader id, generation)."""
    member_ids = []
    for index in range(count):
        member_id, _ = driver.join_new(
            client_id=f"c{index}", protocols=consumer_protocols(topics=topics)
        )
        member_ids.append(member_id)
        if index < count - 1:
            rejoin_all(driver, member_ids)
    responses = rejoin_all(driver, member_ids)
    return member_ids, responses[0].leader, responses[0].generation_id


def rejoin_all(driver, member_ids, topics=("orders",)):
    parked = [
        driver.join(
            member_id=m, client_id=m.rsplit("-", 1)[0], protocols=consumer_protocols(topics)
        )
        for m in member_ids
    ]
    return [driver.result(p) for p in parked]
