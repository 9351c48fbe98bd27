"""Process faults on a node: SIGKILL then restart (``KillNemesis``), SIGSTOP then SIGCONT
(``PauseNemesis``, for longer than the session timeout, so group members expire).
Thread-safety: driven by the runner's thread alone.
"""

from __future__ import annotations

import random

from headrace.faults.nemesis import Action, Nemesis
from headrace.faults.node import Node

PAUSE_BEYOND_SESSION_TIMEOUT_S = 1.0


class KillNemesis(Nemesis):
    kind = "kill"

    def __init__(self, node: Node) -> None:
        self.node = node
        self.killed = False

    def inject(self, rng: random.Random) -> Action:
        pid = self.node.pid
        self.node.kill()
        self.killed = True
        return Action("kill", {"node": self.node.name, "pid": pid})

    def heal(self) -> Action | None:
        if not self.killed:
            return None
        self.node.start()
        self.killed = False
        return Action("restart", {"node": self.node.name, "pid": self.node.pid})


class PauseNemesis(Nemesis):
    kind = "pause"

    def __init__(self, node: Node, session_timeout_ms: int) -> None:
        self.node = node
        self.min_duration_s = session_timeout_ms / 1000 + PAUSE_BEYOND_SESSION_TIMEOUT_S
        self.max_duration_s = self.min_duration_s + 2.0
        self.paused = False

    def inject(self, rng: random.Random) -> Action:
        self.node.pause()
        self.paused = True
        return Action("pause", {"node": self.node.name, "pid": self.node.pid})

    def heal(self) -> Action | None:
        if not self.paused:
            return None
        self.node.resume()
        self.paused = False
        return Action("resume", {"node": self.node.name, "pid": self.node.pid})
