"""The log cleaner inside a real broker process, with real clients (confluent-kafka).

A seeded workload of keyed updates and tombstones goes to a compacted topic; the test waits
(polling the broker's ``cleaner-status.json`` against a deadline) until a cleaning is
recorded, then checks Kafka's LogCompactionTester oracle: reading the partition from the
beginning yields the latest value of every key (tombstones included), every record keeps
the offset it was produced at, and the log shrank. A reader scanning the partition over and
over while the (throttled) cleaner rewrites it must see the same. ``__consumer_offsets`` is
cleaned too. A SIGKILL while a ``.cleaned`` file is being written, then a restart, keeps the
oracle, and the next cleaning completes.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.conftest import BrokerProcess

DEADLINE_S = 30.0
POLL_INTERVAL_S = 0.05
STATUS_FILE = "cleaner-status.json"
MAX_BATCH_BYTES = 4096  # below the topics' segment.bytes (a larger request is refused)
CLEANER_OVERRIDES = {
    "log.cleaner.backoff.ms": "100",
    "offsets.topic.num.partitions": "1",
    "offsets.topic.segment.bytes": "2048",
    "group.initial.rebalance.delay.ms": "0",
}
COMPACT_TOPIC_CONFIG = {"cleanup.policy": "compact", "segment.bytes": "8192",
                        "min.cleanable.dirty.ratio": "0.01"}

Produced = dict[int, tuple[bytes, bytes | None]]  # offset -> (key, value)


def _create_compacted(bootstrap: str, topic: str, segment_bytes: int = 8192) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    config = {**COMPACT_TOPIC_CONFIG, "segment.bytes": str(segment_bytes)}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(10)


def _produce_workload(bootstrap: str, topic: str, seed: int, records: int, keys: int,
                      value_bytes: int = 20) -> tuple[Produced, dict[bytes, bytes | None]]:
    """Keyed updates and ~10% tombstones; returns what landed at each offset and the oracle
    (latest value per key, None for a deleted key)."""
    rng = random.Random(seed)
    produced: Produced = {}
    errors = []

    def delivered(error, message):
        if error is not None:
            errors.append(error)
        else:
            produced[message.offset()] = (message.key(), message.value())

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "1",
                         "batch.size": MAX_BATCH_BYTES})
    for sequence in range(records):
        key = b"key-%d" % rng.randrange(keys)
        value = None if rng.random() < 0.1 else \
            (b"value-%d-" % sequence).ljust(value_bytes, b"x")
        producer.produce(topic, key=key, value=value, on_delivery=delivered)
        if sequence % 500 == 0:
            producer.poll(0)
    assert producer.flush(30) == 0
    assert not errors, errors
    oracle: dict[bytes, bytes | None] = {}
    for offset in sorted(produced):
        key, value = produced[offset]
        oracle[key] = value
    return produced, oracle


def _scan(bootstrap: str, topic: str) -> list[tuple[int, bytes, bytes | None]]:
    """Every record of partition 0 from the log start up to the current high watermark."""
    return scan_from_log_start(bootstrap, topic)[1]


def scan_from_log_start(bootstrap: str, topic: str
                        ) -> tuple[int, list[tuple[int, bytes, bytes | None]]]:
    """(low watermark, every record of partition 0 from the log start to the high watermark)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "cleaner-scan",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 10})
    try:
        low, high = consumer.get_watermark_offsets(TopicPartition(topic, 0), timeout=10)
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        records: list[tuple[int, bytes, bytes | None]] = []
        deadline = time.monotonic() + DEADLINE_S
        while (not records or records[-1][0] < high - 1) and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is None:
                continue
            assert message.error() is None, message.error()
            records.append((message.offset(), message.key(), message.value()))
        assert records and records[-1][0] == high - 1, "scan did not reach the high watermark"
        return low, records
    finally:
        consumer.close()


def _check_oracle(records, produced: Produced, oracle) -> None:
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets)), "offsets must increase strictly"
    latest: dict[bytes, bytes | None] = {}
    for offset, key, value in records:
        assert produced[offset] == (key, value), f"offset {offset} changed its record"
        latest[key] = value
    assert latest == oracle


def _status(data_dir: Path) -> dict:
    return json.loads((data_dir / STATUS_FILE).read_text())


def _partition_status(data_dir: Path, topic: str) -> dict | None:
    path = data_dir / STATUS_FILE
    if not path.exists():
        return None
    return next((p for p in _status(data_dir)["partitions"]
                 if (p["topic"], p["partition"]) == (topic, 0)), None)


def _wait_for_cleaning(data_dir: Path, topic: str, after_offset: int = 0) -> dict:
    """The partition's status once a cleaning whose dirty section ends past ``after_offset``
    is recorded."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        entry = _partition_status(data_dir, topic)
        last = entry and entry["last_cleaning"]
        if last and last["end_offset"] > after_offset:
            return entry
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"no cleaning of {topic}-0 recorded within {DEADLINE_S}s: "
                         f"{_partition_status(data_dir, topic)}")


@pytest.fixture(scope="module")
def cleaner_broker(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("cleaner-broker") / "data"
    data_dir.mkdir()
    process = BrokerProcess(data_dir, {**CLEANER_OVERRIDES,
                                       "log.cleaner.io.max.bytes.per.second": "400000"})
    process.start()
    yield process
    process.stop()


def test_compacted_topic_keeps_latest_value_per_key_while_read_concurrently(cleaner_broker):
    topic = "compacted-oracle"
    _create_compacted(cleaner_broker.bootstrap, topic)
    produced, oracle = _produce_workload(cleaner_broker.bootstrap, topic, seed=5,
                                         records=6000, keys=300)
    cleaned = threading.Event()
    scans_during_cleaning = []
    failures = []

    def keep_reading():
        try:
            while not cleaned.is_set():
                scans_during_cleaning.append(_scan(cleaner_broker.bootstrap, topic))
        except BaseException as error:  # reported on the test thread
            failures.append(error)

    reader = threading.Thread(target=keep_reading)
    reader.start()
    try:
        # cleanings may start while producing: wait for one reaching near the log end
        status = _wait_for_cleaning(cleaner_broker.data_dir, topic,
                                    after_offset=len(produced) * 3 // 4)
    finally:
        cleaned.set()
        reader.join()
    assert not failures, failures
    assert scans_during_cleaning
    for records in scans_during_cleaning:
        _check_oracle(records, produced, oracle)
    final = _scan(cleaner_broker.bootstrap, topic)
    _check_oracle(final, produced, oracle)
    assert len(final) < len(produced) // 2
    last = status["last_cleaning"]
    assert last["messages_written"] < last["messages_read"]
    assert not status["uncleanable"]
    log_text = cleaner_broker.log_text()
    assert f"Log cleaner cleaned log {topic}-0 (dirty section = [0, " in log_text
    assert "size reduction" in log_text


def test_consumer_offsets_topic_is_cleaned(cleaner_broker):
    topic = "offsets-source"
    admin = AdminClient({"bootstrap.servers": cleaner_broker.bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    consumer = Consumer({"bootstrap.servers": cleaner_broker.bootstrap,
                         "group.id": "offsets-cleaning", "enable.auto.commit": False})
    try:
        for offset in range(1, 400):
            consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
        status = _wait_for_cleaning(cleaner_broker.data_dir, "__consumer_offsets")
        committed = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    finally:
        consumer.close()
    assert committed[0].offset == 399
    assert status["last_cleaning"]["messages_written"] < status["last_cleaning"]["messages_read"]
    metrics = _status(cleaner_broker.data_dir)["metrics"]
    assert metrics["uncleanable-partitions-count"] == 0
    assert metrics["max-clean-time-secs"] > 0


def _wait_for_cleaned_file(partition_dir: Path, cleaned_seen: threading.Event) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if any(name.endswith(".cleaned") for name in _names(partition_dir)):
            cleaned_seen.set()
            return
        time.sleep(0.002)


def _names(directory: Path) -> list[str]:
    try:
        return [path.name for path in directory.iterdir()]
    except FileNotFoundError:
        return []


def test_sigkill_during_cleaning_then_restart_keeps_the_oracle(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    topic = "compacted-crash"
    process = BrokerProcess(data_dir, {**CLEANER_OVERRIDES,
                                       "log.cleaner.io.max.bytes.per.second": "600000",
                                       "log.cleaner.enable": "false"})
    process.start()
    try:
        _create_compacted(process.bootstrap, topic, segment_bytes=32768)
        produced, oracle = _produce_workload(process.bootstrap, topic, seed=9, records=4000,
                                             keys=200, value_bytes=100)
        process.stop()
        process.overrides["log.cleaner.enable"] = "true"
        cleaned_seen = threading.Event()
        watcher = threading.Thread(target=_wait_for_cleaned_file,
                                   args=(data_dir / f"{topic}-0", cleaned_seen))
        watcher.start()
        process.start()
        watcher.join()
        assert cleaned_seen.is_set(), "no .cleaned file appeared"
        process.kill()  # mid-cleaning: a group is being written
        process.start()
        _check_oracle(_scan(process.bootstrap, topic), produced, oracle)
        _wait_for_cleaning(data_dir, topic)
        final = _scan(process.bootstrap, topic)
        _check_oracle(final, produced, oracle)
        assert len(final) < len(produced) // 2
        leftovers = [n for n in _names(data_dir / f"{topic}-0") if n.endswith((".cleaned",
                                                                                ".swap"))]
        assert not leftovers
    finally:
        process.stop()


def _thread_nice_values(pid: int) -> list[int]:
    """The nice value of every thread of ``pid`` (field 19 of /proc/PID/task/TID/stat)."""
    values = []
    for stat_path in Path(f"/proc/{pid}/task").glob("*/stat"):
        try:
            after_name = stat_path.read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):  # the thread ended meanwhile
            continue
        values.append(int(after_name[16]))
    return values


def test_no_broker_thread_stays_nicer_than_the_broker(cleaner_broker):
    # the cleaner's spans run nicer on short-lived helper threads; the threads that take the
    # GIL (the cleaner thread too) keep the broker's priority, so none of them can be put
    # behind other work while holding it: between spans every thread is at the broker's
    own_nice = os.getpriority(os.PRIO_PROCESS, 0)
    deadline = time.monotonic() + DEADLINE_S
    values = _thread_nice_values(cleaner_broker.pid)
    while set(values) != {own_nice} and time.monotonic() < deadline:
        time.sleep(POLL_INTERVAL_S)
        values = _thread_nice_values(cleaner_broker.pid)
    assert len(values) >= 3 and set(values) == {own_nice}, values
