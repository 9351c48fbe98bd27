"""Storage I/O errors reach clients as KAFKA_STORAGE_ERROR (56) for the partition concerned
(NOT_LEADER_OR_FOLLOWER for Fetch v0-5, which predate 56, as Kafka answers them).

The Produce and Fetch handlers run against a real ``BrokerState`` and ``LogManager`` on real
files; appends go through a fault-injecting file system that raises ``OSError(EIO)`` on log
writes while switched on, and reads fail on a segment descriptor that is made to point at a
directory under the log (pread then raises EISDIR).
"""

from __future__ import annotations

import asyncio
import errno
import os
import time
from pathlib import Path

from headrace.broker.config import BrokerConfig
from headrace.broker.context import RequestContext
from headrace.broker.handlers import fetch, produce
from headrace.broker.state import AppendHub, BrokerState, ProducerIdAllocator
from headrace.errors import KafkaStorageError, NotLeaderOrFollower
from headrace.protocol import records as record_codec
from headrace.protocol import wire
from headrace.storage.clock import SystemClock
from headrace.storage.fs import RealFileSystem
from headrace.storage.manager import LogManager

PRODUCE_VERSION, FETCH_VERSION = 9, 12
TOPIC = "faulty"


class FailingWritesFileSystem(RealFileSystem):
    """Raises EIO on writes to ``.log`` segment files while ``failing`` is set."""

    def __init__(self) -> None:
        self.failing = False
        self._log_fds: set[int] = set()

    def open(self, path: Path, flags: int) -> int:
        fd = super().open(path, flags)
        if str(path).endswith(".log"):
            self._log_fds.add(fd)
        return fd

    def write(self, fd: int, data) -> int:
        if self.failing and fd in self._log_fds:
            raise OSError(errno.EIO, "injected write error")
        return super().write(fd, data)


def _request(api_key: int, version: int, values: dict):
    body = wire.build(wire.request_class(api_key, version), values)
    frame = wire.encode_request(api_key, version, 7, "storage-errors", body)
    return wire.decode_request(frame[4:])


async def _call(state: BrokerState, module, request):
    """The handler's response decoded as a client would (record data read from its files)."""
    context = RequestContext(request.header, state, state.clock.now_ms())
    response = await module.handle(context, request.body)
    body = b"".join(part if isinstance(part, bytes) else part.read_bytes()
                    for part in response.parts)
    header = request.header
    return wire.read_entity(wire.response_class(header.api_key, header.api_version), body, 0)[0]


def _produce_request(partitions: int):
    batch = record_codec.build_batch([(b"k", b"value", [], int(time.time() * 1000))])
    return _request(produce.API_KEY, PRODUCE_VERSION, {
        "acks": -1, "timeout": 30000,
        "topic_data": [{"name": TOPIC, "partition_data": [
            {"index": index, "records": batch} for index in range(partitions)]}]})


def _fetch_request(partitions: int, version: int = FETCH_VERSION):
    return _request(fetch.API_KEY, version, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20,
        "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": TOPIC, "partitions": [
            {"partition": index, "fetch_offset": 0, "partition_max_bytes": 1 << 20,
             "current_leader_epoch": -1, "last_fetched_epoch": -1, "log_start_offset": -1}
            for index in range(partitions)]}],
        "forgotten_topics_data": [], "rack_id": ""})


async def _scenario(data_dir: Path) -> None:
    config = BrokerConfig.load(None, environment={}, overrides=[f"log.dirs={data_dir}"])
    fs = FailingWritesFileSystem()
    manager = LogManager([data_dir], config.properties(), SystemClock(), fs=fs)
    manager.startup()
    state = BrokerState(
        config=config, log_manager=manager, clock=SystemClock(), node_id=1, cluster_id="c",
        advertised_host="127.0.0.1", advertised_port=1,
        producer_ids=ProducerIdAllocator(data_dir),
        appended=AppendHub(asyncio.get_running_loop()),
    )
    try:
        manager.create_topic(TOPIC, 2, {})
        first = await _call(state, produce, _produce_request(2))
        assert [p.error_code for p in first.responses[0].partition_responses] == [0, 0]

        fs.failing = True
        failed = await _call(state, produce, _produce_request(1))
        assert failed.responses[0].partition_responses[0].error_code == KafkaStorageError.code
        fs.failing = False

        directory_fd = os.open(data_dir, os.O_RDONLY)
        os.dup2(directory_fd, manager.get_log(TOPIC, 1).segments[0].fd)
        os.close(directory_fd)
        answer = await _call(state, fetch, _fetch_request(2))
        partitions = answer.responses[0].partitions
        assert partitions[0].error_code == 0 and len(partitions[0].records) > 0
        codes = [p.error_code for p in partitions]
        assert codes == [0, KafkaStorageError.code]
        for version, code in ((6, KafkaStorageError.code), (5, NotLeaderOrFollower.code)):
            answer = await _call(state, fetch, _fetch_request(2, version))  # Kafka: v0-5 do
            assert [p.error_code for p in answer.responses[0].partitions] == [0, code]  # not know 56
    finally:
        state.append_executor.shutdown(wait=True)


def test_io_errors_answer_kafka_storage_error_per_partition(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path / "data"))
