"""The history of a fault run: every operation clients and nemeses performed, in order.

An operation is recorded twice, as Jepsen records it: an ``invoke`` when a process starts it
and a completion when it ends: ``ok`` (it happened), ``fail`` (it certainly did not happen) or
``info`` (unknown: a send whose acknowledgement never came may or may not be in the log).
Nemesis actions are single ``info`` operations of process ``"nemesis"``.

Fields (``Op``): ``index`` (position in the history), ``type`` (invoke/ok/fail/info),
``process`` (who: "producer-0", "consumer-assign", "nemesis", ...), ``time_ns`` (monotonic
nanoseconds since the run began), ``f`` (what: send, poll, append, read, or a nemesis action
such as kill, restart, pause, resume, power-cut, clock-skew), ``value``, ``partition``,
``offset`` and ``error`` (a short text on fail/info completions).

Values by ``f``: send/append: the value (a unique string) with the partition, and on ``ok`` the
offset it got; poll: on ``ok``, a list of ``[partition, offset, value]`` records one poll
returned; read: the partition, and on ``ok`` a list of ``[offset, value]`` -- the whole
partition from its start; nemesis actions: whatever the action reports (a dict or null).

File format: JSON Lines, one ``Op`` per line as a JSON object with exactly the field names
above (``null`` where absent), in ``index`` order; ``load`` reads it back to equal ops.

Thread-safety: ``History.record`` may be called from any thread (an atomic counter and
append); ``ops`` returns a copy in index order.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

INVOKE, OK, FAIL, INFO = "invoke", "ok", "fail", "info"
OP_TYPES = (INVOKE, OK, FAIL, INFO)
NEMESIS = "nemesis"
POWER_CUT = "power-cut"


@dataclass(frozen=True, slots=True)
class Op:
    index: int
    type: str
    process: str
    time_ns: int
    f: str
    value: Any = None
    partition: int | None = None
    offset: int | None = None
    error: str | None = None

    def __post_init__(self) -> None:
        if self.type not in OP_TYPES:
            raise ValueError(f"operation type {self.type!r} is not one of {OP_TYPES}")


class History:
    """An append-only, thread-safe list of ``Op`` with times from one monotonic origin."""

    def __init__(self, clock_ns=time.monotonic_ns) -> None:
        self._clock_ns = clock_ns
        self._origin_ns = clock_ns()
        self._ops: list[Op] = []
        self._indexes = itertools.count()

    def record(self, type: str, process: str, f: str, value: Any = None, *,
               partition: int | None = None, offset: int | None = None,
               error: str | None = None) -> Op:
        # No lock: next() on a count and list.append are atomic under the GIL, and a lock
        # taken here can be held when librdkafka re-enters Python in another thread's flush.
        op = Op(next(self._indexes), type, process, self._clock_ns() - self._origin_ns, f,
                value, partition, offset, error)
        self._ops.append(op)
        return op

    def ops(self) -> list[Op]:
        return sorted(self._ops, key=lambda op: op.index)


def dump(ops: Iterable[Op], path: Path) -> None:
    """Write ``ops`` to ``path`` in the JSON Lines format of this module's docstring."""
    with path.open("w") as output:
        for op in ops:
            output.write(json.dumps(asdict(op), separators=(",", ":")) + "\n")


def load(path: Path) -> list[Op]:
    """Read a history written by ``dump``."""
    with path.open() as source:
        return [Op(**json.loads(line)) for line in source if line.strip()]


def build(rows: Iterable[tuple]) -> list[Op]:
    """A history from hand-written rows ``(type, process, f, value, partition, offset)``
    (trailing fields optional), one nanosecond apart: for checker tests."""
    ops = []
    for index, row in enumerate(rows):
        type_, process, f, *rest = row
        rest += [None] * (3 - len(rest))
        ops.append(Op(index, type_, process, index, f, rest[0], rest[1], rest[2]))
    return ops


def completions(ops: Iterable[Op], f: str, type_: str = OK) -> list[Op]:
    """The completions of type ``type_`` of operations ``f``, in history order."""
    return [op for op in ops if op.f == f and op.type == type_]


def power_cut_times_ns(ops: Iterable[Op]) -> list[int]:
    """When the nemesis cut the power, in history order."""
    return [op.time_ns for op in ops if op.process == NEMESIS and op.f == POWER_CUT]
