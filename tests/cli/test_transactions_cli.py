"""``headrace transactions`` against real broker subprocesses: list and describe a real
confluent-kafka transactional producer's id, describe-producers, misuse as one-line errors,
and a real hanging transaction -- a transactional producer SIGKILLed mid-transaction with a
long transaction.timeout.ms, whose coordinator state is then lost -- that find-hanging shows,
abort ends, and read_committed consumers then read past."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import uuid

from confluent_kafka import Consumer, IsolationLevel, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from tests.broker.test_transactions import ZOMBIE_SCRIPT
from tests.cli.cli_runner import assert_user_error
from tests.conftest import BrokerProcess

TIMEOUT_S = 30
POLL_LIMIT = 100
LONG_TRANSACTION_TIMEOUT_MS = 900_000  # the broker's transaction.max.timeout.ms default


def _headrace(bootstrap: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "HEADRACE_BOOTSTRAP_SERVER": bootstrap}
    return subprocess.run([sys.executable, "-m", "headrace.cli.main", "transactions", *args],
                          capture_output=True, env=env, timeout=TIMEOUT_S * 2)


def _json(bootstrap: str, *args: str):
    result = _headrace(bootstrap, *args, "--output", "json")
    assert result.returncode == 0, result.stderr.decode()
    return json.loads(result.stdout)


def _topic(bootstrap: str) -> str:
    name = f"txcli-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(TIMEOUT_S)
    return name


def _produce_plain(bootstrap: str, topic: str, value: bytes) -> None:
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(topic, value, partition=0)
    assert producer.flush(TIMEOUT_S) == 0


def _last_stable_offset(bootstrap: str, topic: str) -> int:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    futures = admin.list_offsets({TopicPartition(topic, 0): OffsetSpec.latest()},
                                 isolation_level=IsolationLevel.READ_COMMITTED)
    return next(iter(futures.values())).result(TIMEOUT_S).offset


def _read_committed(bootstrap: str, topic: str, expected: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": uuid.uuid4().hex,
                         "isolation.level": "read_committed", "auto.offset.reset": "earliest",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        for _ in range(POLL_LIMIT):
            if len(values) >= expected:
                break
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                values.append(message.value())
    finally:
        consumer.close()
    return values


def test_list_and_describe_a_committed_transactional_id(broker):
    topic = _topic(broker.bootstrap)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    producer = Producer({"bootstrap.servers": broker.bootstrap,
                         "transactional.id": transactional_id, "transaction.timeout.ms": 45_000})
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"one", partition=0)
    producer.commit_transaction(TIMEOUT_S)
    described = _json(broker.bootstrap, "describe", "--transactional-id", transactional_id)
    assert (described["state"], described["transaction_timeout_ms"],
            described["producer_epoch"]) == ("CompleteCommit", 45_000, 0)
    listed = _json(broker.bootstrap, "list", "--state", "CompleteCommit")["transactions"]
    assert {"transactional_id": transactional_id, "coordinator_id": described["coordinator_id"],
            "producer_id": described["producer_id"], "state": "CompleteCommit"} in listed
    assert _json(broker.bootstrap, "list", "--state", "Ongoing", "--producer-id",
                 str(described["producer_id"]))["transactions"] == []
    producers = _json(broker.bootstrap, "describe-producers", "--topic", topic,
                      "--partition", "0")["producers"]
    assert [(p["producer_id"], p["last_sequence"], p["current_transaction_start_offset"])
            for p in producers] == [(described["producer_id"], 0, None)]
    table = _headrace(broker.bootstrap, "describe", "--transactional-id", transactional_id)
    assert b"CompleteCommit" in table.stdout and transactional_id.encode() in table.stdout


def test_misuse_is_one_line_and_a_non_zero_exit(broker):
    topic = _topic(broker.bootstrap)
    bootstrap = broker.bootstrap
    assert_user_error(_headrace(bootstrap, "abort", "--topic", topic, "--partition", "0"),
                      "--start-offset")
    assert_user_error(_headrace(bootstrap, "abort", "--topic", topic, "--partition", "0",
                                "--producer-id", "7"), "--producer-epoch")
    assert_user_error(_headrace(bootstrap, "abort", "--topic", topic, "--partition", "0",
                                "--start-offset", "0"), "could not find any open transactions")
    assert_user_error(_headrace(bootstrap, "find-hanging"), "--topic or --broker-id")
    assert_user_error(_headrace(bootstrap, "find-hanging", "--partition", "0"), "needs --topic")
    assert_user_error(_headrace(bootstrap, "describe", "--transactional-id", "never-seen"),
                      "TransactionalIdNotFound")
    assert_user_error(_headrace(bootstrap, "describe-producers", "--topic", "missing-topic",
                                "--partition", "0"), "unknown topic")
    assert_user_error(_headrace(bootstrap, "list", "--state", "Sleeping"),
                      "unknown transaction states: Sleeping")


def _kill_mid_transaction(bootstrap: str, topic: str, transactional_id: str) -> None:
    producer = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE_SCRIPT, bootstrap, topic, transactional_id,
         str(LONG_TRANSACTION_TIMEOUT_MS)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert producer.stdout.readline() == b"in-transaction\n"
    finally:
        producer.send_signal(signal.SIGKILL)
        producer.wait(TIMEOUT_S)


def _lose_coordinator_state(broker: BrokerProcess) -> None:
    """Restart the broker without its ``__transaction_state`` partitions: the coordinator no
    longer knows the transaction, which so hangs."""
    broker.stop()
    for directory in broker.data_dir.glob("__transaction_state-*"):
        shutil.rmtree(directory)
    broker.start()


def test_a_hanging_transaction_is_found_aborted_and_read_past(fresh_broker):
    bootstrap = fresh_broker.bootstrap
    topic = _topic(bootstrap)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    _produce_plain(bootstrap, topic, b"before")
    _kill_mid_transaction(bootstrap, topic, transactional_id)
    _produce_plain(bootstrap, topic, b"after")
    # The coordinator still holds the transaction (and would abort it after its timeout):
    # not hanging, as Kafka's tool judges.
    assert _json(bootstrap, "describe", "--transactional-id", transactional_id)[
        "topic_partitions"] == [f"{topic}-0"]
    assert _json(bootstrap, "find-hanging", "--topic", topic,
                 "--max-transaction-timeout", "0")["hanging"] == []
    _lose_coordinator_state(fresh_broker)
    assert _last_stable_offset(bootstrap, topic) == 1
    broker_id = str(min(AdminClient({"bootstrap.servers": bootstrap}).list_topics(
        timeout=TIMEOUT_S).brokers))
    (hanging,) = _json(bootstrap, "find-hanging", "--broker-id", broker_id,
                       "--max-transaction-timeout", "0")["hanging"]
    assert (hanging["topic"], hanging["partition"], hanging["current_transaction_start_offset"]
            ) == (topic, 0, 1)
    assert _json(bootstrap, "find-hanging", "--topic", topic)["hanging"] == []  # < 15 min
    aborted = _json(bootstrap, "abort", "--topic", topic, "--partition", "0",
                    "--start-offset", "1")["aborted"]
    assert (aborted["producer_id"], aborted["coordinator_epoch"]) == (hanging["producer_id"], 0)
    assert _last_stable_offset(bootstrap, topic) == 4  # before, hanging, after, the marker
    assert _read_committed(bootstrap, topic, 2) == [b"before", b"after"]
    assert _json(bootstrap, "find-hanging", "--topic", topic, "--partition", "0",
                 "--max-transaction-timeout", "0")["hanging"] == []
