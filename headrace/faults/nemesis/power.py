"""Power loss of a broker: SIGKILL, then its data directory keeps only what it had fsynced,
with seeded torn tails of the rest (``BrokerNode.power_cut``); heal restarts it on what is
left. The ``power-cut`` action is what the checkers read as a cut (``history.POWER_CUT``).
Thread-safety: driven by the runner's thread alone.
"""

from __future__ import annotations

import random
from dataclasses import asdict

from headrace.faults.history import POWER_CUT
from headrace.faults.nemesis import Action, Nemesis
from headrace.faults.node import BrokerNode


class PowerNemesis(Nemesis):
    kind = "power"

    def __init__(self, node: BrokerNode) -> None:
        self.node = node
        self.down = False

    def inject(self, rng: random.Random) -> Action:
        outcome = self.node.power_cut(random.Random(rng.getrandbits(32)))
        self.down = True
        return Action(POWER_CUT, {"node": self.node.name, **asdict(outcome)})

    def heal(self) -> Action | None:
        if not self.down:
            return None
        self.node.start()
        self.down = False
        return Action("restart", {"node": self.node.name, "pid": self.node.pid})
