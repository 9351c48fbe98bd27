"""Transactions end to end: confluent-kafka's transactional producer against a real broker.

The broker's transaction coordinator (FindCoordinator key type 1, InitProducerId with a
transactional id, AddPartitionsToTxn, EndTxn), the markers it writes, fencing of zombies
(a second producer with the same transactional id), KIP-890 part 1 (a transactional batch
for a partition not in the transaction is refused) and the coordinator's state surviving a
restart, read back with DescribeTransactions.
"""

from __future__ import annotations

import asyncio
import signal
import struct
import subprocess
import sys
import time
import uuid

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaProducer

from headrace import errors
from headrace.protocol.batch import parse_header
from headrace.protocol.control_records import marker_of_batch
from headrace.protocol.records import build_batch
from tests.broker.raw_client import RawClient
from tests.conftest import BrokerProcess

PRODUCE, FETCH = 0, 1
OFFSET_FETCH = 9
FIND_COORDINATOR = 10
INIT_PRODUCER_ID = 22
ADD_PARTITIONS_TO_TXN = 24
WRITE_TXN_MARKERS = 27
DESCRIBE_TRANSACTIONS = 65
LIST_TRANSACTIONS = 66
TIMEOUT_S = 30


def _topic(bootstrap: str, partitions: int = 2) -> str:
    name = f"txn-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1)])[name].result(TIMEOUT_S)
    return name


def _producer(bootstrap: str, transactional_id: str, **config) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                     "transaction.timeout.ms": 60_000, **config})


def _describe(bootstrap: str, transactional_id: str):
    with RawClient(bootstrap) as client:
        response = client.request(DESCRIBE_TRANSACTIONS, 0,
                                  {"transactional_ids": [transactional_id]})
    return response.transaction_states[0]


def _markers(bootstrap: str, topic: str, partition: int) -> list[tuple[int, int, bool]]:
    """(producer id, epoch, commit) of every marker in the partition, read uncommitted."""
    with RawClient(bootstrap) as client:
        body = client.request(FETCH, 11, {
            "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 10_000_000,
            "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{
                "partition": partition, "fetch_offset": 0, "partition_max_bytes": 10_000_000,
                "current_leader_epoch": -1, "last_fetched_epoch": -1,
                "log_start_offset": -1}]}],
            "forgotten_topics_data": [], "rack_id": ""})
    data = bytes(body.responses[0].partitions[0].records or b"")
    markers, position = [], 0
    while position < len(data):
        header = parse_header(data, position)
        marker = marker_of_batch(data, position) if header.is_control else None
        if marker is not None:
            markers.append((header.producer_id, header.producer_epoch, marker.commit))
        position += header.size_bytes
    return markers


def _commit_one(bootstrap: str, topic: str, transactional_id: str, value: bytes) -> Producer:
    producer = _producer(bootstrap, transactional_id)
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, value, partition=0)
    producer.commit_transaction(TIMEOUT_S)
    return producer


def test_committed_transaction_is_described_complete(broker):
    topic = _topic(broker.bootstrap)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    producer = _producer(broker.bootstrap, transactional_id)
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    for partition in (0, 1):
        producer.produce(topic, b"v", partition=partition)
    producer.flush(TIMEOUT_S)
    ongoing = _describe(broker.bootstrap, transactional_id)
    assert ongoing.transaction_state == "Ongoing"
    assert sorted((t.topic, tuple(t.partitions)) for t in ongoing.topics) == [(topic, (0, 1))]
    producer.commit_transaction(TIMEOUT_S)
    done = _describe(broker.bootstrap, transactional_id)
    assert (done.error_code, done.transaction_state, done.topics) == (0, "CompleteCommit", ())
    for partition in (0, 1):
        assert _markers(broker.bootstrap, topic, partition) == [
            (done.producer_id, done.producer_epoch, True)]


def test_a_second_producer_fences_the_first(broker):
    topic = _topic(broker.bootstrap)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    zombie = _producer(broker.bootstrap, transactional_id)
    zombie.init_transactions(TIMEOUT_S)
    zombie.begin_transaction()
    zombie.produce(topic, b"zombie", partition=0)
    zombie.flush(TIMEOUT_S)
    successor = _commit_one(broker.bootstrap, topic, transactional_id, b"successor")
    with pytest.raises(KafkaException) as raised:
        zombie.commit_transaction(TIMEOUT_S)
    assert raised.value.args[0].fatal()
    described = _describe(broker.bootstrap, transactional_id)
    assert described.transaction_state == "CompleteCommit"
    # the zombie's transaction aborted with a bumped epoch, then the successor's committed
    pid = described.producer_id
    assert _markers(broker.bootstrap, topic, 0) == [(pid, 1, False), (pid, 2, True)]
    successor.flush(TIMEOUT_S)


def test_timeout_above_the_broker_maximum_is_refused(fresh_broker):
    with RawClient(fresh_broker.bootstrap) as client:
        response = client.request(INIT_PRODUCER_ID, 4, {
            "transactional_id": "too-long", "transaction_timeout": 900_001,
            "producer_id": -1, "producer_epoch": -1})
    assert response.error_code == errors.InvalidTransactionTimeout.code


def test_find_coordinator_for_a_transactional_id_is_this_broker(broker):
    with RawClient(broker.bootstrap) as client:
        response = client.request(FIND_COORDINATOR, 4, {
            "key_type": 1, "coordinator_keys": ["some-transactional-id"]})
    coordinator = response.coordinators[0]
    assert (coordinator.error_code, coordinator.port) == (0, broker.port)


def test_transactions_survive_a_restart(fresh_broker):
    topic = _topic(fresh_broker.bootstrap)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    _commit_one(fresh_broker.bootstrap, topic, transactional_id, b"before").flush(TIMEOUT_S)
    before = _describe(fresh_broker.bootstrap, transactional_id)
    fresh_broker.kill()
    fresh_broker.start()
    after = _describe(fresh_broker.bootstrap, transactional_id)
    assert (after.error_code, after.transaction_state, after.producer_id,
            after.producer_epoch) == (0, "CompleteCommit", before.producer_id,
                                      before.producer_epoch)
    again = _commit_one(fresh_broker.bootstrap, topic, transactional_id, b"after")
    again.flush(TIMEOUT_S)
    assert _describe(fresh_broker.bootstrap, transactional_id).producer_epoch == (
        before.producer_epoch + 1)


def test_list_transactions_filters_by_state(broker):
    topic = _topic(broker.bootstrap)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    committed_id = f"tx-{uuid.uuid4().hex[:8]}"
    _commit_one(broker.bootstrap, topic, committed_id, b"done").flush(TIMEOUT_S)
    producer = _producer(broker.bootstrap, transactional_id)
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"v", partition=0)
    producer.flush(TIMEOUT_S)
    with RawClient(broker.bootstrap) as client:
        response = client.request(LIST_TRANSACTIONS, 0, {
            "state_filters": ["Ongoing", "NoSuchState"], "producer_id_filters": []})
    assert response.error_code == 0
    assert list(response.unknown_state_filters) == ["NoSuchState"]
    listed = {t.transactional_id: t.transaction_state for t in response.transaction_states}
    assert listed.get(transactional_id) == "Ongoing"
    assert committed_id not in listed
    assert set(listed.values()) == {"Ongoing"}
    producer.abort_transaction(TIMEOUT_S)


def _raw_produce(client: RawClient, topic: str, transactional_id: str, batch: bytes) -> int:
    body = client.request(PRODUCE, 9, {
        "transactional_id": transactional_id, "acks": -1, "timeout": 30000,
        "topic_data": [{"name": topic, "partition_data": [{"index": 0, "records": batch}]}]})
    return body.responses[0].partition_responses[0].error_code


def test_a_transactional_batch_for_a_partition_not_in_the_transaction_is_refused(broker):
    """KIP-890 part 1: without AddPartitionsToTxn the append would start a transaction the
    coordinator does not know, which nothing would ever end."""
    topic = _topic(broker.bootstrap, partitions=1)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    with RawClient(broker.bootstrap) as client:
        init = client.request(INIT_PRODUCER_ID, 4, {
            "transactional_id": transactional_id, "transaction_timeout": 60_000,
            "producer_id": -1, "producer_epoch": -1})
        pid, epoch = init.producer_id, init.producer_epoch

        def batch(sequence: int) -> bytes:
            return build_batch([(b"k", b"v", (), 0)], producer_id=pid, producer_epoch=epoch,
                               base_sequence=sequence, transactional=True)

        assert _raw_produce(client, topic, transactional_id, batch(0)) == (
            errors.InvalidTxnState.code)
        added = client.request(ADD_PARTITIONS_TO_TXN, 3, {
            "v3_and_below_transactional_id": transactional_id,
            "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": [0]}]})
        assert added.results_by_topic_v3_and_below[0].results_by_partition[0] \
            .partition_error_code == 0
        assert _raw_produce(client, topic, transactional_id, batch(0)) == 0
        assert _raw_produce(client, topic, "another-id", batch(1)) == (
            errors.InvalidProducerIdMapping.code)


def _read_values(bootstrap: str, topic: str, isolation_level: str, count: int) -> list[bytes]:
    """Up to ``count`` values of partition 0 from the start, bounded in polls and time."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "isolation.level": isolation_level, "enable.auto.commit": False,
                         "auto.offset.reset": "earliest", "enable.partition.eof": True})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        values: list[bytes] = []
        for _ in range(200):
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                if message.error().code() == KafkaError._PARTITION_EOF:
                    break
                raise KafkaException(message.error())
            values.append(message.value())
            if len(values) >= count:
                break
        return values
    finally:
        consumer.close()


def test_read_committed_never_sees_aborted_records(broker):
    topic = _topic(broker.bootstrap, partitions=1)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    producer = _producer(broker.bootstrap, transactional_id)
    producer.init_transactions(TIMEOUT_S)
    for round_ in range(3):
        producer.begin_transaction()
        producer.produce(topic, f"aborted-{round_}".encode(), partition=0)
        producer.flush(TIMEOUT_S)
        producer.abort_transaction(TIMEOUT_S)
        producer.begin_transaction()
        producer.produce(topic, f"committed-{round_}".encode(), partition=0)
        producer.commit_transaction(TIMEOUT_S)
    committed = [f"committed-{r}".encode() for r in range(3)]
    assert _read_values(broker.bootstrap, topic, "read_committed", 6) == committed
    uncommitted = _read_values(broker.bootstrap, topic, "read_uncommitted", 6)
    assert sorted(uncommitted) == sorted(committed + [f"aborted-{r}".encode() for r in range(3)])


def _offset_fetch(bootstrap: str, group_id: str, topic: str, require_stable: bool):
    """(offset, error code) of partition 0 by OffsetFetch v7."""
    with RawClient(bootstrap) as client:
        body = client.request(OFFSET_FETCH, 7, {
            "group_id": group_id, "require_stable": require_stable,
            "topics": [{"name": topic, "partition_indexes": [0]}]})
    partition = body.topics[0].partitions[0]
    return partition.committed_offset, partition.error_code


def _offsets_in_transaction(bootstrap: str, transactional_id: str, group_id: str,
                            topic: str, offset: int) -> Producer:
    """A producer whose ongoing transaction holds ``offset`` for the group (not ended)."""
    producer = _producer(bootstrap, transactional_id)
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    producer.produce(topic, b"out", partition=0)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group_id})
    try:
        producer.send_offsets_to_transaction([TopicPartition(topic, 0, offset)],
                                             consumer.consumer_group_metadata(), TIMEOUT_S)
    finally:
        consumer.close()
    return producer


def test_offsets_sent_to_a_transaction_are_committed_with_it(broker):
    topic = _topic(broker.bootstrap, partitions=1)
    group_id = f"g-{uuid.uuid4().hex[:8]}"
    producer = _offsets_in_transaction(broker.bootstrap, f"tx-{uuid.uuid4().hex[:8]}",
                                       group_id, topic, 5)
    assert _offset_fetch(broker.bootstrap, group_id, topic, require_stable=True) == (
        -1, errors.UnstableOffsetCommit.code)
    assert _offset_fetch(broker.bootstrap, group_id, topic, require_stable=False) == (-1, 0)
    producer.commit_transaction(TIMEOUT_S)
    assert _offset_fetch(broker.bootstrap, group_id, topic, require_stable=True) == (5, 0)


def test_offsets_sent_to_an_aborted_transaction_are_dropped(broker):
    topic = _topic(broker.bootstrap, partitions=1)
    group_id = f"g-{uuid.uuid4().hex[:8]}"
    producer = _offsets_in_transaction(broker.bootstrap, f"tx-{uuid.uuid4().hex[:8]}",
                                       group_id, topic, 7)
    producer.abort_transaction(TIMEOUT_S)
    assert _offset_fetch(broker.bootstrap, group_id, topic, require_stable=True) == (-1, 0)


def test_transactional_offsets_are_reloaded_after_a_restart(fresh_broker):
    topic = _topic(fresh_broker.bootstrap, partitions=1)
    committed_group, aborted_group = f"g-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    for group_id, offset, commit in ((committed_group, 3, True), (aborted_group, 4, False)):
        producer = _offsets_in_transaction(fresh_broker.bootstrap, f"tx-{group_id}", group_id,
                                           topic, offset)
        if commit:
            producer.commit_transaction(TIMEOUT_S)
        else:
            producer.abort_transaction(TIMEOUT_S)
    fresh_broker.kill()
    fresh_broker.start()
    fetched = None
    for _ in range(100):  # the offsets topic loads in the background after start
        fetched = _offset_fetch(fresh_broker.bootstrap, committed_group, topic, True)
        if fetched[1] != errors.CoordinatorLoadInProgress.code:
            break
    assert fetched == (3, 0)
    assert _offset_fetch(fresh_broker.bootstrap, aborted_group, topic, True) == (-1, 0)


def _wait_for_state(bootstrap: str, transactional_id: str, state: str, timeout_s: float = 30):
    """DescribeTransactions until the id is in ``state``; the last description."""
    deadline = time.monotonic() + timeout_s
    described = _describe(bootstrap, transactional_id)
    while described.transaction_state != state and time.monotonic() < deadline:
        time.sleep(0.05)  # polling an observed state, bounded by the deadline
        described = _describe(bootstrap, transactional_id)
    return described


def test_a_hanging_transaction_is_aborted_when_it_times_out(tmp_path):
    broker = BrokerProcess(tmp_path / "data", {
        "transaction.abort.timed.out.transaction.cleanup.interval.ms": "100"})
    (tmp_path / "data").mkdir()
    broker.start()
    try:
        topic = _topic(broker.bootstrap, partitions=1)
        transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
        hanging = _producer(broker.bootstrap, transactional_id, **{
            "transaction.timeout.ms": 1000})
        hanging.init_transactions(TIMEOUT_S)
        hanging.begin_transaction()
        hanging.produce(topic, b"hanging", partition=0)
        hanging.flush(TIMEOUT_S)
        plain = Producer({"bootstrap.servers": broker.bootstrap})
        plain.produce(topic, b"after", partition=0)  # behind the open transaction's LSO
        plain.flush(TIMEOUT_S)
        described = _wait_for_state(broker.bootstrap, transactional_id, "CompleteAbort")
        assert described.transaction_state == "CompleteAbort"
        assert _markers(broker.bootstrap, topic, 0) == [(described.producer_id, 1, False)]
        # the LSO moved past the aborted transaction: read_committed reaches the plain record
        assert _read_values(broker.bootstrap, topic, "read_committed", 2) == [b"after"]
        with pytest.raises(KafkaException):  # its epoch was bumped: fenced
            hanging.commit_transaction(TIMEOUT_S)
    finally:
        broker.stop()


def test_a_transaction_open_when_the_broker_is_killed_is_aborted_by_the_next_producer(
        fresh_broker):
    topic = _topic(fresh_broker.bootstrap, partitions=1)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    before = _producer(fresh_broker.bootstrap, transactional_id)
    before.init_transactions(TIMEOUT_S)
    before.begin_transaction()
    before.produce(topic, b"lost", partition=0)
    before.flush(TIMEOUT_S)
    fresh_broker.kill()
    fresh_broker.start()
    after = _commit_one(fresh_broker.bootstrap, topic, transactional_id, b"kept")
    after.flush(TIMEOUT_S)
    assert _read_values(fresh_broker.bootstrap, topic, "read_committed", 2) == [b"kept"]
    described = _describe(fresh_broker.bootstrap, transactional_id)
    assert _markers(fresh_broker.bootstrap, topic, 0) == [
        (described.producer_id, 1, False), (described.producer_id, 2, True)]


def test_an_initialised_id_is_described_empty_without_a_start_time(broker):
    """Kafka answers start time -1 for an id with no transaction (kio's decoder refuses a
    negative timestamp, so the frame is read by hand: timeout and start time follow the
    state string)."""
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    with RawClient(broker.bootstrap) as client:
        init = client.request(INIT_PRODUCER_ID, 4, {
            "transactional_id": transactional_id, "transaction_timeout": 60_000,
            "producer_id": -1, "producer_epoch": -1})
        assert init.error_code == 0
        client.send(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [transactional_id]})
        frame = client.receive_frame()
    after_state = frame.index(b"\x06Empty") + len(b"\x06Empty")
    timeout_ms, start_ms = struct.unpack_from(">iq", frame, after_state)
    assert (timeout_ms, start_ms) == (60_000, -1)
    unknown = _describe(broker.bootstrap, f"never-{uuid.uuid4().hex[:8]}")
    assert unknown.error_code == errors.TransactionalIdNotFound.code


def test_kafka_python_transactions_commit_and_abort(broker):
    topic = _topic(broker.bootstrap, partitions=1)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap,
                             transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(topic, b"kp-aborted", partition=0)
        producer.flush()
        producer.abort_transaction()
        producer.begin_transaction()
        producer.send(topic, b"kp-committed", partition=0)
        producer.commit_transaction()
    finally:
        producer.close()
    assert _read_values(broker.bootstrap, topic, "read_committed", 2) == [b"kp-committed"]


def test_aiokafka_transactions_commit_and_abort_with_read_committed(broker):
    topic = _topic(broker.bootstrap, partitions=1)

    async def scenario() -> list[bytes]:
        producer = AIOKafkaProducer(bootstrap_servers=broker.bootstrap,
                                    transactional_id=f"tx-{uuid.uuid4().hex[:8]}")
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(topic, b"aio-committed", partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait(topic, b"aio-aborted", partition=0)
            await producer.abort_transaction()
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(bootstrap_servers=broker.bootstrap,
                                    isolation_level="read_committed",
                                    auto_offset_reset="earliest", enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition(topic, 0)])
            batches = await consumer.getmany(timeout_ms=5_000)
            values = [m.value for records in batches.values() for m in records]
            end = (await consumer.end_offsets([AioTopicPartition(topic, 0)]))[
                AioTopicPartition(topic, 0)]
            return values, end
        finally:
            await consumer.stop()

    values, end_offset = asyncio.run(scenario())
    assert values == [b"aio-committed"]
    assert end_offset == 4  # read_committed: the LSO, past both transactions and markers


def test_consume_transform_produce_commits_output_and_input_offsets_together(broker):
    source, sink = _topic(broker.bootstrap, partitions=1), _topic(broker.bootstrap, partitions=1)
    group_id = f"ctp-{uuid.uuid4().hex[:8]}"
    feeder = Producer({"bootstrap.servers": broker.bootstrap})
    for index in range(4):
        feeder.produce(source, f"in-{index}".encode(), partition=0)
    feeder.flush(TIMEOUT_S)
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group_id,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "isolation.level": "read_committed"})
    producer = _producer(broker.bootstrap, f"tx-{group_id}")
    producer.init_transactions(TIMEOUT_S)
    try:
        consumer.subscribe([source])
        consumed = []
        for _ in range(100):
            message = consumer.poll(1.0)
            if message is not None and not message.error():
                consumed.append(message)
            if len(consumed) == 4:
                break
        assert len(consumed) == 4
        for commit, batch in ((False, consumed[:2]), (True, consumed[:2]), (True, consumed[2:])):
            producer.begin_transaction()
            for message in batch:
                producer.produce(sink, message.value().replace(b"in", b"out"), partition=0)
            producer.send_offsets_to_transaction(
                [TopicPartition(source, 0, batch[-1].offset() + 1)],
                consumer.consumer_group_metadata(), TIMEOUT_S)
            if commit:
                producer.commit_transaction(TIMEOUT_S)
            else:
                producer.abort_transaction(TIMEOUT_S)
        committed = consumer.committed([TopicPartition(source, 0)], TIMEOUT_S)[0].offset
    finally:
        consumer.close()
    assert committed == 4
    assert _read_values(broker.bootstrap, sink, "read_committed", 4) == [
        f"out-{index}".encode() for index in range(4)]


ZOMBIE_SCRIPT = """
import sys
from confluent_kafka import Producer
bootstrap, topic, transactional_id = sys.argv[1:4]
timeout_ms = int(sys.argv[4]) if len(sys.argv) > 4 else 60000
producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id,
                     "transaction.timeout.ms": timeout_ms})
producer.init_transactions(30)
producer.begin_transaction()
producer.produce(topic, b"from-the-killed-producer", partition=0)
producer.flush(30)
print("in-transaction", flush=True)
sys.stdin.read()  # holds the transaction open until killed
"""


def test_a_sigkilled_producers_transaction_is_aborted_by_its_successor(broker):
    topic = _topic(broker.bootstrap, partitions=1)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    zombie = subprocess.Popen(
        [sys.executable, "-c", ZOMBIE_SCRIPT, broker.bootstrap, topic, transactional_id],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert zombie.stdout.readline() == b"in-transaction\n"
        assert _describe(broker.bootstrap, transactional_id).transaction_state == "Ongoing"
    finally:
        zombie.send_signal(signal.SIGKILL)
        zombie.wait(TIMEOUT_S)
    _commit_one(broker.bootstrap, topic, transactional_id, b"from-the-successor").flush(
        TIMEOUT_S)
    assert _read_values(broker.bootstrap, topic, "read_committed", 2) == [b"from-the-successor"]


def test_write_txn_markers_from_another_coordinator_ends_the_transaction_here(broker):
    topic = _topic(broker.bootstrap, partitions=1)
    transactional_id = f"tx-{uuid.uuid4().hex[:8]}"
    with RawClient(broker.bootstrap) as client:
        init = client.request(INIT_PRODUCER_ID, 4, {
            "transactional_id": transactional_id, "transaction_timeout": 60_000,
            "producer_id": -1, "producer_epoch": -1})
        pid, epoch = init.producer_id, init.producer_epoch
        client.request(ADD_PARTITIONS_TO_TXN, 3, {
            "v3_and_below_transactional_id": transactional_id,
            "v3_and_below_producer_id": pid, "v3_and_below_producer_epoch": epoch,
            "v3_and_below_topics": [{"name": topic, "partitions": [0]}]})
        batch = build_batch([(b"k", b"by-marker", (), 0)], producer_id=pid,
                            producer_epoch=epoch, base_sequence=0, transactional=True)
        assert _raw_produce(client, topic, transactional_id, batch) == 0
        assert _read_values(broker.bootstrap, topic, "read_committed", 1) == []
        answer = client.request(WRITE_TXN_MARKERS, 1, {"markers": [{
            "producer_id": pid, "producer_epoch": epoch, "transaction_result": True,
            "coordinator_epoch": 0,
            "topics": [{"name": topic, "partition_indexes": [0]},
                       {"name": f"missing-{uuid.uuid4().hex[:8]}", "partition_indexes": [0]}],
        }]})
    codes = [[p.error_code for p in t.partitions] for t in answer.markers[0].topics]
    assert codes == [[0], [errors.UnknownTopicOrPartition.code]]
    assert _markers(broker.bootstrap, topic, 0) == [(pid, epoch, True)]
    assert _read_values(broker.bootstrap, topic, "read_committed", 1) == [b"by-marker"]
