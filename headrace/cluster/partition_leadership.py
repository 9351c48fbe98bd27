"""Leader and ISR choices of Kafka's ZooKeeper-mode controller, as pure functions.

Owns the election rules (Kafka's ``PartitionLeaderElectionAlgorithms`` and
``ReplicaStateMachine.doRemoveReplicasFromIsr``), each taking the partition's replicas in
assignment order (preferred leader first), its current ``PartitionState`` and the live brokers,
and returning the next state or None when nothing changes or no leader can be chosen:

- a new partition: leader = first live replica, ISR = the live replicas, leader epoch 0;
  no live replica: no state (the partition waits, as Kafka's NewPartition does);
- a broker gone: it leaves the ISR (unless it is the last member, which Kafka keeps) and, if
  it led, the leader becomes -1 (``NO_LEADER``); either way the leader epoch goes up by one;
- an offline partition (leader -1 or a dead leader): leader = first replica that is live and in
  the ISR; with ``unclean.leader.election.enable`` (false by default) any live replica, the ISR
  then being that replica alone; no candidate: None (the partition stays offline, RF=1 data
  is kept and comes back with its broker);
- controlled shutdown: leader = first replica live, in the ISR and not shutting down; the
  shutting-down brokers leave the ISR;
- preferred leader: the first replica of the assignment if it is live and in the ISR;
- a reassignment: its start bumps the leader epoch; at its end the leader moves into the target
  replicas if it is not a live one of them (first target replica live and in the ISR), and the
  removed replicas leave the ISR.

Every new state carries the controller epoch of the controller that writes it. Pure; thread-safe.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from headrace.cluster.zookeeper_records import INITIAL_LEADER_EPOCH, NO_LEADER, PartitionState


def initial_state(
    replicas: Sequence[int], live_brokers: Collection[int], controller_epoch: int
) -> PartitionState | None:
    live_replicas = tuple(replica for replica in replicas if replica in live_brokers)
    if not live_replicas:
        return None
    return PartitionState(
        leader=live_replicas[0], leader_epoch=INITIAL_LEADER_EPOCH, isr=live_replicas,
        controller_epoch=controller_epoch,
    )


def _next(state: PartitionState, leader: int, isr: Sequence[int], controller_epoch: int) -> PartitionState:
    return PartitionState(
        leader=leader, leader_epoch=state.leader_epoch + 1, isr=tuple(isr),
        controller_epoch=controller_epoch, leader_recovery_state=state.leader_recovery_state,
    )


def remove_replica_from_isr(
    state: PartitionState, broker_id: int, controller_epoch: int
) -> PartitionState | None:
    """Kafka's OfflineReplica transition for one partition of a broker that went away."""
    if broker_id not in state.isr:
        return None
    leader = NO_LEADER if state.leader == broker_id else state.leader
    isr = state.isr if len(state.isr) == 1 else tuple(r for r in state.isr if r != broker_id)
    return _next(state, leader, isr, controller_epoch)


def elect_offline_leader(
    replicas: Sequence[int],
    state: PartitionState,
    live_brokers: Collection[int],
    controller_epoch: int,
    unclean_leader_election: bool = False,
) -> PartitionState | None:
    """Kafka's OfflinePartitionLeaderElection, for a partition whose leader is not live."""
    if state.leader in live_brokers:
        return None
    in_sync = [r for r in replicas if r in live_brokers and r in state.isr]
    if in_sync:
        isr = [r for r in state.isr if r in live_brokers]
        return _next(state, in_sync[0], isr, controller_epoch)
    if unclean_leader_election:
        live = [r for r in replicas if r in live_brokers]
        if live:
            return _next(state, live[0], [live[0]], controller_epoch)
    return None


def elect_for_controlled_shutdown(
    replicas: Sequence[int],
    state: PartitionState,
    live_brokers: Collection[int],
    shutting_down: Collection[int],
    controller_epoch: int,
) -> PartitionState | None:
    """Kafka's ControlledShutdownPartitionLeaderElection for a partition led by a broker that
    is shutting down; None when no other live ISR member can take over."""
    candidates = [
        r for r in replicas if r in live_brokers and r in state.isr and r not in shutting_down
    ]
    if not candidates:
        return None
    isr = [r for r in state.isr if r not in shutting_down]
    return _next(state, candidates[0], isr, controller_epoch)


def elect_preferred_leader(
    replicas: Sequence[int],
    state: PartitionState,
    live_brokers: Collection[int],
    controller_epoch: int,
) -> PartitionState | None:
    """Kafka's PreferredReplicaPartitionLeaderElection; None when the preferred replica already
    leads or cannot (not live or not in the ISR)."""
    if not replicas:
        return None
    preferred = replicas[0]
    if state.leader == preferred or preferred not in live_brokers or preferred not in state.isr:
        return None
    return _next(state, preferred, state.isr, controller_epoch)


def elect_reassigned_leader(
    target: Sequence[int],
    state: PartitionState,
    live_brokers: Collection[int],
    controller_epoch: int,
) -> PartitionState | None:
    """Kafka's ``moveReassignedPartitionLeaderIfRequired`` at a reassignment's end: a leader
    in the target replicas and live keeps leading under a new leader epoch; otherwise the
    first target replica live and in the ISR leads (Kafka's ReassignPartitionLeaderElection);
    None when there is none. The ISR is kept."""
    if state.leader in target and state.leader in live_brokers:
        return _next(state, state.leader, state.isr, controller_epoch)
    candidates = [r for r in target if r in live_brokers and r in state.isr]
    if not candidates:
        return None
    return _next(state, candidates[0], state.isr, controller_epoch)


def bump_leader_epoch(state: PartitionState, controller_epoch: int) -> PartitionState:
    """Same leader and ISR under the next leader epoch (Kafka's ``updateLeaderEpoch``, as a
    reassignment starts: every replica of the new set learns of it)."""
    return _next(state, state.leader, state.isr, controller_epoch)


def remove_replicas_from_isr(
    state: PartitionState, removed: Collection[int], controller_epoch: int
) -> PartitionState | None:
    """The removed replicas of a completed reassignment leave the ISR (Kafka's OfflineReplica
    for RR); None when none is in it. The ISR keeps at least one member, as Kafka's does."""
    isr = [r for r in state.isr if r not in removed]
    if len(isr) == len(state.isr):
        return None
    leader = state.leader if state.leader not in removed else NO_LEADER
    return _next(state, leader, isr or state.isr[:1], controller_epoch)
