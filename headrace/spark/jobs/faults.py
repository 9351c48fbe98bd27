"""Fault hooks of the pipeline jobs: crash points on the driver, a failing task on executors.

Owns the two switches the crash tests use to stop a job at a chosen moment:

- ``HEADRACE_JOB_CRASH_AT=<point>``: the driver SIGKILLs itself when it reaches ``<point>``
  (one of ``CRASH_POINTS``, see ``headrace.spark.jobs.load``). ``crash_hook_from_env`` returns
  the hook a job calls at each point; without the variable it does nothing.
- ``HEADRACE_JOB_TASK_FAULT_MARKER=<path>``: ``fail_first_task`` wraps a DataFrame so that the
  first task to run creates the marker file (O_EXCL) and raises; every later attempt passes its
  rows through unchanged. The marker path must be visible to every executor (local
  mode, or a shared file system).

Both are read once per job; the hooks hold no state besides the marker file.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

CRASH_AT_ENV = "HEADRACE_JOB_CRASH_AT"
TASK_FAULT_MARKER_ENV = "HEADRACE_JOB_TASK_FAULT_MARKER"

CrashHook = Callable[[str], None]


class InjectedTaskFault(RuntimeError):
    """Raised once by the task that wins the marker file."""


def no_crash(point: str) -> None:
    """The default hook: carry on."""


def _sigkill_self(point: str) -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def crash_hook_from_env(known_points: tuple[str, ...]) -> CrashHook:
    """The hook for ``$HEADRACE_JOB_CRASH_AT``: SIGKILL at that point, nothing elsewhere."""
    wanted = os.environ.get(CRASH_AT_ENV)
    if not wanted:
        return no_crash
    if wanted not in known_points:
        raise ValueError(f"{CRASH_AT_ENV}={wanted!r}: expected one of {', '.join(known_points)}")

    def hook(point: str) -> None:
        if point == wanted:
            _sigkill_self(point)

    return hook


def _claim_marker(marker_path: str) -> bool:
    try:
        descriptor = os.open(marker_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(descriptor)
    return True


def fail_first_task(frame, marker_path: str):
    """``frame`` filtered by a row UDF whose first call (across tasks) raises.

    A plain Python UDF (no pandas needed), marked non-deterministic so the optimizer keeps it.
    """
    from pyspark.sql import functions as F

    def keep(_row_marker: bool) -> bool:
        if _claim_marker(marker_path):
            raise InjectedTaskFault(f"injected task failure (marker {marker_path})")
        return True

    keep_udf = F.udf(keep, "boolean", useArrow=False).asNondeterministic()
    return frame.where(keep_udf(F.lit(True)))


def task_fault_from_env(frame):
    """``frame`` wrapped by ``fail_first_task`` when the marker variable is set."""
    marker_path = os.environ.get(TASK_FAULT_MARKER_ENV)
    return fail_first_task(frame, marker_path) if marker_path else frame
