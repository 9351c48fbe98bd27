"""The log cleaner's operations on a live broker process (confluent-kafka clients): live
reconfiguration through IncrementalAlterConfigs, its validation, and a topic deletion or
DeleteRecords arriving while a cleaning is in progress.

Making "a cleaning in progress" deterministic: the broker runs with
``log.cleaner.io.max.bytes.per.second`` at 1000 and 64 KiB segments, so the first chunk of a
cleaning makes the throttler sleep about a minute; the test waits until the status file shows
the partition ``in_progress`` (written when a cleaning starts), acts, then raises the rate
through AlterConfigs, which ends the sleep. Waits poll ``cleaner-status.json`` or the data
directory against a deadline.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from headrace.broker.cleaner_service import THROTTLE_CHECK_INTERVAL_MS
from tests.broker.test_cleaner_broker import _produce_workload, scan_from_log_start
from tests.cli.cli_runner import run_json, run_ok
from tests.conftest import BrokerProcess

DEADLINE_S = 30.0
POLL_INTERVAL_S = 0.05
STATUS_FILE = "cleaner-status.json"
SLOW_BYTES_PER_SECOND = "1000"
FAST_BYTES_PER_SECOND = "1.7976931348623157E308"  # Kafka's default: unthrottled
SEGMENT_BYTES = 65536
MEBIBYTE = 1024 * 1024
BROKER_OVERRIDES = {
    "log.cleaner.backoff.ms": "100",
    "log.cleaner.io.max.bytes.per.second": SLOW_BYTES_PER_SECOND,
    "log.cleaner.dedupe.buffer.size": str(8 * MEBIBYTE),
    "log.cleaner.io.buffer.size": str(128 * 1024),  # 64 KiB reads
    "log.segment.delete.delay.ms": "100",
    "offsets.topic.num.partitions": "1",
    "group.initial.rebalance.delay.ms": "0",
}


@pytest.fixture
def broker(tmp_path_factory):
    """A broker per test: a cleaning (throttled to sleep) left by one test would otherwise
    hold the single cleaner thread while the next waits for its own partition."""
    data_dir = tmp_path_factory.mktemp("cleaner-live") / "data"
    data_dir.mkdir()
    process = BrokerProcess(data_dir, BROKER_OVERRIDES)
    process.start()
    # No wait for the throttler's first period: a period also ends once it has seen the bytes
    # the rate allows in a whole one (300 at 1000 bytes/s over THROTTLE_CHECK_INTERVAL_MS), so
    # the first 64 KiB chunk of any cleaning puts it to sleep, from the broker's start on.
    assert 1000 * THROTTLE_CHECK_INTERVAL_MS / 1000 < SEGMENT_BYTES
    yield process
    process.stop()


# ---- helpers --------------------------------------------------------------------------------


def _admin(broker: BrokerProcess) -> AdminClient:
    return AdminClient({"bootstrap.servers": broker.bootstrap})


def _alter_broker(broker: BrokerProcess, **configs: str) -> None:
    """IncrementalAlterConfigs SET on broker 1; names with '_' for '.'."""
    entries = [ConfigEntry(name.replace("_", "."), value,
                           incremental_operation=AlterConfigOpType.SET)
               for name, value in configs.items()]
    resource = ConfigResource(ResourceType.BROKER, "1", incremental_configs=entries)
    admin = _admin(broker)  # alive until the result is in
    admin.incremental_alter_configs([resource])[resource].result(10)


def _alter_error(broker: BrokerProcess, **configs: str) -> KafkaError:
    with pytest.raises(KafkaException) as caught:
        _alter_broker(broker, **configs)
    return caught.value.args[0]


def _status(broker: BrokerProcess) -> dict:
    return json.loads((broker.data_dir / STATUS_FILE).read_text())


def _entry(broker: BrokerProcess, topic: str) -> dict | None:
    return next((p for p in _status(broker)["partitions"] if p["topic"] == topic), None)


def _wait_until(condition, description: str):
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"not within {DEADLINE_S}s: {description}")


def _wait_in_progress(broker: BrokerProcess, topic: str) -> None:
    _wait_until(lambda: (_entry(broker, topic) or {}).get("in_progress"),
                f"{topic}-0 cleaning in progress")


def _wait_cleaned(broker: BrokerProcess, topic: str, after_offset: int) -> dict:
    def cleaned():
        last = (_entry(broker, topic) or {}).get("last_cleaning")
        return last if last and last["end_offset"] > after_offset else None
    return _wait_until(cleaned, f"{topic}-0 cleaned past offset {after_offset}")


def _create(broker: BrokerProcess, topic: str, policy: str = "compact") -> None:
    config = {"cleanup.policy": policy, "segment.bytes": str(SEGMENT_BYTES),
              "min.cleanable.dirty.ratio": "0.01"}
    admin = _admin(broker)
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(10)


def _produce(broker: BrokerProcess, topic: str, seed: int, records: int = 4000):
    return _produce_workload(broker.bootstrap, topic, seed=seed, records=records, keys=300,
                             value_bytes=40)


def _scan_from_start(broker: BrokerProcess, topic: str) -> tuple[int, list]:
    """(low watermark, every record from the log start to the high watermark)."""
    return scan_from_log_start(broker.bootstrap, topic)


def _latest_per_key(records, produced) -> dict[bytes, bytes | None]:
    latest: dict[bytes, bytes | None] = {}
    offsets = [offset for offset, _, _ in records]
    assert offsets == sorted(set(offsets)), "offsets must increase strictly"
    for offset, key, value in records:
        assert produced[offset] == (key, value), f"offset {offset} changed its record"
        latest[key] = value
    return latest


def _oracle_from(produced, start_offset: int) -> dict[bytes, bytes | None]:
    """Latest value per key among the records at ``start_offset`` and after."""
    oracle: dict[bytes, bytes | None] = {}
    for offset in sorted(produced):
        if offset >= start_offset:
            key, value = produced[offset]
            oracle[key] = value
    return oracle


def _segment_bases(partition_dir: Path) -> list[int]:
    return sorted(int(path.name.split(".")[0]) for path in partition_dir.glob("*.log"))


def _leftovers(data_dir: Path) -> list[str]:
    return [path.name for path in data_dir.rglob("*")
            if path.name.endswith((".cleaned", ".swap"))]


# ---- tests ----------------------------------------------------------------------------------


def test_topic_deleted_while_being_cleaned(broker):
    _alter_broker(broker, log_cleaner_io_max_bytes_per_second=SLOW_BYTES_PER_SECOND)
    doomed, survivor = "live-doomed", "live-survivor"
    _create(broker, doomed)
    _produce(broker, doomed, seed=21)
    _wait_in_progress(broker, doomed)
    _create(broker, survivor)
    produced, oracle = _produce(broker, survivor, seed=22)
    admin = _admin(broker)
    admin.delete_topics([doomed])[doomed].result(10)
    try:
        _wait_until(lambda: not list(broker.data_dir.glob(f"{doomed}-0*")),
                    f"{doomed}-0 and its -delete directory removed")
        _alter_broker(broker, log_cleaner_io_max_bytes_per_second=FAST_BYTES_PER_SECOND)
        _wait_cleaned(broker, survivor, after_offset=len(produced) * 3 // 4)
    finally:
        _alter_broker(broker, log_cleaner_io_max_bytes_per_second=FAST_BYTES_PER_SECOND)
    assert broker.process.poll() is None, "the broker must keep running"
    assert _entry(broker, doomed) is None
    assert not list(broker.data_dir.glob(f"{doomed}-0*")), "deleted partition resurrected"
    _, records = _scan_from_start(broker, survivor)
    assert _latest_per_key(records, produced) == oracle
    assert len(records) < len(produced) // 2
    assert not _leftovers(broker.data_dir)
    assert f"{doomed}-0: cleaning aborted: {doomed}-0: log closed or deleted" in \
        broker.log_text()


def test_delete_records_while_being_cleaned_is_exact(broker):
    _alter_broker(broker, log_cleaner_io_max_bytes_per_second=SLOW_BYTES_PER_SECOND)
    topic = "live-delete-records"
    _create(broker, topic, policy="compact,delete")  # DeleteRecords needs delete

    produced, _ = _produce(broker, topic, seed=31)
    _wait_in_progress(broker, topic)
    delete_before = len(produced) // 2
    admin = _admin(broker)
    result = admin.delete_records([TopicPartition(topic, 0, delete_before)])
    [deleted] = [future.result(10) for future in result.values()]
    assert deleted.low_watermark == delete_before
    try:
        _alter_broker(broker, log_cleaner_io_max_bytes_per_second=FAST_BYTES_PER_SECOND)
        _wait_cleaned(broker, topic, after_offset=len(produced) * 3 // 4)
    finally:
        _alter_broker(broker, log_cleaner_io_max_bytes_per_second=FAST_BYTES_PER_SECOND)
    partition_dir = broker.data_dir / f"{topic}-0"

    def nothing_wholly_below_start():
        bases = _segment_bases(partition_dir)
        return all(following > delete_before for following in bases[1:])

    _wait_until(nothing_wholly_below_start, "segments below the log start removed")
    low, records = _scan_from_start(broker, topic)
    assert low == delete_before
    assert records[0][0] >= delete_before
    assert _latest_per_key(records, produced) == _oracle_from(produced, delete_before)
    assert nothing_wholly_below_start(), "a segment below the log start came back"
    assert not _leftovers(broker.data_dir)
    assert _entry(broker, topic)["log_start_offset"] == delete_before


def test_threads_and_buffers_reconfigured_without_restart(broker):
    _alter_broker(broker, log_cleaner_io_max_bytes_per_second=SLOW_BYTES_PER_SECOND)
    topic = "live-reconfigured"
    _create(broker, topic)
    produced, oracle = _produce(broker, topic, seed=41)
    _wait_in_progress(broker, topic)
    before = _status(broker)
    assert (before["threads"], before["offset_map_bytes"]) == (1, 8 * MEBIBYTE)
    try:
        _alter_broker(broker, log_cleaner_threads="2",
                      log_cleaner_dedupe_buffer_size=str(16 * MEBIBYTE),
                      log_cleaner_io_buffer_size=str(512 * 1024),
                      log_cleaner_io_buffer_load_factor="0.75")
        after = _wait_until(
            lambda: (lambda s: s if s["threads"] == 2 and s["threads_alive"] == 2 else None)(
                _status(broker)), "two cleaner threads running")
        assert after["offset_map_bytes"] == 8 * MEBIBYTE  # 16 MiB over two threads
        assert after["io_chunk_bytes"] == 128 * 1024
        assert after["load_factor"] == 0.75
        assert after["metrics"]["DeadThreadCount"] == 0
        assert f"{topic}-0: cleaning aborted: the log cleaner is restarting with new " \
            "settings" in broker.log_text()
        _alter_broker(broker, log_cleaner_io_max_bytes_per_second=FAST_BYTES_PER_SECOND)
        last = _wait_cleaned(broker, topic, after_offset=len(produced) * 3 // 4)
    finally:
        _alter_broker(broker, log_cleaner_io_max_bytes_per_second=FAST_BYTES_PER_SECOND)
    assert last["buffer_utilization_percent"] <= 75.0
    _, records = _scan_from_start(broker, topic)
    assert _latest_per_key(records, produced) == oracle
    table = run_ok("cleaner", "status", "--log-dir", str(broker.data_dir)).stdout.decode()
    assert "2 thread(s) (2 alive)" in table
    assert "cleaner-recopy-percent" in table and "DeadThreadCount" in table


def test_invalid_cleaner_reconfigurations_are_refused(broker):
    threads = _status(broker)["threads"]
    too_many = _alter_error(broker, log_cleaner_threads=str(threads * 2 + 1))
    assert too_many.code() == KafkaError.INVALID_REQUEST
    assert "more than double the current value" in too_many.str()
    assert _alter_error(broker, log_cleaner_threads="0").code() == KafkaError.INVALID_REQUEST
    small_buffer = _alter_error(broker, log_cleaner_dedupe_buffer_size=str(threads * MEBIBYTE))
    assert small_buffer.code() == KafkaError.INVALID_REQUEST
    assert "at least 1MB per cleaner thread" in small_buffer.str()
    assert _alter_error(broker, log_cleaner_io_buffer_load_factor="1.5").code() == \
        KafkaError.INVALID_REQUEST
    # Kafka 3.9's ConfigAdminManager answers a broker config's bad value INVALID_REQUEST too
    assert _alter_error(broker, log_cleaner_io_buffer_size="-1").code() == \
        KafkaError.INVALID_REQUEST
    assert _alter_error(broker, log_cleaner_threads="two").code() == KafkaError.INVALID_REQUEST
    document = run_json("cleaner", "status", "--log-dir", str(broker.data_dir))
    [status] = document["log_dirs"]
    assert status["threads"] == threads
    assert status["threads_alive"] == threads
