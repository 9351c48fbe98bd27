"""Nemeses: faults the runner injects and heals on a seeded schedule.

A ``Nemesis`` has a ``kind`` (the name in ``--nemesis`` and in a run's ``faults`` counts),
``inject(rng)`` and ``heal()``, each returning the ``Action`` to record in the history: its
name (``f`` of a ``nemesis`` info operation, e.g. kill / restart) and details. ``heal`` is
idempotent: the runner calls it again for every nemesis at the end of a run.
``min_duration_s`` is how long a fault must last to mean something (a pause longer than the
session timeout).
Thread-safety: the runner's thread alone drives nemeses.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Action:
    name: str
    details: Any = None


class Nemesis:
    kind = "none"
    min_duration_s = 0.5
    max_duration_s = 2.0

    def inject(self, rng: random.Random) -> Action:
        raise NotImplementedError

    def heal(self) -> Action | None:
        """End the fault; None when nothing was in effect."""
        raise NotImplementedError
