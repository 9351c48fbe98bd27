"""Nemeses of the cluster target (``headrace.faults.cluster.FaultCluster``): process faults on
brokers and ZooKeeper nodes, and iptables cuts between chosen node pairs.

Kinds (the names in ``--nemesis`` and in a run's ``faults`` counts):

- ``kill``: SIGKILL a broker; heal starts it again once its registration expired (put off,
  and retried at later actions, while other faults keep it from ZooKeeper).
- ``pause``: SIGSTOP the leader of a seeded partition for longer than the session timeout
  (ZooKeeper expires it, the controller elects another leader); heal is SIGCONT.
- ``power``: power loss of a broker (only what it fsynced stays); heal restarts it.
- ``zk-kill``: SIGKILL one ZooKeeper node (its data directory stays); heal restarts it.
- ``leader-zk``: the leader of a seeded partition cut from every ZooKeeper node, both ways.
- ``leader-followers``: that leader cut from the other brokers, both ways.
- ``split``: a minority (one broker and one ZooKeeper node, seeded) cut from the majority,
  both ways.
- ``one-way``: packets from one seeded node to another dropped, not back.

Process faults pick among brokers no other process fault holds (``BrokerClaims``), so
overlapping faults never kill a paused broker or restart one another still holds. Every cut is
an iptables rule healed by its id. Thread-safety: driven by the runner's thread alone.
"""

from __future__ import annotations

import random
from dataclasses import asdict

from headrace.faults.cluster import (
    BROKER_HOSTS,
    REGISTRATION_EXPIRY_WAIT_S,
    SESSION_TIMEOUT_MS,
    ZOOKEEPER_HOSTS,
    FaultCluster,
)
from headrace.faults.history import POWER_CUT
from headrace.faults.namespace import Cut
from headrace.faults.nemesis import Action, Nemesis

PAUSE_BEYOND_SESSION_TIMEOUT_S = 1.0
CLUSTER_NEMESIS_KINDS = ("kill", "pause", "power", "zk-kill", "leader-zk", "leader-followers",
                         "split", "one-way")


class BrokerClaims:
    """Which brokers a process fault currently holds."""

    def __init__(self) -> None:
        self.held: set[int] = set()

    def free(self) -> list[int]:
        return sorted(set(BROKER_HOSTS) - self.held)


class LeaderChoice:
    """A seeded partition's leader, as ZooKeeper names it (a seeded broker without one)."""

    def __init__(self, cluster: FaultCluster, topic: str, partitions: int) -> None:
        self.cluster = cluster
        self.topic = topic
        self.partitions = partitions

    def pick(self, rng: random.Random, among: list[int]) -> tuple[int, int]:
        partition = rng.randrange(self.partitions)
        leader = self.cluster.leader_of(self.topic, partition)
        fallback = rng.choice(among) if among else None
        return partition, leader if leader in among else fallback


class BrokerProcessNemesis(Nemesis):
    """A process fault on one broker at a time, chosen among the free ones."""

    def __init__(self, cluster: FaultCluster, claims: BrokerClaims) -> None:
        self.cluster = cluster
        self.claims = claims
        self.broker_id: int | None = None

    def choose(self, rng: random.Random) -> int | None:
        free = self.claims.free()
        return rng.choice(free) if free else None

    def inject(self, rng: random.Random) -> Action:
        broker_id = self.choose(rng)
        if broker_id is None:
            return Action(f"{self.kind}-skipped", {"reason": "every broker is held"})
        self.claims.held.add(broker_id)
        self.broker_id = broker_id
        return self.act(self.cluster.brokers[broker_id], rng)

    def heal(self) -> Action | None:
        if self.broker_id is None:
            return None
        broker_id, self.broker_id = self.broker_id, None
        try:
            return self.recover(broker_id)
        finally:
            self.claims.held.discard(broker_id)

    def act(self, broker, rng: random.Random) -> Action:
        raise NotImplementedError

    def recover(self, broker_id: int) -> Action:
        broker = self.cluster.brokers[broker_id]
        if self.cluster.restart_broker(broker_id, REGISTRATION_EXPIRY_WAIT_S):
            return Action("restart", {"node": broker.name, "pid": broker.pid})
        return Action("restart-put-off", {"node": broker.name})


class BrokerKillNemesis(BrokerProcessNemesis):
    kind = "kill"

    def act(self, broker, rng: random.Random) -> Action:
        pid = broker.pid
        broker.kill()
        return Action("kill", {"node": broker.name, "pid": pid})


class BrokerPowerNemesis(BrokerProcessNemesis):
    kind = "power"

    def act(self, broker, rng: random.Random) -> Action:
        outcome = broker.power_cut(random.Random(rng.getrandbits(32)))
        return Action(POWER_CUT, {"node": broker.name, **asdict(outcome)})


class LeaderPauseNemesis(BrokerProcessNemesis):
    kind = "pause"
    min_duration_s = SESSION_TIMEOUT_MS / 1000 + PAUSE_BEYOND_SESSION_TIMEOUT_S
    max_duration_s = min_duration_s + 2.0

    def __init__(self, cluster: FaultCluster, claims: BrokerClaims, leaders: LeaderChoice
                 ) -> None:
        super().__init__(cluster, claims)
        self.leaders = leaders

    def choose(self, rng: random.Random) -> int | None:
        return self.leaders.pick(rng, self.claims.free())[1]

    def act(self, broker, rng: random.Random) -> Action:
        broker.pause()
        return Action("pause", {"node": broker.name, "pid": broker.pid})

    def recover(self, broker_id: int) -> Action:
        broker = self.cluster.brokers[broker_id]
        broker.resume()
        return Action("resume", {"node": broker.name, "pid": broker.pid})


class ZooKeeperKillNemesis(Nemesis):
    kind = "zk-kill"

    def __init__(self, cluster: FaultCluster) -> None:
        self.cluster = cluster
        self.node_id: int | None = None

    def inject(self, rng: random.Random) -> Action:
        self.node_id = rng.choice(sorted(self.cluster.zookeepers))
        node = self.cluster.zookeepers[self.node_id]
        pid = node.pid
        node.kill()
        return Action("kill", {"node": node.name, "pid": pid})

    def heal(self) -> Action | None:
        if self.node_id is None:
            return None
        node_id, self.node_id = self.node_id, None
        self.cluster.restart_zookeeper(node_id)
        node = self.cluster.zookeepers[node_id]
        return Action("restart", {"node": node.name, "pid": node.pid})


class CutNemesis(Nemesis):
    """Cuts between node addresses, made by ``plan`` and healed rule by rule."""

    max_duration_s = 8.0

    def __init__(self, cluster: FaultCluster) -> None:
        self.cluster = cluster
        self.cuts: list[Cut] = []

    def plan(self, rng: random.Random) -> tuple[list[tuple[str, str]], dict]:
        """(source, destination) address pairs to cut, and what to record about them."""
        raise NotImplementedError

    def inject(self, rng: random.Random) -> Action:
        pairs, details = self.plan(rng)
        for source, destination in pairs:
            self.cuts.append(self.cluster.namespace.cut(source, destination))
        return Action(self.kind, {**details, "rules": [cut.rule_id for cut in self.cuts]})

    def heal(self) -> Action | None:
        if not self.cuts:
            return None
        rules = [cut.rule_id for cut in self.cuts]
        while self.cuts:
            self.cluster.namespace.heal(self.cuts.pop())
        return Action("heal", {"kind": self.kind, "rules": rules})


def both_ways(side: list[str], other: list[str]) -> list[tuple[str, str]]:
    return [pair for a in side for b in other for pair in ((a, b), (b, a))]


class LeaderFromZooKeeperNemesis(CutNemesis):
    kind = "leader-zk"

    def __init__(self, cluster: FaultCluster, leaders: LeaderChoice) -> None:
        super().__init__(cluster)
        self.leaders = leaders

    def plan(self, rng: random.Random):
        partition, leader = self.leaders.pick(rng, sorted(BROKER_HOSTS))
        return (both_ways([BROKER_HOSTS[leader]], list(ZOOKEEPER_HOSTS.values())),
                {"leader": leader, "partition": partition})


class LeaderFromFollowersNemesis(LeaderFromZooKeeperNemesis):
    kind = "leader-followers"

    def plan(self, rng: random.Random):
        partition, leader = self.leaders.pick(rng, sorted(BROKER_HOSTS))
        followers = [host for b, host in BROKER_HOSTS.items() if b != leader]
        return (both_ways([BROKER_HOSTS[leader]], followers),
                {"leader": leader, "partition": partition})


class SplitNemesis(CutNemesis):
    kind = "split"

    def plan(self, rng: random.Random):
        broker = rng.choice(sorted(BROKER_HOSTS))
        zookeeper = rng.choice(sorted(ZOOKEEPER_HOSTS))
        minority = [BROKER_HOSTS[broker], ZOOKEEPER_HOSTS[zookeeper]]
        majority = [host for host in [*BROKER_HOSTS.values(), *ZOOKEEPER_HOSTS.values()]
                    if host not in minority]
        return both_ways(minority, majority), {"minority": minority}


class OneWayNemesis(CutNemesis):
    kind = "one-way"

    def plan(self, rng: random.Random):
        hosts = [*BROKER_HOSTS.values(), *ZOOKEEPER_HOSTS.values()]
        source = rng.choice(hosts)
        destination = rng.choice([host for host in hosts if host != source])
        return [(source, destination)], {"from": source, "to": destination}


def cluster_nemeses(kinds: tuple[str, ...], cluster: FaultCluster, topic: str,
                    partitions: int) -> dict[str, Nemesis]:
    """The nemeses of ``kinds`` against ``cluster``, sharing broker claims and leader lookups."""
    claims = BrokerClaims()
    leaders = LeaderChoice(cluster, topic, partitions)
    makers = {
        "kill": lambda: BrokerKillNemesis(cluster, claims),
        "pause": lambda: LeaderPauseNemesis(cluster, claims, leaders),
        "power": lambda: BrokerPowerNemesis(cluster, claims),
        "zk-kill": lambda: ZooKeeperKillNemesis(cluster),
        "leader-zk": lambda: LeaderFromZooKeeperNemesis(cluster, leaders),
        "leader-followers": lambda: LeaderFromFollowersNemesis(cluster, leaders),
        "split": lambda: SplitNemesis(cluster),
        "one-way": lambda: OneWayNemesis(cluster),
    }
    return {kind: makers[kind]() for kind in kinds}
