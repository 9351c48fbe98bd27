"""Network partitions inside the run's namespace: iptables rules between chosen addresses.

``PartitionNemesis`` cuts the clients' address from the broker's, seeded among three shapes:
requests dropped (clients to broker), answers dropped (broker to clients), or both ways. With
the cluster, the same mechanism cuts a leader from ZooKeeper or from its followers, and splits
majority from minority (a cut per address pair). Heal deletes the rules it made, by rule.
Thread-safety: driven by the runner's thread alone.
"""

from __future__ import annotations

import random

from headrace.faults.namespace import Namespace
from headrace.faults.nemesis import Action, Nemesis

SHAPES = ("to-broker", "from-broker", "both")


class PartitionNemesis(Nemesis):
    kind = "partition"
    max_duration_s = 4.0

    def __init__(self, namespace: Namespace, client_host: str, broker_host: str) -> None:
        self.namespace = namespace
        self.client_host = client_host
        self.broker_host = broker_host
        self.cuts = []

    def inject(self, rng: random.Random) -> Action:
        shape = rng.choice(SHAPES)
        if shape in ("to-broker", "both"):
            self.cuts.append(self.namespace.cut(self.client_host, self.broker_host))
        if shape in ("from-broker", "both"):
            self.cuts.append(self.namespace.cut(self.broker_host, self.client_host))
        return Action("partition", {"shape": shape, "rules": [c.rule_id for c in self.cuts]})

    def heal(self) -> Action | None:
        if not self.cuts:
            return None
        rules = [cut.rule_id for cut in self.cuts]
        for cut in self.cuts:
            self.namespace.heal(cut)
        self.cuts = []
        return Action("heal", {"rules": rules})
