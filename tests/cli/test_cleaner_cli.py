"""``headrace cleaner status`` against the status files of a real broker that cleaned a
compacted topic; one-line errors for a missing directory or one without a status file."""

from __future__ import annotations

import json
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from tests.cli.cli_runner import assert_user_error, run, run_json, run_ok, unique_topic
from tests.conftest import BrokerProcess

DEADLINE_S = 30.0
STATUS_FILE = "cleaner-status.json"


def _cleaned_partition(data_dir, topic: str) -> dict | None:
    path = data_dir / STATUS_FILE
    if not path.exists():
        return None
    for entry in json.loads(path.read_text())["partitions"]:
        if entry["topic"] == topic and entry["last_cleaning"]:
            return entry
    return None


def _broker_with_cleaned_topic(tmp_path, topic: str) -> BrokerProcess:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    process = BrokerProcess(data_dir, {"log.cleaner.backoff.ms": "100",
                                       "offsets.topic.num.partitions": "1"})
    process.start()
    admin = AdminClient({"bootstrap.servers": process.bootstrap})
    config = {"cleanup.policy": "compact", "segment.bytes": "4096",
              "min.cleanable.dirty.ratio": "0.01"}
    admin.create_topics([NewTopic(topic, 1, 1, config=config)])[topic].result(10)
    producer = Producer({"bootstrap.servers": process.bootstrap, "batch.size": 1024})
    for sequence in range(2000):
        producer.produce(topic, key=b"k%d" % (sequence % 20), value=b"v%d" % sequence)
    assert producer.flush(30) == 0
    deadline = time.monotonic() + DEADLINE_S
    while _cleaned_partition(data_dir, topic) is None:
        assert time.monotonic() < deadline, "no cleaning recorded"
        time.sleep(0.05)
    return process


def test_status_shows_the_cleaned_partition(tmp_path):
    topic = unique_topic("cleaner-cli")
    process = _broker_with_cleaned_topic(tmp_path, topic)
    try:
        table = run_ok("cleaner", "status", "--log-dir", str(process.data_dir)).stdout.decode()
        assert f"{topic}-0" in table
        assert "max-dirty-percent" in table
        document = run_json("cleaner", "status", "--log-dir", str(process.data_dir))
    finally:
        process.stop()
    [status] = document["log_dirs"]
    entry = next(p for p in status["partitions"] if p["topic"] == topic)
    assert entry["last_cleaning"]["messages_written"] < entry["last_cleaning"]["messages_read"]
    assert entry["uncleanable"] is False
    assert 0.0 <= entry["dirty_ratio"] <= 1.0
    assert status["cleaner_enabled"] is True


def test_missing_directory_is_one_error_line(tmp_path):
    assert_user_error(run("cleaner", "status", "--log-dir", str(tmp_path / "absent")),
                      "does not exist")


def test_directory_without_status_file_is_one_error_line(tmp_path):
    assert_user_error(run("cleaner", "status", "--log-dir", str(tmp_path)),
                      f"has no {STATUS_FILE}")


def test_corrupt_status_file_is_one_error_line(tmp_path):
    (tmp_path / STATUS_FILE).write_text("{not json")
    assert_user_error(run("cleaner", "status", "--log-dir", str(tmp_path), "-o", "json"),
                      "cannot read")
