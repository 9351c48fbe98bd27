"""Copy-with-bounce, after Kafka's transactions system test (transactions_test.py): a
transactional consume-transform-produce copier (``copier_child.py``, confluent-kafka) copies
an input topic to an output topic while the copier is SIGKILLed and the broker is SIGKILLed
and restarted; the output, read read_committed, holds every input record exactly once."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from confluent_kafka import KafkaException

from tests.conftest import BrokerProcess

from .conftest import (
    GROUP_SESSION_TIMEOUT_MS,
    committed_offsets,
    create_topic,
    produce_records,
    read_committed_messages,
)

COPIER = Path(__file__).with_name("copier_child.py")
PARTITIONS = 3
RECORDS = 1_500
# Small transactions that each take a while to transform, so the copier is still copying at
# each bounce (the test checks it) and mostly inside a transaction with records produced.
RECORDS_PER_TRANSACTION = 5
TRANSFORM_MS = 20
# What happens once this many input records are committed, in order.
BOUNCES = ((300, "kill copier"), (700, "kill broker"), (1_100, "kill copier"))
BOUNCE_WAIT_S = 120.0
DRAIN_TIMEOUT_S = 180.0
STATE_POLL_S = 0.2


def _spawn_copier(bootstrap: str, input_topic: str, output: str, group: str,
                  log_path: Path) -> subprocess.Popen:
    """A copier whose output goes to ``log_path`` (a pipe nobody reads would fill up with
    librdkafka's reconnect messages while the broker is down, and block it)."""
    with open(log_path, "ab") as log_file:
        return subprocess.Popen(
        [sys.executable, str(COPIER), "--bootstrap", bootstrap, "--input", input_topic,
         "--output", output, "--group", group, "--transactional-id", f"{group}-copier",
         "--session-timeout-ms", str(GROUP_SESSION_TIMEOUT_MS),
             "--batch-records", str(RECORDS_PER_TRANSACTION), "--transform-ms",
             str(TRANSFORM_MS)],
            stdout=log_file, stderr=subprocess.STDOUT)


def _committed_total(bootstrap: str, group: str, input_topic: str) -> int:
    """Input records committed; 0 while a transaction's offsets stay pending (the query
    times out) -- the wait goes on."""
    try:
        offsets = committed_offsets(bootstrap, group, input_topic, PARTITIONS)
    except KafkaException:
        return 0
    return sum(max(offset, 0) for offset in offsets.values())


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"not reached in {timeout_s} s: {what}"
        time.sleep(STATE_POLL_S)  # polling observed broker state, bounded by the deadline


def _alive(copier: subprocess.Popen, bootstrap: str, input_topic: str, output: str,
           group: str, log_path: Path, restarts: list[int]) -> subprocess.Popen:
    """The copier, started again if it exited (fenced or failed while the broker was down:
    its exit status goes to ``restarts``, its error to the log)."""
    if copier.poll() is None:
        return copier
    restarts.append(copier.returncode)
    return _spawn_copier(bootstrap, input_topic, output, group, log_path)


def test_copy_with_bounce_leaves_every_record_once(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = BrokerProcess(data_dir, {
        "group.min.session.timeout.ms": str(GROUP_SESSION_TIMEOUT_MS // 2),
        "group.initial.rebalance.delay.ms": "0"})
    broker.start()
    log_path = tmp_path / "copier.log"
    copier = None
    try:
        bootstrap = broker.bootstrap
        input_topic = create_topic(bootstrap, PARTITIONS, prefix="bounce-in")
        output = create_topic(bootstrap, PARTITIONS, prefix="bounce-out")
        group = f"{input_topic}-copier"
        produce_records(bootstrap, input_topic, RECORDS, PARTITIONS)
        copier = _spawn_copier(bootstrap, input_topic, output, group, log_path)
        progress = []  # input records committed at each bounce
        restarts: list[int] = []  # exit statuses of copiers that stopped on their own
        def committed_at_least(records: int) -> bool:
            nonlocal copier
            copier = _alive(copier, bootstrap, input_topic, output, group, log_path, restarts)
            return _committed_total(bootstrap, group, input_topic) >= records

        for threshold, bounce in BOUNCES:
            _wait_for(lambda t=threshold: committed_at_least(t), BOUNCE_WAIT_S,
                      f"{threshold} input records committed before '{bounce}'")
            progress.append(_committed_total(bootstrap, group, input_topic))
            if bounce == "kill copier":
                copier.send_signal(signal.SIGKILL)
                copier.wait()
                copier = _spawn_copier(bootstrap, input_topic, output, group, log_path)
            else:
                broker.kill()
                broker.start()

        _wait_for(lambda: committed_at_least(RECORDS), DRAIN_TIMEOUT_S,
                  "every input record copied and committed")
        copier.send_signal(signal.SIGTERM)
        copier.wait(timeout=60)
        outputs = Counter(message.value() for message in
                          read_committed_messages(bootstrap, output, PARTITIONS))
    finally:
        if copier is not None and copier.poll() is None:
            copier.kill()
            copier.wait()
        broker.kill()
    assert all(0 < committed < RECORDS for committed in progress), (progress, restarts)
    assert [value for value, count in outputs.items() if count > 1] == []
    assert set(outputs) == {str(index).encode() for index in range(RECORDS)}
