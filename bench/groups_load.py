"""Group coordinator start-up load: time and records replayed vs commits ever made, before and
after compacting ``__consumer_offsets``.

For each history size N (``--commits``): 1,000 groups x ``--partitions`` partitions commit in
rounds until N commit records exist (written with the storage layer into a fresh data dir,
5 offsets-topic partitions, 1 MiB segments); a headrace broker process starts on it and the
figure is the loader's own log line (``loaded_record_count=... in ... ms``). Then the stopped
broker's offsets topic is compacted with the storage-layer cleaner and the broker started
again. Prints one JSON line per N: commits, live keys, records loaded and load ms, before
and after cleaning. Only headrace: the Tansu peer keeps no offsets to load.

Usage::

    .venv/bin/python bench/groups_load.py --commits 100000 400000 1600000

Scratch data under /tmp/groups-load-bench. Single-threaded driver; the broker is a process.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

from headrace.coordinator.group import CommittedOffset
from headrace.coordinator.records import OFFSETS_TOPIC_NAME, partition_for_group
from headrace.coordinator.store import offset_commit_record
from headrace.protocol.records import build_batch
from headrace.storage.cleaner import Cleaner
from headrace.storage.clock import SystemClock
from headrace.storage.manager import LogManager
from headrace.storage.offset_map import OffsetMap

SCRATCH = Path("/tmp/groups-load-bench")
GROUPS = 1000
OFFSETS_PARTITIONS = 5
SEGMENT_BYTES = 1024 * 1024
RECORDS_PER_BATCH = 1000
LOADED_LINE = re.compile(r"loaded_record_count=(\d+) in (\d+) ms")
START_TIMEOUT_S = 300.0


def _open_logs(data_dir: Path) -> LogManager:
    manager = LogManager([data_dir], {}, SystemClock())
    manager.startup()
    return manager


def write_history(data_dir: Path, commits: int, partitions: int) -> None:
    manager = _open_logs(data_dir)
    try:
        manager.create_topic(OFFSETS_TOPIC_NAME, OFFSETS_PARTITIONS,
                             {"cleanup.policy": "compact", "segment.bytes": str(SEGMENT_BYTES)})
        pending: dict[int, list] = {p: [] for p in range(OFFSETS_PARTITIONS)}
        groups = [f"group-{index:04d}" for index in range(GROUPS)]
        for index in range(commits):
            group = groups[index % GROUPS]
            partition = (index // GROUPS) % partitions
            committed = CommittedOffset(index, -1, "", 0)
            key, value = offset_commit_record(group, ("events", partition), committed)
            target = partition_for_group(group, OFFSETS_PARTITIONS)
            pending[target].append((key, value, (), 0))
            if len(pending[target]) == RECORDS_PER_BATCH:
                _flush(manager, target, pending[target])
        for target, records in pending.items():
            if records:
                _flush(manager, target, records)
    finally:
        manager.shutdown()


def _flush(manager: LogManager, partition: int, records: list) -> None:
    manager.get_log(OFFSETS_TOPIC_NAME, partition).append(bytearray(build_batch(records)), 0)
    records.clear()


def clean(data_dir: Path) -> None:
    manager = _open_logs(data_dir)
    try:
        cleaner = Cleaner(OffsetMap())
        for partition in range(OFFSETS_PARTITIONS):
            log = manager.get_log(OFFSETS_TOPIC_NAME, partition)
            cleaner.clean(log, log.log_start_offset, SystemClock().now_ms())
    finally:
        manager.shutdown()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def measure_load(data_dir: Path) -> tuple[int, int]:
    """(records loaded, load ms) of one broker start on ``data_dir``."""
    log_path = data_dir.parent / "broker.log"
    log_path.unlink(missing_ok=True)
    overrides = {"listeners": f"PLAINTEXT://127.0.0.1:{_free_port()}", "log.dirs": str(data_dir),
                 "offsets.topic.num.partitions": str(OFFSETS_PARTITIONS),
                 "offsets.topic.segment.bytes": str(SEGMENT_BYTES),
                 "log.cleaner.enable": "false"}
    command = [sys.executable, "-m", "headrace.cli.main", "broker"]
    for key, value in overrides.items():
        command += ["--override", f"{key}={value}"]
    with open(log_path, "wb") as log_file:
        process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            found = LOADED_LINE.search(log_path.read_text(errors="replace"))
            if found:
                return int(found.group(1)), int(found.group(2))
            if process.poll() is not None:
                raise RuntimeError(f"broker exited:\n{log_path.read_text()}")
            time.sleep(0.05)
        raise RuntimeError("the broker did not finish loading")
    finally:
        process.terminate()
        process.wait()


def run_one(commits: int, partitions: int) -> dict:
    shutil.rmtree(SCRATCH, ignore_errors=True)
    data_dir = SCRATCH / "data"
    write_history(data_dir, commits, partitions)
    loaded_before, ms_before = measure_load(data_dir)
    clean(data_dir)
    loaded_after, ms_after = measure_load(data_dir)
    return {"commits": commits, "live_keys": min(commits, GROUPS * partitions),
            "loaded_before": loaded_before, "load_ms_before": ms_before,
            "loaded_after_cleaning": loaded_after, "load_ms_after_cleaning": ms_after}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", type=int, nargs="+", default=[100_000, 400_000, 1_600_000])
    parser.add_argument("--partitions", type=int, default=2, help="partitions per group")
    args = parser.parse_args()
    for commits in args.commits:
        print(json.dumps(run_one(commits, args.partitions)), flush=True)
    shutil.rmtree(SCRATCH, ignore_errors=True)


if __name__ == "__main__":
    main()
