"""How many of the parallel consumer's workers should take runs: sized to the handler's cost.

Owns the adaptive-parallelism policy, a pure function of handler figures measured over a window
(no clock, no threads). Fanning records out over many threads pays only when handlers wait
(I/O, sleeps, C code that releases the GIL): a handler running Python holds the one interpreter
lock, so extra threads add hand-offs and lock contention but no throughput. The policy:

* ``HandlerWindow`` sums what the workers measured for the runs they completed in the window:
  runs, records, handler wall time and handler CPU time (the worker thread's own CPU clock), plus
  the window's length, the active workers and whether records were waiting while every active
  worker was busy for the whole window with nothing completing (a blocked handler).
* cheap: a mean run shorter than ``single_worker_max_run_us`` of wall time. If the handler also
  runs rather than waits (CPU / wall of its runs at least ``inline_min_duty``) and
  ``inline_allowed``: 0 workers, the *inline* mode -- the poll thread itself runs the runs
  between ``consume()`` calls: a run of a no-op handler costs less than handing it to another
  thread, and a second thread would only make the poll thread wait for the interpreter lock.
  The consumer leaves inline mode as soon as one run takes longer than the bound (see
  ``parallel_consumer``). A cheap handler that waits (a short sleep) -> 1 worker, the others
  sleep untouched.
* blocked: no run completed, all active workers busy, records waiting -> double the active
  workers (a handler that hangs must not stall the partitions behind it).
* otherwise the handler's *duty* is CPU / wall of its runs: the share of its time it needs the
  interpreter. ``cpu_share_max / duty`` workers together use about ``cpu_share_max`` of one
  interpreter, so that many workers are wanted (a 10 ms sleep with 20 us of CPU: all of them;
  a CPU-bound handler: 1). The workers grow to that number only while they are saturated (busy
  at least ``busy_fraction_to_grow`` of the window): when they idle, records are scarcer than
  workers (the poll thread, not the handler, is the bottleneck) and more threads cannot help.
  They shrink to it whenever it is lower. Lost CPU to other processes makes a handler look like
  it waits; the saturation condition keeps that from fanning out a cheap handler.

Thread-safety: pure functions over immutable values.
"""

from __future__ import annotations

from dataclasses import dataclass

SINGLE_WORKER_MAX_RUN_US_DEFAULT = 100
CPU_SHARE_MAX_DEFAULT = 0.8  # of one interpreter: the poll thread needs the rest
BUSY_FRACTION_TO_GROW_DEFAULT = 0.5
# A handler using at least this share of its runs' wall time as CPU runs rather than waits.
INLINE_MIN_DUTY_DEFAULT = 0.5
PARALLELISM_WINDOW_MS_DEFAULT = 50
NS_PER_US = 1_000


@dataclass(frozen=True, slots=True)
class ParallelismLimits:
    """Knobs of the policy; see the module doc."""

    max_workers: int
    single_worker_max_run_us: int = SINGLE_WORKER_MAX_RUN_US_DEFAULT
    cpu_share_max: float = CPU_SHARE_MAX_DEFAULT
    busy_fraction_to_grow: float = BUSY_FRACTION_TO_GROW_DEFAULT
    inline_min_duty: float = INLINE_MIN_DUTY_DEFAULT
    inline_allowed: bool = True  # False: handlers never run on the poll thread


@dataclass(frozen=True, slots=True)
class HandlerWindow:
    """Handler figures of the runs completed in one window, and the workers' state at its end."""

    runs: int
    records: int
    handler_wall_ns: int
    handler_cpu_ns: int
    window_ns: int
    active_workers: int  # 0: the poll thread ran the runs (inline mode)
    blocked: bool  # no run completed, every active worker busy, records waiting


def target_workers(window: HandlerWindow, limits: ParallelismLimits) -> int:
    """The number of workers that should take runs after ``window``; 0: run them inline."""
    active = window.active_workers
    if window.runs == 0:
        return min(limits.max_workers, max(1, active * 2)) if window.blocked else active
    mean_run_us = window.handler_wall_ns / window.runs / NS_PER_US
    if mean_run_us < limits.single_worker_max_run_us:
        duty = window.handler_cpu_ns / max(1, window.handler_wall_ns)
        return 0 if limits.inline_allowed and duty >= limits.inline_min_duty else 1
    active = max(1, active)
    wanted = _workers_for_duty(window, limits)
    busy_fraction = window.handler_wall_ns / max(1, active * window.window_ns)
    if busy_fraction < limits.busy_fraction_to_grow:
        return min(active, wanted)
    return wanted


def _workers_for_duty(window: HandlerWindow, limits: ParallelismLimits) -> int:
    if window.handler_cpu_ns <= 0:
        return limits.max_workers
    duty = window.handler_cpu_ns / max(1, window.handler_wall_ns)
    return max(1, min(limits.max_workers, int(limits.cpu_share_max / duty)))
