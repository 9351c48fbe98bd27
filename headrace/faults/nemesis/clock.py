"""Clock skew of one node (libfaketime, ``Node.set_clock_offset_s``): its wall clock jumps
forward or back by a seeded number of seconds, up to ``max_skew_s``, and back to true on heal.
Monotonic clocks stay true. Thread-safety: driven by the runner's thread alone.
"""

from __future__ import annotations

import random

from headrace.faults.nemesis import Action, Nemesis
from headrace.faults.node import Node

MAX_SKEW_S = 3_600


class ClockNemesis(Nemesis):
    kind = "clock"
    max_duration_s = 3.0

    def __init__(self, node: Node, max_skew_s: int = MAX_SKEW_S) -> None:
        self.node = node
        self.max_skew_s = max_skew_s
        self.skewed = False

    def inject(self, rng: random.Random) -> Action:
        offset_s = rng.choice((-1, 1)) * rng.randint(1, self.max_skew_s)
        self.node.set_clock_offset_s(offset_s)
        self.skewed = True
        return Action("clock-skew", {"node": self.node.name, "offset_s": offset_s})

    def heal(self) -> Action | None:
        if not self.skewed:
            return None
        self.node.set_clock_offset_s(0)
        self.skewed = False
        return Action("clock-reset", {"node": self.node.name})
