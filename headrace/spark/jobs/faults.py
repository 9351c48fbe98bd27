"""Fault hooks of the pipeline jobs: crash points on the driver, a failing task on executors.

Owns the two switches the crash tests use to stop a job at a chosen moment:

- ``HEADRACE_JOB_CRASH_AT=<point>``: the driver SIGKILLs itself when it reaches ``<point>``
  (one of ``CRASH_POINTS``, see ``headrace.spark.jobs.load``). ``crash_hook_from_env`` returns
  the hook a job calls at each point; without the variable it does nothing.
- ``HEADRACE_JOB_TASK_FAULT_MARKER=<path>``: ``fail_first_task`` wraps a DataFrame so that the
  first task to run creates the marker file (O_EXCL) and raises; every later attempt passes its
  rows through unchanged. The marker path must be visible to every executor (local
  mode, or a shared file system).
- ``HEADRACE_JOB_TASK_PAUSE_DIR=<dir>`` with ``HEADRACE_JOB_TASK_PAUSE_OFFSET=<offset>``:
  ``pause_first_attempts`` wraps a DataFrame so that the first attempt of every task, on
  reaching the record at that offset, creates ``<dir>/paused-<partition>-<pid>`` (pid of the
  executor's Python worker) and waits until ``<dir>/resume`` exists, at most
  ``TASK_PAUSE_TIMEOUT_S``; retried attempts never pause. A test kills a worker while its task
  is known to be in flight, then resumes the others. ``<dir>`` must be visible to every
  executor.

The switches are read once per job, on the driver (executors get the values in the wrapped
plan, not from their own environment); the hooks hold no state besides their files.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

CRASH_AT_ENV = "HEADRACE_JOB_CRASH_AT"
TASK_FAULT_MARKER_ENV = "HEADRACE_JOB_TASK_FAULT_MARKER"
TASK_PAUSE_DIR_ENV = "HEADRACE_JOB_TASK_PAUSE_DIR"
TASK_PAUSE_OFFSET_ENV = "HEADRACE_JOB_TASK_PAUSE_OFFSET"
PAUSED_FILE_PREFIX = "paused-"
RESUME_FILE_NAME = "resume"
TASK_PAUSE_TIMEOUT_S = 300
TASK_PAUSE_POLL_S = 0.05

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


def _pause_until_resumed(pause_dir: str, partition_id: int) -> None:
    Path(pause_dir, f"{PAUSED_FILE_PREFIX}{partition_id}-{os.getpid()}").touch()
    resume_path = Path(pause_dir, RESUME_FILE_NAME)
    deadline = time.monotonic() + TASK_PAUSE_TIMEOUT_S
    while not resume_path.exists() and time.monotonic() < deadline:
        time.sleep(TASK_PAUSE_POLL_S)


def pause_first_attempts(frame, pause_dir: str, pause_offset: int):
    """``frame`` filtered by a row UDF on ``offset`` that pauses a task's first attempt at
    ``pause_offset`` (see the module docstring); every row is kept."""
    from pyspark import TaskContext
    from pyspark.sql import functions as F

    def keep(offset: int) -> bool:
        context = TaskContext.get()
        if offset == pause_offset and context.attemptNumber() == 0:
            _pause_until_resumed(pause_dir, context.partitionId())
        return True

    keep_udf = F.udf(keep, "boolean", useArrow=False).asNondeterministic()
    return frame.where(keep_udf(F.col("offset")))


def task_fault_from_env(frame):
    """``frame`` wrapped by ``fail_first_task`` when the marker variable is set, and by
    ``pause_first_attempts`` when the pause directory is."""
    marker_path = os.environ.get(TASK_FAULT_MARKER_ENV)
    if marker_path:
        frame = fail_first_task(frame, marker_path)
    pause_dir = os.environ.get(TASK_PAUSE_DIR_ENV)
    if pause_dir:
        frame = pause_first_attempts(frame, pause_dir, int(os.environ[TASK_PAUSE_OFFSET_ENV]))
    return frame
