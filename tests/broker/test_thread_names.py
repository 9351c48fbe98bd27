"""The broker's threads carry their own names for the operating system (``top -H``, ``ps -L``,
``/proc/PID/task/TID/comm``): a real broker process, asked through /proc after a produce."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

from confluent_kafka import Producer

THREAD_NAMES_WAIT_S = 10.0


def _thread_names(pid: int) -> set[str]:
    names = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            names.add((task / "comm").read_text().strip())
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
    return names


def test_the_append_cleaner_and_scrub_threads_are_named(broker):
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 0})
    producer.produce(f"thread-names-{uuid.uuid4().hex[:8]}", b"value")
    assert producer.flush(30) == 0
    deadline = time.monotonic() + THREAD_NAMES_WAIT_S
    while not {"hr-append", "hr-cleaner", "hr-scrub"} <= (names := _thread_names(broker.pid)):
        assert time.monotonic() < deadline, f"thread names: {sorted(names)}"
        time.sleep(0.1)
