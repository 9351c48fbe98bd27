"""The broker's threads named for the operating system, so ``top -H``, ``ps -L``, ``perf`` and
``/proc/PID/task/TID/comm`` tell them apart: Python 3.11 leaves every thread with the
process's name. Linux keeps 15 bytes of a thread's name (``prctl(PR_SET_NAME)``); elsewhere
naming is skipped.

Names in use: ``hr-append`` (the append thread), ``hr-background`` (checkpoints, deletions),
``hr-cleaner`` (each log cleaner thread) and, set by storage's compiled spans
(``_segment_io.c``), ``hr-clean-span`` (the niced helper a cleaner span runs on). The event loop keeps the process's name (its
thread id is the process id).

Thread-safety: ``name_this_thread`` names only the calling thread.
"""

from __future__ import annotations

import ctypes
import sys

PR_SET_NAME = 15
OS_THREAD_NAME_MAX_BYTES = 15

_libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None


def name_this_thread(name: str) -> None:
    """Give the calling thread ``name`` (cut to 15 bytes) as the OS shows it."""
    if _libc is not None:
        _libc.prctl(PR_SET_NAME, name.encode()[:OS_THREAD_NAME_MAX_BYTES], 0, 0, 0)
