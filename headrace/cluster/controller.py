"""The cluster controller, as Kafka's ZooKeeper-mode ``KafkaController``: one per cluster.

Owns the election of the controller and, while this broker is the controller, every partition
state in ZooKeeper. Every broker runs a ``Controller``; one wins.

Election: each broker's controller tries one multi-op: create the ephemeral ``/controller``
(``{"version":2,"brokerid":N,...}``) and set ``/controller_epoch`` to epoch + 1 conditional on
the zkVersion it read (``/controller_epoch`` is created as "0" when missing, as Kafka does).
The loser watches ``/controller`` and tries again when it is deleted (its owner's session
ended). The winner reads everything afresh (``controller_context.load_context``) and reconciles:
missing partition states are created, dead brokers leave ISRs, offline partitions get leaders,
pending deletions and controlled shutdowns are served.

Fencing: every controller write is a multi-op that starts with ``check(/controller_epoch,
zkVersion)``, and partition states are also set conditional on their own zkVersion. A failed
epoch check means a newer controller was elected: this one resigns at once and writes nothing
more (``ControllerFenced``). A LOST ZooKeeper session (e.g. a controller paused by SIGSTOP past
its session timeout) resigns it too, from kazoo's thread, before anything else runs; a
resigned controller that reconnects with a new session takes part in the next election only.

Metadata reaches brokers through ZooKeeper watches only (brokers act on znodes, never on RPCs
from a controller): the kio codec follows Kafka 4.x, without the ZooKeeper-era controller RPCs,
and a zombie controller cannot mislead a broker when its writes are refused by ZooKeeper.

Events (Kafka's ``ControllerEventManager``): ZooKeeper watches (``/controller``, children of
``/brokers/ids``, ``/brokers/topics``, ``/admin/delete_topics`` and headrace's own
``/headrace/controlled_shutdown``, see ``topic_admin``; and each topic's assignment, for
partitions added to it) and admin requests (``submit``) become
events on one queue, drained by one thread (``hr-controller``), which alone touches the
controller's context; a watch event that is already queued is not queued twice, and each
re-reads ZooKeeper (watches fire once). Kazoo's callbacks only enqueue.

ISRs: leaders shrink and expand them by writing the partition state themselves, conditional
on its zkVersion (Kafka's ZooKeeper-mode ``Partition.updateLeaderAndIsr``). So every write of a
state here is a read-modify-write (``_update_state``): computed from the state as last read,
written conditional on its zkVersion, and on BadVersion re-read and computed again (bounded), so
that the controller never overwrites an ISR change it has not seen. Before choosing by ISR
membership (a broker gone, a controlled shutdown, a new controller) the states are re-read.

Partition reassignment (AlterPartitionReassignments, KIP-455) as Kafka's ZooKeeper-mode
controller: RS = ORS + TRS with ``adding_replicas``/``removing_replicas`` in the assignment znode
and a leader epoch bump; a DataWatch on the state znode of each partition being reassigned
completes it once TRS is in the ISR (leader moved into TRS, RR out of the ISR, RS = TRS); a new
controller resumes the reassignments it finds in the assignments (see ``partition_reassignment``).

Automatic preferred-leader rebalance (``LeaderRebalance``: ``auto.leader.rebalance.enable``,
``leader.imbalance.check.interval.seconds``, ``leader.imbalance.per.broker.percentage``): the
event thread's wait for the next event is bounded by the next check, which runs as an event.

Unclean leader election: per topic, ``unclean.leader.election.enable`` of ``/config/topics/<t>``
else the broker's (dynamic: read at each election); a topic config change (a
``/config/changes`` notification) elects offline partitions again, as Kafka's
``TopicUncleanLeaderElectionEnable`` event does.
Deleted topics' znodes are removed at once (brokers that are down delete their logs when
they come back and find the topic gone), not after every replica acknowledged, as Kafka did.
"""

from __future__ import annotations

import concurrent.futures
import logging
import math
import queue
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    BadVersionError,
    ConnectionLoss,
    NodeExistsError,
    NoNodeError,
    RolledBackError,
    SessionExpiredError,
)
from kazoo.protocol.states import KazooState
from kazoo.retry import RetryFailedError

from headrace.cluster import partition_leadership as leadership
from headrace.cluster import partition_reassignment as reassignment
from headrace.cluster import topic_admin
from headrace.cluster import zookeeper_paths as paths
from headrace.cluster import zookeeper_records as records
from headrace.cluster.controller_context import (
    ControllerContext,
    VersionedState,
    load_context,
    read_live_brokers,
    read_partition_state,
    read_partition_states,
    read_topic,
)
from headrace.errors import (
    ElectionNotNeeded,
    EligibleLeadersNotAvailable,
    KafkaError,
    NoReassignmentInProgress,
    NotController,
    PreferredLeaderNotAvailable,
    UnknownTopicId,
    UnknownTopicOrPartition,
)

log = logging.getLogger("headrace.cluster.controller")

INITIAL_CONTROLLER_EPOCH = 0
ELECTION_TYPE_PREFERRED = 0
ELECTION_TYPE_UNCLEAN = 1
STOP_TIMEOUT_S = 10.0
FIRST_REBALANCE_CHECK_DELAY_S = 5.0
MAX_STATE_WRITE_ATTEMPTS = 10
UNCLEAN_LEADER_ELECTION_ENABLE = "unclean.leader.election.enable"  # re-reads of a state that keeps changing under one event


@dataclass(frozen=True, slots=True)
class LeaderRebalance:
    """Kafka's automatic preferred-leader rebalance: ``auto.leader.rebalance.enable`` (true),
    ``leader.imbalance.check.interval.seconds`` (300), ``leader.imbalance.per.broker.percentage``
    (10)."""

    enable: bool = True
    check_interval_s: float = 300.0
    imbalance_per_broker_percentage: int = 10

    @property
    def first_check_delay_s(self) -> float:
        """Kafka checks 5 s after a controller is elected (sooner when the interval is)."""
        return min(FIRST_REBALANCE_CHECK_DELAY_S, self.check_interval_s)


class ControllerFenced(Exception):
    """A newer controller epoch exists (or the session was lost): this controller resigned."""


class Controller:
    """One broker's controller: candidate in the election, and the controller when it wins."""

    def __init__(
        self, zk: KazooClient, broker_id: int, *,
        unclean_leader_election: Callable[[], bool] = lambda: False,
        leader_rebalance: LeaderRebalance = LeaderRebalance(enable=False),
        now_ms: Callable[[], int] | None = None,
    ) -> None:
        self._zk = zk
        self.broker_id = broker_id
        self._unclean_leader_election = unclean_leader_election
        self._leader_rebalance = leader_rebalance
        self._next_rebalance_check_s = math.inf  # time.monotonic() of the next check, while active
        self._now_ms = now_ms or (lambda: int(time.time() * 1000))
        self._events: queue.Queue = queue.Queue()
        self._queued_keys: set[str] = set()
        self._watched_topics: set[str] = set()  # topics whose assignment is watched
        self._reassignment_watches: set[tuple[str, int]] = set()  # states watched while reassigning
        self._lock = threading.Lock()
        self._context: ControllerContext | None = None
        self._session_lost = False
        self._won_epoch_zk_version = -1  # /controller_epoch's zkVersion after this broker's last win
        self._stopping = False
        self.controller_id: int | None = None  # as last seen on /controller; -1 unknown
        self._thread = threading.Thread(target=self._run, name="hr-controller", daemon=True)

    # --- life cycle -------------------------------------------------------------------------

    def start(self) -> None:
        self._zk.add_listener(self._on_session_state)
        self._thread.start()
        self._zk.retry(self._zk.ensure_path, paths.DELETE_TOPICS)
        self._zk.retry(self._zk.ensure_path, topic_admin.CONTROLLED_SHUTDOWN)
        self._zk.DataWatch(paths.CONTROLLER, self._on_controller_znode)
        self._watch_children(paths.BROKER_IDS, "brokers", self._on_brokers_changed)
        self._watch_children(paths.TOPICS, "topics", self._on_topics_changed)
        self._watch_children(paths.DELETE_TOPICS, "deletions", self._on_deletions_requested)
        self._watch_children(topic_admin.CONTROLLED_SHUTDOWN, "shutdowns", self._on_shutdowns_requested)
        self._watch_children(paths.CONFIG_CHANGES, "config-changes", self._on_config_changed)

    def stop(self) -> None:
        """Resign (the session's end then deletes ``/controller``) and stop the event thread."""
        self._stopping = True
        self._resign("broker shutting down")
        self._events.put((None, None))
        if self._thread.is_alive():
            self._thread.join(STOP_TIMEOUT_S)

    @property
    def is_active(self) -> bool:
        return self._context is not None

    @property
    def epoch(self) -> int | None:
        context = self._context
        return context.epoch if context else None

    @property
    def queued_event_count(self) -> int:
        return self._events.qsize()

    def submit(self, action: Callable[[], Any]) -> concurrent.futures.Future:
        """Run ``action`` on the event thread if this broker is the active controller; the
        future fails with NOT_CONTROLLER otherwise."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                if self._context is None:
                    raise NotController("This is not the correct controller for this cluster.")
                future.set_result(action())
            except BaseException as error:  # handed to the waiting handler
                future.set_exception(error)

        self._enqueue(None, run)
        return future

    # --- events -----------------------------------------------------------------------------

    def _enqueue(self, key: str | None, action: Callable[[], None]) -> None:
        with self._lock:
            if key is not None:
                if key in self._queued_keys:
                    return
                self._queued_keys.add(key)
        self._events.put((key, action))

    def _watch_children(self, path: str, key: str, handler: Callable[[], None]) -> None:
        def on_children(_children) -> bool:
            self._enqueue(key, handler)
            return not self._stopping

        self._zk.retry(self._zk.ensure_path, path)
        self._zk.ChildrenWatch(path, on_children)

    def _run(self) -> None:
        while True:
            try:
                key, action = self._events.get(timeout=self._seconds_to_rebalance_check())
            except queue.Empty:
                self._next_rebalance_check_s = time.monotonic() + self._leader_rebalance.check_interval_s
                self._run_event("rebalance", self._check_leader_imbalance)
                continue
            if action is None:
                return
            with self._lock:
                self._queued_keys.discard(key)
            self._run_event(key, action)

    def _run_event(self, key: str | None, action: Callable[[], None]) -> None:
        """``action``, run again (the session's bounded command retry) while ZooKeeper's
        connection is lost: each event re-reads what it needs, and its writes are conditional
        on zkVersions, so a repeated run writes nothing twice."""
        try:
            self._zk.retry(action)
        except ControllerFenced as fenced:
            log.warning("controller %d: %s", self.broker_id, fenced)
        except (ConnectionLoss, RetryFailedError, SessionExpiredError) as error:
            log.warning("controller %d: ZooKeeper unavailable during %s: %r; retried on reconnection",
                        self.broker_id, key or "a request", error)
        except Exception:
            log.exception("controller %d: event %s failed", self.broker_id, key or "request")

    def _on_session_state(self, state: str) -> None:
        """Kazoo's connection listener (kazoo's thread: flags and enqueues only)."""
        if state == KazooState.LOST:
            self._session_lost = True
            self._resign("ZooKeeper session expired")
        elif state == KazooState.CONNECTED:
            self._session_lost = False
            self._enqueue("elect", self._elect)  # a no-op while active
            self._enqueue("reconcile", self._reconcile)  # retries what a lost connection failed

    def _on_controller_znode(self, data: bytes | None, _stat: Any) -> None:
        self.controller_id = records.decode_controller_registration(data).broker_id if data else None
        self._enqueue("controller", self._on_controller_changed)

    # --- election and resignation -----------------------------------------------------------

    def _on_controller_changed(self) -> None:
        try:
            data, _ = self._zk.get(paths.CONTROLLER)
        except NoNodeError:
            self._elect()
            return
        owner = records.decode_controller_registration(data).broker_id
        if owner != self.broker_id and self._context is not None:
            self._resign(f"broker {owner} is now the controller")
        elif owner == self.broker_id and self._context is None:
            self._elect()  # ours but not active (its first read failed): resume

    def _elect(self) -> None:
        if self._context is not None or self._stopping or self._zk.state != KazooState.CONNECTED:
            return
        try:
            self._zk.create(paths.CONTROLLER_EPOCH, records.encode_controller_epoch(INITIAL_CONTROLLER_EPOCH))
        except NodeExistsError:
            pass
        data, stat = self._zk.get(paths.CONTROLLER_EPOCH)
        epoch = records.decode_controller_epoch(data) + 1
        registration = records.ControllerRegistration(self.broker_id, self._now_ms())
        transaction = self._zk.transaction()
        transaction.create(paths.CONTROLLER, records.encode_controller_registration(registration),
                           ephemeral=True)
        transaction.set_data(paths.CONTROLLER_EPOCH, records.encode_controller_epoch(epoch),
                             version=stat.version)
        created, epoch_set = transaction.commit()
        if isinstance(created, NodeExistsError):
            self._resume_if_ours()  # else another broker is controller: the watch calls again
            return
        if isinstance(epoch_set, BadVersionError):
            self._enqueue("elect", self._elect)  # raced with another election: read again
            return
        for result in (created, epoch_set):
            if isinstance(result, Exception):
                raise result
        self._won_epoch_zk_version = epoch_set.version
        self._become_active(epoch, epoch_set.version)

    def _owns_controller_znode(self) -> bool:
        stat = self._zk.exists(paths.CONTROLLER)
        return stat is not None and stat.ephemeralOwner == self._zk.client_id[0]

    def _resume_if_ours(self) -> None:
        """``/controller`` is this session's own (won, but reading the cluster failed): take up
        the epoch it set, if ``/controller_epoch`` is still at the zkVersion its election
        wrote. Moved on since (this controller was fenced, and its ``move`` event has not run
        yet): never adopt an epoch it did not win, delete ``/controller`` instead."""
        if not self._owns_controller_znode():
            return
        data, stat = self._zk.get(paths.CONTROLLER_EPOCH)
        if stat.version != self._won_epoch_zk_version:
            self._move_controller()
            return
        self._become_active(records.decode_controller_epoch(data), stat.version)

    def _move_controller(self) -> None:
        """After being fenced while ``/controller`` is still this session's (the epoch moved
        on under it): delete it, so that the brokers elect again (Kafka's triggerControllerMove)."""
        if self._context is None and self._owns_controller_znode():
            log.warning("controller %d: deleting its /controller to trigger an election", self.broker_id)
            self._zk.delete(paths.CONTROLLER)

    def _become_active(self, epoch: int, epoch_zk_version: int) -> None:
        context = load_context(self._zk, epoch, epoch_zk_version, topic_admin.CONTROLLED_SHUTDOWN)
        with self._lock:
            self._context = context
        for topic in sorted(context.assignments):
            self._watch_assignment(topic)
        log.info("controller %d: became the controller, epoch %d", self.broker_id, epoch)
        if self._leader_rebalance.enable:
            self._next_rebalance_check_s = time.monotonic() + self._leader_rebalance.first_check_delay_s
        self._reconcile()

    def _resign(self, reason: str) -> None:
        self._next_rebalance_check_s = math.inf
        with self._lock:
            context, self._context = self._context, None
        if context is not None:
            log.warning("controller %d: resigned as controller (epoch %d): %s",
                        self.broker_id, context.epoch, reason)

    def _active_context(self) -> ControllerContext:
        context = self._context
        if context is None:
            raise ControllerFenced("not the active controller; nothing written")
        return context

    # --- fenced writes ----------------------------------------------------------------------

    def _commit_fenced(self, build: Callable[[Any], None]) -> list:
        """One multi-op: check the controller epoch's zkVersion, then ``build``'s operations.
        The results of ``build``'s operations (exceptions for failed ones)."""
        context = self._active_context()
        transaction = self._zk.transaction()
        transaction.check(paths.CONTROLLER_EPOCH, context.epoch_zk_version)
        build(transaction)
        results = transaction.commit()
        if isinstance(results[0], (BadVersionError, NoNodeError)):
            self._resign(f"fenced: /controller_epoch is past epoch {context.epoch}")
            self._enqueue("move", self._move_controller)
            raise ControllerFenced(f"epoch {context.epoch} fenced by a newer controller; nothing written")
        if isinstance(results[0], Exception) and not isinstance(results[0], RolledBackError):
            raise results[0]
        return results[1:]

    def _update_state(self, context: ControllerContext, topic: str, partition: int,
                      compute: Callable[[records.PartitionState | None], records.PartitionState | None]
                      ) -> records.PartitionState | None:
        """Read-modify-write of a partition's state (Kafka's ``updateLeaderAndIsr`` loop):
        ``compute`` the next state from the current one (None: the znode does not exist) and
        write it conditional on the zkVersion it was computed from. When the znode changed
        meanwhile (a leader's ISR change, BadVersion) it is re-read and ``compute`` runs again
        on what is there now, at most ``MAX_STATE_WRITE_ATTEMPTS`` times: a controller never
        overwrites a state it has not seen. The state written, or None (nothing to change, or
        the attempts ran out)."""
        for _attempt in range(MAX_STATE_WRITE_ATTEMPTS):
            current = context.states.get((topic, partition))
            state = compute(current.state if current is not None else None)
            if state is None:
                return None
            if self._write_state(context, topic, partition, current, state):
                return state
        log.warning("controller %d: state of %s-%d kept changing under %d attempts; left for "
                    "the next event", self.broker_id, topic, partition, MAX_STATE_WRITE_ATTEMPTS)
        return None

    def _write_state(self, context: ControllerContext, topic: str, partition: int,
                     current: VersionedState | None, state: records.PartitionState) -> bool:
        """Create (``current`` None) or replace a partition's state conditional on
        ``current``'s zkVersion; False when the znode changed under us (the context is then
        refreshed from ZooKeeper)."""
        path, data = paths.partition_state_path(topic, partition), records.encode_partition_state(state)
        if current is None:
            missing_parents = self._missing_partition_parents(topic, partition)

            def build(transaction) -> None:
                for parent in missing_parents:
                    transaction.create(parent)
                transaction.create(path, data)
        else:
            def build(transaction) -> None:
                transaction.set_data(path, data, version=current.zk_version)
        results = self._commit_fenced(build)
        if any(isinstance(result, Exception) for result in results):
            log.info("controller %d: state of %s-%d changed concurrently (%r); re-read",
                     self.broker_id, topic, partition, results)
            self._refresh_state(context, topic, partition)
            return False
        version = results[-1].version if current is not None else 0
        context.states[(topic, partition)] = VersionedState(state, version)
        return True

    def _missing_partition_parents(self, topic: str, partition: int) -> list[str]:
        parents = [paths.topic_partitions_path(topic), paths.partition_path(topic, partition)]
        return [parent for parent in parents if self._zk.exists(parent) is None]

    def _refresh_all_states(self, context: ControllerContext) -> None:
        """Re-read every partition state: leaders change ISRs in ZooKeeper themselves, so the
        controller reads them afresh before choosing by ISR membership (as Kafka's
        ``removeReplicasFromIsr`` reads the states before changing them)."""
        keys = [(topic, partition) for topic, partition, _ in context.partitions()]
        fresh = read_partition_states(self._zk, keys)
        for key in keys:
            if key in fresh:
                context.states[key] = fresh[key]
            else:
                context.states.pop(key, None)

    def _refresh_state(self, context: ControllerContext, topic: str, partition: int) -> None:
        state = read_partition_state(self._zk, topic, partition)
        if state is None:
            context.states.pop((topic, partition), None)
        else:
            context.states[(topic, partition)] = state

    # --- reconciliation: what a new controller (or a reconnected one) does -------------------

    def _reconcile(self) -> None:
        context = self._context
        if context is None:
            return
        self._refresh_all_states(context)
        self._create_missing_states(context)
        for broker_id in self._brokers_in_isrs(context) - set(context.live_brokers):
            self._on_broker_failure(context, broker_id)
        self._elect_offline_partitions(context)
        self._on_deletions_requested()
        self._on_shutdowns_requested()
        self._resume_reassignments(context)

    @staticmethod
    def _brokers_in_isrs(context: ControllerContext) -> set[int]:
        return {replica for versioned in context.states.values() for replica in versioned.state.isr}

    def _create_missing_states(self, context: ControllerContext, topics: set[str] | None = None) -> None:
        for topic, partition, replicas in list(context.partitions()):
            if (topics is not None and topic not in topics) or (topic, partition) in context.states:
                continue
            electable = context.electable_brokers()
            if leadership.initial_state(replicas, electable, context.epoch) is None:
                log.warning("controller %d: no live replica for new partition %s-%d (replicas %s)",
                            self.broker_id, topic, partition, list(replicas))
                continue
            self._update_state(context, topic, partition, lambda current, r=replicas, e=electable: (
                leadership.initial_state(r, e, context.epoch) if current is None else None))

    def _elect_offline_partitions(self, context: ControllerContext, topics: set[str] | None = None) -> None:
        """Kafka's OfflinePartition -> OnlinePartition with OfflinePartitionLeaderElection,
        unclean only where ``unclean.leader.election.enable`` is true for the topic."""
        electable = context.electable_brokers()
        for topic, partition, replicas in list(context.partitions()):
            versioned = context.states.get((topic, partition))
            if versioned is None or versioned.state.leader in electable or (
                    topics is not None and topic not in topics):
                continue
            unclean = self.unclean_leader_election_enabled(topic)
            self._update_state(context, topic, partition, lambda current, r=replicas, u=unclean: (
                leadership.elect_offline_leader(r, current, electable, context.epoch, u)
                if current is not None else None))

    def unclean_leader_election_enabled(self, topic: str) -> bool:
        """The topic's ``unclean.leader.election.enable`` (``/config/topics/<t>``), else the
        broker's (read when asked: a dynamic change applies to the next election)."""
        override = topic_admin.read_topic_config(self._zk, topic).get(UNCLEAN_LEADER_ELECTION_ENABLE)
        if override is not None:
            return override.strip().lower() == "true"
        return self._unclean_leader_election()

    # --- brokers ----------------------------------------------------------------------------

    def _on_brokers_changed(self) -> None:
        context = self._context
        if context is None:
            return
        current = read_live_brokers(self._zk)
        previous = context.live_brokers
        gone = {b for b, epoch in previous.items() if current.get(b) != epoch}  # dead or bounced
        arrived = {b for b, epoch in current.items() if previous.get(b) != epoch}
        if gone or arrived:
            log.info("controller %d: brokers gone %s, arrived %s", self.broker_id, sorted(gone), sorted(arrived))
        context.live_brokers = {b: e for b, e in previous.items() if b not in gone}
        if gone:
            self._refresh_all_states(context)
        for broker_id in sorted(gone):
            self._on_broker_failure(context, broker_id)
        context.live_brokers = current
        self._create_missing_states(context)
        self._elect_offline_partitions(context)

    def _on_broker_failure(self, context: ControllerContext, broker_id: int) -> None:
        """Kafka's onBrokerFailure: its replicas go offline (out of ISRs; leader -1 where it
        led), then offline partitions get a leader from the live ISR if they have one."""
        context.shutting_down.discard(broker_id)
        for topic, partition, _replicas in list(context.partitions()):
            versioned = context.states.get((topic, partition))
            if versioned is None or broker_id not in versioned.state.isr:
                continue
            self._update_state(context, topic, partition, lambda current: (
                leadership.remove_replica_from_isr(current, broker_id, context.epoch)
                if current is not None else None))
        self._elect_offline_partitions(context)

    def _on_config_changed(self) -> None:
        """A topic config changed (Kafka's ``TopicUncleanLeaderElectionEnable``): offline
        partitions are elected again, unclean where the topic now allows it."""
        context = self._context
        if context is not None:
            self._elect_offline_partitions(context)

    def elect_offline_partitions(self) -> None:
        """Offline partitions elected again (event thread): after the broker's dynamic
        ``unclean.leader.election.enable`` became true, as Kafka's controller does."""
        self._elect_offline_partitions(self._active_context())

    # --- topics -----------------------------------------------------------------------------

    def _on_topics_changed(self) -> None:
        context = self._context
        if context is None:
            return
        names = set(self._zk.get_children(paths.TOPICS))
        for topic in set(context.assignments) - names:
            context.drop_topic(topic)
        added = names - set(context.assignments)
        if not added:
            return
        self._on_brokers_changed()  # brokers registered before the topic count as live
        for topic in sorted(added):
            read_topic(self._zk, context, topic)
            self._watch_assignment(topic)
        self._create_missing_states(context, added)

    def _watch_assignment(self, topic: str) -> None:
        """Kafka's PartitionModificationsHandler: partitions added to the assignment by anyone
        get their states. One watch per topic, until the topic's znode goes."""
        with self._lock:
            if topic in self._watched_topics:
                return
            self._watched_topics.add(topic)

        def on_assignment(data: bytes | None, _stat: Any) -> bool:
            if data is None or self._stopping:
                with self._lock:
                    self._watched_topics.discard(topic)
                return False
            self._enqueue(f"partitions:{topic}", lambda: self._on_partitions_changed(topic))
            return True

        self._zk.DataWatch(paths.topic_path(topic), on_assignment)

    def _on_partitions_changed(self, topic: str) -> None:
        context = self._context
        if context is None or topic not in context.assignments:
            return
        known = set(context.assignments[topic].partitions)
        read_topic(self._zk, context, topic)
        if topic in context.assignments and set(context.assignments[topic].partitions) != known:
            self._create_missing_states(context, {topic})

    def create_topic(self, name: str, partitions: int, replication_factor: int,
                     configs: dict[str, str], manual_assignment=None) -> dict[int, records.PartitionState]:
        """CreateTopics on the controller (event thread): assignment and config as
        AdminZkClient writes them, then the partition states; the states written."""
        context = self._active_context()
        self._on_brokers_changed()  # the assignment is made over brokers live now
        topic_admin.create_topic_assignment(self._zk, name, partitions, replication_factor,
                                            configs, manual_assignment=manual_assignment)
        read_topic(self._zk, context, name)
        self._watch_assignment(name)
        self._create_missing_states(context, {name})
        return self._topic_states(context, name)

    def create_partitions(self, topic: str, partition_count: int, manual_assignment=None):
        """CreatePartitions on the controller (event thread); the states of the new partitions."""
        context = self._active_context()
        self._on_brokers_changed()
        added = topic_admin.add_partitions(self._zk, topic, partition_count, manual_assignment)
        read_topic(self._zk, context, topic)
        self._create_missing_states(context, {topic})
        states = self._topic_states(context, topic)
        return {partition: states.get(partition) for partition in added}

    @staticmethod
    def _topic_states(context: ControllerContext, topic: str) -> dict[int, records.PartitionState]:
        assignment = context.assignments.get(topic)
        return {
            partition: context.states[(topic, partition)].state
            for partition in (assignment.partitions if assignment else ())
            if (topic, partition) in context.states
        }

    # --- reads for the admin handlers (event thread) ---------------------------------------

    def topic_names(self) -> list[str]:
        self._on_topics_changed()
        return sorted(self._active_context().assignments)

    def assignment(self, topic: str) -> records.TopicAssignment:
        context = self._active_context()
        if topic not in context.assignments:
            read_topic(self._zk, context, topic)
        if topic not in context.assignments:
            raise UnknownTopicOrPartition(f"The topic '{topic}' does not exist.")
        return context.assignments[topic]

    def topic_name_for_id(self, topic_id: bytes) -> str:
        self._on_topics_changed()
        for name, assignment in self._active_context().assignments.items():
            if assignment.topic_id == topic_id:
                return name
        raise UnknownTopicId(f"Topic id {uuid.UUID(bytes=topic_id)} does not exist.")

    def live_broker_ids(self) -> list[int]:
        self._on_brokers_changed()
        return sorted(self._active_context().live_brokers)

    # --- deletion ---------------------------------------------------------------------------

    def delete_topic(self, topic: str) -> None:
        """DeleteTopics on the controller (event thread): mark, then delete at once."""
        self._active_context()
        topic_admin.request_topic_deletion(self._zk, topic)
        self._on_deletions_requested()

    def _on_deletions_requested(self) -> None:
        context = self._context
        if context is None:
            return
        for topic in sorted(self._zk.get_children(paths.DELETE_TOPICS)):
            self._delete_topic_znodes(context, topic)

    def _delete_topic_znodes(self, context: ControllerContext, topic: str) -> None:
        doomed = self._topic_tree(topic)
        if self._zk.exists(paths.topic_config_path(topic)) is not None:
            doomed.append(paths.topic_config_path(topic))
        doomed.append(paths.delete_topic_path(topic))

        def build(transaction) -> None:
            for path in doomed:
                transaction.delete(path)

        results = self._commit_fenced(build)
        if any(isinstance(result, Exception) for result in results):
            log.warning("controller %d: deleting topic %s raced with a change (%r); retried",
                        self.broker_id, topic, results)
            self._enqueue("deletions", self._on_deletions_requested)
            return
        context.drop_topic(topic)
        log.info("controller %d: deleted topic %s", self.broker_id, topic)

    def _topic_tree(self, topic: str) -> list[str]:
        """Znodes of the topic, children first; empty when the topic does not exist."""
        if self._zk.exists(paths.topic_path(topic)) is None:
            return []
        tree: list[str] = []
        partitions_path = paths.topic_partitions_path(topic)
        if self._zk.exists(partitions_path) is not None:
            for partition in self._zk.get_children(partitions_path):
                partition_path = f"{partitions_path}/{partition}"
                tree += [f"{partition_path}/{child}" for child in self._zk.get_children(partition_path)]
                tree.append(partition_path)
            tree.append(partitions_path)
        tree.append(paths.topic_path(topic))
        return tree

    # --- controlled shutdown ----------------------------------------------------------------

    def _on_shutdowns_requested(self) -> None:
        context = self._context
        if context is None:
            return
        for child in sorted(self._zk.get_children(topic_admin.CONTROLLED_SHUTDOWN)):
            if child.isdigit() and int(child) in context.live_brokers:
                self._serve_controlled_shutdown(context, int(child))

    def _serve_controlled_shutdown(self, context: ControllerContext, broker_id: int) -> None:
        path = topic_admin.controlled_shutdown_path(broker_id)
        try:
            data, stat = self._zk.get(path)
        except NoNodeError:
            return
        broker_epoch, answered = topic_admin.decode_controlled_shutdown(data)
        if answered is not None:
            return
        context.shutting_down.add(broker_id)
        self._refresh_all_states(context)
        remaining = self._move_leadership_away(context, broker_id)
        answer = topic_admin.encode_controlled_shutdown_answer(broker_epoch, remaining)
        self._commit_fenced(lambda transaction: transaction.set_data(path, answer, version=stat.version))
        log.info("controller %d: controlled shutdown of broker %d, %d partition(s) still led",
                 self.broker_id, broker_id, len(remaining))

    def _move_leadership_away(self, context: ControllerContext, broker_id: int) -> list[tuple[str, int]]:
        """Kafka's doControlledShutdown: partitions with other replicas get a new leader and
        lose the broker from their ISR; single-replica partitions stay until it stops."""
        electable = context.electable_brokers()
        for topic, partition, replicas in list(context.partitions()):
            versioned = context.states.get((topic, partition))
            if versioned is None or len(replicas) < 2 or broker_id not in versioned.state.isr:
                continue

            def move(current, r=replicas):
                if current is None or broker_id not in current.isr:
                    return None
                if current.leader == broker_id:
                    return leadership.elect_for_controlled_shutdown(
                        r, current, electable, context.shutting_down, context.epoch)
                return leadership.remove_replica_from_isr(current, broker_id, context.epoch)

            self._update_state(context, topic, partition, move)
        return [
            (topic, partition) for topic, partition, replicas in context.partitions()
            if len(replicas) > 1 and (topic, partition) in context.states
            and context.states[(topic, partition)].state.leader == broker_id
        ]

    # --- ElectLeaders -----------------------------------------------------------------------

    def elect_leaders(self, election_type: int, partitions: list[tuple[str, int]] | None
                      ) -> dict[tuple[str, int], KafkaError | None]:
        """ElectLeaders on the controller (event thread): per partition None (elected) or the
        error Kafka answers. ``partitions`` None means every partition; those needing no
        election are then left out, as Kafka does."""
        context = self._active_context()
        every = partitions is None
        targets = [(t, p) for t, p, _ in context.partitions()] if every else partitions
        results = {}
        for topic, partition in targets:
            outcome = self._elect_one(context, election_type, topic, partition)
            if not (every and isinstance(outcome, ElectionNotNeeded)):
                results[(topic, partition)] = outcome
        return results

    def _elect_one(self, context: ControllerContext, election_type: int, topic: str, partition: int):
        versioned = context.states.get((topic, partition))
        if versioned is None or topic not in context.assignments:
            return UnknownTopicOrPartition(f"The partition {topic}-{partition} does not exist.")
        replicas, electable = context.replicas(topic, partition), context.electable_brokers()
        if election_type == ELECTION_TYPE_PREFERRED:
            if versioned.state.leader == replicas[0]:
                return ElectionNotNeeded("Leader election not needed for topic partition.")
            elect = lambda current: leadership.elect_preferred_leader(  # noqa: E731
                replicas, current, electable, context.epoch) if current else None
            failure = PreferredLeaderNotAvailable(
                f"Failed to elect leader for partition {topic}-{partition} under strategy "
                "PreferredReplicaPartitionLeaderElectionStrategy")
        else:
            if versioned.state.leader in electable:
                return ElectionNotNeeded("Leader election not needed for topic partition.")
            elect = lambda current: leadership.elect_offline_leader(  # noqa: E731
                replicas, current, electable, context.epoch, unclean_leader_election=True) \
                if current else None
            failure = EligibleLeadersNotAvailable(
                f"Failed to elect leader for partition {topic}-{partition} under strategy "
                "OfflinePartitionLeaderElectionStrategy")
        if self._update_state(context, topic, partition, elect) is None:
            return failure
        return None

    # --- partition reassignment (KIP-455 in ZooKeeper mode) ---------------------------------

    def alter_partition_reassignments(
        self, targets: dict[tuple[str, int], tuple[int, ...] | None],
        allow_replication_factor_change: bool = True,
    ) -> dict[tuple[str, int], KafkaError | None]:
        """AlterPartitionReassignments on the controller (event thread): per partition None
        (started, or completed at once) or Kafka's error. A target of None cancels."""
        context = self._active_context()
        self._on_brokers_changed()
        return {
            (topic, partition): self._reassign(context, topic, partition, target,
                                               allow_replication_factor_change)
            for (topic, partition), target in targets.items()
        }

    def _reassign(self, context: ControllerContext, topic: str, partition: int,
                  target: tuple[int, ...] | None, allow_replication_factor_change: bool) -> KafkaError | None:
        if topic not in context.assignments:
            read_topic(self._zk, context, topic)
        if (topic not in context.assignments or partition not in context.assignments[topic].partitions
                or self._zk.exists(paths.delete_topic_path(topic)) is not None):
            return UnknownTopicOrPartition("The partition does not exist.")
        current = reassignment.of(context.assignments[topic], partition)
        if target is None:
            if not current.is_being_reassigned:
                return NoReassignmentInProgress("No partition reassignment is in progress.")
            target = current.origin
        else:
            error = reassignment.check_target(current, target, context.live_brokers,
                                              allow_replication_factor_change)
            if error is not None:
                return error
        self._on_partition_reassignment(context, topic, partition, current.reassign_to(target))
        return None

    def _on_partition_reassignment(self, context: ControllerContext, topic: str, partition: int,
                                   wanted: reassignment.ReplicaAssignment) -> None:
        """Kafka's ``onPartitionReassignment``: write RS/AR/RR (replicas no longer wanted by a
        replaced reassignment leave the ISR), then either bump the leader epoch and wait for
        TRS to join the ISR, or complete at once."""
        current = reassignment.of(context.assignments[topic], partition)
        if current != wanted:
            if not self._write_replica_assignment(context, topic, partition, wanted):
                return
            unneeded = [r for r in current.replicas if r not in wanted.replicas]
            if unneeded:
                self._update_state(context, topic, partition, lambda state: leadership.remove_replicas_from_isr(
                    state, unneeded, context.epoch) if state is not None else None)
        self._refresh_state(context, topic, partition)
        versioned = context.states.get((topic, partition))
        if versioned is not None and reassignment.is_complete(wanted, versioned.state.isr):
            self._complete_reassignment(context, topic, partition, wanted)
            return
        self._update_state(context, topic, partition, lambda state: leadership.bump_leader_epoch(
            state, context.epoch) if state is not None else None)
        self._watch_reassignment(topic, partition)

    def _complete_reassignment(self, context: ControllerContext, topic: str, partition: int,
                               done: reassignment.ReplicaAssignment) -> None:
        """TRS is in the ISR: leadership into TRS, then RS = TRS (the brokers learn the new
        replica set from the assignment, as Kafka's learn it from B3's LeaderAndIsr, so the
        leader no longer takes RR back into the ISR), then RR out of the ISR."""
        final = done.completed()
        electable = context.electable_brokers()
        led = self._update_state(context, topic, partition, lambda state: leadership.elect_reassigned_leader(
            final.replicas, state, electable, context.epoch) if state is not None else None)
        if led is None:
            log.warning("controller %d: no live leader in %s for reassigned %s-%d; completed later",
                        self.broker_id, list(final.replicas), topic, partition)
            return
        if not self._write_replica_assignment(context, topic, partition, final):
            return
        if done.removing:
            self._update_state(context, topic, partition, lambda state: leadership.remove_replicas_from_isr(
                state, done.removing, context.epoch) if state is not None else None)
        log.info("controller %d: reassignment of %s-%d to %s completed", self.broker_id, topic,
                 partition, list(final.replicas))

    def _write_replica_assignment(self, context: ControllerContext, topic: str, partition: int,
                                  wanted: reassignment.ReplicaAssignment) -> bool:
        """The partition's RS/AR/RR into ``/brokers/topics/<t>``, a read-modify-write
        conditional on the assignment's zkVersion (partitions may be added meanwhile)."""
        path = paths.topic_path(topic)
        for _attempt in range(MAX_STATE_WRITE_ATTEMPTS):
            try:
                data, stat = self._zk.get(path)
            except NoNodeError:
                return False
            assignment = reassignment.put(records.decode_topic_assignment(topic, data), partition, wanted)
            encoded = records.encode_topic_assignment(assignment)
            results = self._commit_fenced(
                lambda transaction, e=encoded, v=stat.version: transaction.set_data(path, e, version=v))
            if not any(isinstance(result, Exception) for result in results):
                context.assignments[topic] = assignment
                return True
        log.warning("controller %d: the assignment of %s kept changing; reassignment of "
                    "partition %d not written", self.broker_id, topic, partition)
        return False

    def _watch_reassignment(self, topic: str, partition: int) -> None:
        """Kafka's ``PartitionReassignmentIsrChangeHandler``: each change of the state of a
        partition being reassigned checks whether TRS joined the ISR."""
        key = (topic, partition)
        with self._lock:
            if key in self._reassignment_watches:
                return
            self._reassignment_watches.add(key)

        def on_state(data: bytes | None, _stat: Any) -> bool:
            with self._lock:
                watching = key in self._reassignment_watches and not self._stopping
            if data is None or not watching:
                with self._lock:
                    self._reassignment_watches.discard(key)
                return False
            self._enqueue(f"reassign:{topic}:{partition}",
                          lambda: self._maybe_complete_reassignment(topic, partition))
            return True

        self._zk.DataWatch(paths.partition_state_path(topic, partition), on_state)

    def _maybe_complete_reassignment(self, topic: str, partition: int) -> None:
        context = self._context
        ongoing = context is not None and topic in context.assignments and reassignment.of(
            context.assignments[topic], partition).is_being_reassigned
        if ongoing:
            wanted = reassignment.of(context.assignments[topic], partition)
            self._refresh_state(context, topic, partition)
            versioned = context.states.get((topic, partition))
            if versioned is not None and reassignment.is_complete(wanted, versioned.state.isr):
                self._complete_reassignment(context, topic, partition, wanted)
            ongoing = reassignment.of(context.assignments[topic], partition).is_being_reassigned
        if not ongoing:
            with self._lock:
                self._reassignment_watches.discard((topic, partition))

    def _resume_reassignments(self, context: ControllerContext) -> None:
        """A new controller takes over the reassignments in the assignments' AR/RR."""
        for topic, partition, _replicas in list(context.partitions()):
            if reassignment.of(context.assignments[topic], partition).is_being_reassigned:
                self._watch_reassignment(topic, partition)
                self._maybe_complete_reassignment(topic, partition)

    def list_partition_reassignments(self, partitions: list[tuple[str, int]] | None
                                     ) -> dict[tuple[str, int], reassignment.ReplicaAssignment]:
        """ListPartitionReassignments on the controller (event thread): the ongoing ones among
        ``partitions`` (None: all); unknown partitions are left out, as Kafka does."""
        context = self._active_context()
        keys = [(t, p) for t, p, _ in context.partitions()] if partitions is None else partitions
        ongoing = {}
        for topic, partition in keys:
            assignment = context.assignments.get(topic)
            if assignment is not None and partition in assignment.partitions:
                replica_assignment = reassignment.of(assignment, partition)
                if replica_assignment.is_being_reassigned:
                    ongoing[(topic, partition)] = replica_assignment
        return ongoing

    # --- automatic preferred-leader rebalance ------------------------------------------------

    def _seconds_to_rebalance_check(self) -> float | None:
        """How long the event thread may wait for an event before the next imbalance check;
        None: no check is due (rebalance disabled, or not the active controller)."""
        if math.isinf(self._next_rebalance_check_s):
            return None
        return max(0.0, self._next_rebalance_check_s - time.monotonic())

    def _check_leader_imbalance(self) -> None:
        """Kafka's ``checkAndTriggerAutoLeaderRebalance``: per preferred leader (first replica),
        the share of its partitions led by another broker; above
        ``leader.imbalance.per.broker.percentage``, a preferred election for those whose
        preferred replica is live and in the ISR."""
        context = self._context
        if context is None:
            return
        self._refresh_all_states(context)  # leaders expand ISRs themselves
        by_preferred: dict[int, list[tuple[str, int]]] = {}
        for topic, partition, replicas in context.partitions():
            if replicas and (topic, partition) in context.states:
                by_preferred.setdefault(replicas[0], []).append((topic, partition))
        electable = context.electable_brokers()
        threshold = self._leader_rebalance.imbalance_per_broker_percentage / 100
        for preferred, partitions in sorted(by_preferred.items()):
            not_led = [(t, p) for t, p in partitions if context.states[(t, p)].state.leader != preferred]
            if not not_led or len(not_led) / len(partitions) <= threshold:
                continue
            for topic, partition in not_led:
                state = context.states[(topic, partition)].state
                if preferred in electable and preferred in state.isr:
                    self._elect_one(context, ELECTION_TYPE_PREFERRED, topic, partition)
