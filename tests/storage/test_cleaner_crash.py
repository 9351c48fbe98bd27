"""SIGKILL a process in the middle of cleaning, restart, and check the oracle still holds and no
segment is duplicated or left half-swapped."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from headrace.storage.cleaner import Cleaner
from headrace.storage.offset_map import OffsetMap

from .cleaner_workload import (
    NOW_MS,
    append_workload,
    compact_config,
    latest_values,
    open_log,
    read_records,
)
from .helpers import assert_indexes_match_scan

WORKER = Path(__file__).with_name("cleaner_crash_worker.py")


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_during_cleaning_loses_nothing(scratch, seed):
    path = scratch / "t-0"
    log = open_log(path, compact_config())
    oracle = append_workload(log, seed, keys=1500, batches=1200, delete_fraction=0.05)
    log.roll(NOW_MS)
    before = {offset: (key, value) for offset, key, value in read_records(log)}
    log.close()
    worker = subprocess.Popen([sys.executable, str(WORKER), str(path)], stdout=subprocess.PIPE)
    try:
        assert worker.stdout.readline() == b"cleaning\n"
        time.sleep(random.Random(seed).uniform(0.05, 0.6))  # a random point, not a sync
    finally:
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait()
    reopened = open_log(path, compact_config())
    records = read_records(reopened)
    assert all(before[offset] == (key, value) for offset, key, value in records)
    live = {k: v for k, v in latest_values(records).items() if v is not None}
    assert live == {k: v for k, v in oracle.items() if v is not None}
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets))  # no duplicated segment
    names = [p.name for p in path.iterdir()]
    assert not [n for n in names if n.endswith((".cleaned", ".swap"))]
    assert_indexes_match_scan(reopened)


def test_leftover_swap_file_completes_the_swap_and_cleaned_file_is_dropped(scratch):
    dirty, cleaned = scratch / "dirty-0", scratch / "cleaned-0"
    log = open_log(dirty, compact_config())
    append_workload(log, 4, keys=100, batches=400, delete_fraction=0.0)
    log.roll(NOW_MS)
    log.close()
    shutil.copytree(dirty, cleaned)
    log = open_log(cleaned, compact_config(segment_bytes=1 << 20))  # one cleaned group
    Cleaner(OffsetMap(1 << 20)).clean(log, 0, NOW_MS)
    expected = read_records(log)
    first = log.segments[0]
    assert len(log.segments) == 2
    log.close()
    # the state right after the commit point: the swap file next to every old segment
    shutil.copy(first.log_path, dirty / (first.log_path.name + ".swap"))
    shutil.copy(first.log_path, dirty / "00000000000000000000.log.cleaned")
    recovered = open_log(dirty, compact_config())
    assert read_records(recovered) == expected
    assert not [p for p in dirty.iterdir() if p.name.endswith((".swap", ".cleaned"))]
    assert_indexes_match_scan(recovered)
