"""The ParallelConsumer's exactly-once mode across SIGKILLs: a real child process consumes,
turns each record into one output record, and is killed while records are in flight; the
output, read read_committed, holds every input record exactly once."""

from __future__ import annotations

import random
from collections import Counter

from .conftest import SCRATCH_DIR, create_topic, produce_records, read_committed_messages
from .test_crash_recovery import (
    _processed,
    _spawn,
    _stop,
    _wait_child_processed,
    _wait_committed,
)

PARTITIONS = 3
RECORDS = 300
KILLS = 2
SEED = 21


def test_sigkilled_consumers_leave_each_output_once(bootstrap):
    rng = random.Random(SEED)
    topic = create_topic(bootstrap, PARTITIONS, prefix="eos-in")
    output = create_topic(bootstrap, 2, prefix="eos-out")
    group = f"{topic}-group"
    produce_records(bootstrap, topic, RECORDS, PARTITIONS)
    per_partition = RECORDS // PARTITIONS
    processed_path = SCRATCH_DIR / f"{topic}.processed"
    exactly_once = ("--transactional-id", f"{topic}-copier", "--output-topic", output)
    for kill in range(KILLS):
        child = _spawn(bootstrap, topic, group, processed_path, SEED * 100 + kill, *exactly_once)
        unprocessed = RECORDS - len(_processed(processed_path))
        _wait_child_processed(processed_path, child, rng.randint(1, max(1, unprocessed // 2)))
        child.kill()
        child.communicate()
    last = _spawn(bootstrap, topic, group, processed_path, SEED * 100 + KILLS, *exactly_once)
    _wait_committed(bootstrap, group, topic, dict.fromkeys(range(PARTITIONS), per_partition),
                    last)
    _stop(last)

    outputs = Counter(message.value() for message in
                      read_committed_messages(bootstrap, output, 2))
    expected = {f"{p} {o}".encode() for p in range(PARTITIONS) for o in range(per_partition)}
    assert {value for value, count in outputs.items() if count > 1} == set()
    assert set(outputs) == expected
    assert len(_processed(processed_path)) == RECORDS  # every record once at least
