"""SIGKILL the broker while acks=all produces run with flush.messages=1: after a restart every
acknowledged record is present exactly once, in acknowledgement order. SIGKILL it right after
its first answer on a fresh data directory: the 50 ``__consumer_offsets`` partitions are
complete on disk and keep their topic id."""

from __future__ import annotations

import threading
from collections import Counter

from headrace.storage.manager import encode_topic_id
from tests.broker.raw_client import RawClient
from tests.broker.test_protocol import METADATA, _batch, _create, _fetch, _produce
from tests.conftest import BrokerProcess
from tests.record_reading import iter_records

ACKS_BEFORE_KILL = 150
TOPIC = "crash-acks-all"


def _produce_until_killed(bootstrap: str, acknowledged: list[bytes], enough: threading.Event):
    try:
        with RawClient(bootstrap) as client:
            sequence = 0
            while True:
                value = f"record-{sequence}".encode()
                answer = _produce(client, TOPIC, _batch([value]), acks=-1)
                assert answer.error_code == 0
                acknowledged.append(value)
                sequence += 1
                if sequence >= ACKS_BEFORE_KILL:
                    enough.set()
    except (ConnectionError, OSError):
        return
    finally:
        enough.set()


def _read_everything(client: RawClient) -> list[bytes]:
    values: list[bytes] = []
    offset = 0
    while True:
        answer = _fetch(client, TOPIC, offset)
        assert answer.error_code == 0
        batch_records = list(iter_records(answer.records))
        fresh = [r for r in batch_records if r.offset >= offset]
        if not fresh:
            return values
        values.extend(r.value for r in fresh)
        offset = fresh[-1].offset + 1


def test_acknowledged_records_survive_sigkill(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = BrokerProcess(data_dir, {"log.flush.interval.messages": "1"})
    broker.start()
    try:
        with RawClient(broker.bootstrap) as client:
            _create(client, TOPIC)
        acknowledged: list[bytes] = []
        enough = threading.Event()
        producer = threading.Thread(target=_produce_until_killed,
                                    args=(broker.bootstrap, acknowledged, enough))
        producer.start()
        enough.wait()
        broker.kill()
        producer.join()
        assert len(acknowledged) >= ACKS_BEFORE_KILL
        broker.start()
        with RawClient(broker.bootstrap) as client:
            stored = _read_everything(client)
    finally:
        broker.stop()
    counts = Counter(stored)
    assert all(count == 1 for count in counts.values()), "a record was stored twice"
    assert stored[: len(acknowledged)] == acknowledged


OFFSETS_TOPIC = "__consumer_offsets"
OFFSETS_PARTITIONS = 50


def _offsets_topic_metadata(bootstrap: str):
    with RawClient(bootstrap) as client:
        body = client.request(METADATA, 12, {"topics": [{"name": OFFSETS_TOPIC}],
                                             "allow_auto_topic_creation": False})
    (topic,) = body.topics
    assert topic.error_code == 0, topic
    return topic


def test_offsets_partitions_are_complete_on_disk_when_first_answered(tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = BrokerProcess(data_dir)
    broker.start()
    try:
        first = _offsets_topic_metadata(broker.bootstrap)
        broker.kill()
        assert len(first.partitions) == OFFSETS_PARTITIONS
        expected = f"version: 0\ntopic_id: {encode_topic_id(first.topic_id)}\n"
        for partition in range(OFFSETS_PARTITIONS):
            directory = data_dir / f"{OFFSETS_TOPIC}-{partition}"
            assert (directory / "partition.metadata").read_text() == expected
            assert not list(directory.glob("*.tmp"))
        broker.start()
        again = _offsets_topic_metadata(broker.bootstrap)
    finally:
        broker.stop()
    assert again.topic_id == first.topic_id and len(again.partitions) == OFFSETS_PARTITIONS
