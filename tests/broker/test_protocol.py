"""The broker over raw Kafka wire requests: version negotiation, error codes, idempotent
retries, fetch limits and long polls, and a fuzz of malformed frames (a real subprocess); a
produce answered while a checkpoint's fsync stalls (an in-process broker on a stalling disk)."""

from __future__ import annotations

import asyncio
import struct
import threading
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.broker.config import BrokerConfig
from headrace.broker.server import Broker
from headrace.protocol import records as record_codec
from headrace.protocol import wire
from headrace.storage.checkpoint import RECOVERY_POINT_CHECKPOINT
from headrace.storage.fs import RealFileSystem
from tests.broker.raw_client import RawClient
from tests.conftest import STARTUP_TIMEOUT_S, free_port
from tests.record_reading import iter_records

PRODUCE, FETCH, LIST_OFFSETS, METADATA, API_VERSIONS, INIT_PRODUCER_ID = 0, 1, 2, 3, 18, 22


def _create(client: RawClient, topic: str) -> uuid.UUID:
    body = client.request(METADATA, 12, {"topics": [{"name": topic}],
                                         "allow_auto_topic_creation": True})
    assert body.topics[0].error_code == 0, body
    return body.topics[0].topic_id


def _produce(client: RawClient, topic: str, batch: bytes, acks: int = -1, partition: int = 0):
    body = client.request(PRODUCE, 9, {
        "acks": acks, "timeout": 30000,
        "topic_data": [{"name": topic, "partition_data": [{"index": partition,
                                                           "records": batch}]}],
    })
    return body.responses[0].partition_responses[0]


def _fetch(client: RawClient, topic: str, offset: int, *, version: int = 11,
           max_wait_ms: int = 0, min_bytes: int = 1, max_bytes: int = 50_000_000,
           partition_max_bytes: int = 10_000_000, topic_id: uuid.UUID | None = None):
    topic_entry = {"topic": topic, "topic_id": topic_id,
                   "partitions": [{"partition": 0, "fetch_offset": offset,
                                   "partition_max_bytes": partition_max_bytes,
                                   "current_leader_epoch": -1, "last_fetched_epoch": -1,
                                   "log_start_offset": -1}]}
    body = client.request(FETCH, version, {
        "replica_id": -1, "max_wait": max_wait_ms, "min_bytes": min_bytes,
        "max_bytes": max_bytes, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [topic_entry], "forgotten_topics_data": [], "rack_id": "",
    })
    return body.responses[0].partitions[0]


def _batch(values: list[bytes], **kwargs) -> bytes:
    now = int(time.time() * 1000)
    return record_codec.build_batch([(b"k", v, [], now) for v in values], **kwargs)


def test_api_versions_lists_the_handler_table(broker):
    with RawClient(broker.bootstrap) as client:
        body = client.request(API_VERSIONS, 3, {"client_software_name": "t",
                                                "client_software_version": "1"})
    assert body.error_code == 0
    ranges = {k.api_key: (k.min_version, k.max_version) for k in body.api_keys}
    assert ranges[API_VERSIONS] == (0, 4)
    assert ranges[PRODUCE][1] >= 9 and ranges[FETCH][1] >= 12 and ranges[METADATA][1] >= 12


def test_unsupported_api_versions_version_gets_v0_error_and_ranges(broker):
    with RawClient(broker.bootstrap) as client:
        header = struct.pack(">hhih", API_VERSIONS, 99, 7, 1) + b"x"
        client.send_bytes(struct.pack(">i", len(header)) + header)
        frame = client.receive_frame()
    correlation_id, error_code, count = struct.unpack_from(">ihi", frame)
    assert (correlation_id, error_code) == (7, 35)
    keys = {struct.unpack_from(">h", frame, 10 + 6 * i)[0] for i in range(count)}
    assert {PRODUCE, FETCH, METADATA, API_VERSIONS} <= keys


def test_unsupported_version_closes_only_that_connection(broker):
    with RawClient(broker.bootstrap) as bad, RawClient(broker.bootstrap) as good:
        header = struct.pack(">hhih", PRODUCE, 99, 1, -1) + b"\x00" * 16
        bad.send_bytes(struct.pack(">i", len(header)) + header)
        with pytest.raises(ConnectionError):
            bad.receive_frame()
        assert good.request(API_VERSIONS, 0, {}).error_code == 0


def test_metadata_errors(broker):
    with RawClient(broker.bootstrap) as client:
        body = client.request(METADATA, 12, {"topics": [{"name": "bad/name"},
                                                        {"name": "never-made"}],
                                             "allow_auto_topic_creation": False})
    codes = {t.name: t.error_code for t in body.topics}
    assert codes == {"bad/name": 17, "never-made": 3}
    assert body.brokers[0].port == broker.port and body.cluster_id


def test_metadata_marks_only_kafkas_internal_topics_internal(broker):
    with RawClient(broker.bootstrap) as client:
        _create(client, "__user-topic")
        body = client.request(METADATA, 12, {"topics": None})
    internal = {t.name: t.is_internal for t in body.topics}
    assert internal["__consumer_offsets"] is True
    assert internal["__user-topic"] is False


def test_invalid_acks_and_unknown_partition(broker):
    with RawClient(broker.bootstrap) as client:
        _create(client, "acks-topic")
        assert _produce(client, "acks-topic", _batch([b"x"]), acks=2).error_code == 21
        assert _produce(client, "acks-topic", _batch([b"x"]), partition=9).error_code == 3


def test_idempotent_retry_returns_the_original_offset(broker):
    with RawClient(broker.bootstrap) as client:
        _create(client, "idem-raw")
        pid = client.request(INIT_PRODUCER_ID, 4, {"transactional_id": None,
                                                   "transaction_timeout": 60000,
                                                   "producer_id": -1, "producer_epoch": -1})
        assert pid.error_code == 0 and pid.producer_id >= 0
        batch = _batch([b"a", b"b"], producer_id=pid.producer_id, producer_epoch=0,
                       base_sequence=0)
        first = _produce(client, "idem-raw", batch)
        again = _produce(client, "idem-raw", batch)
        assert first.error_code == again.error_code == 0
        assert again.base_offset == first.base_offset
        gap = _batch([b"c"], producer_id=pid.producer_id, producer_epoch=0, base_sequence=5)
        assert _produce(client, "idem-raw", gap).error_code == 45
        fetched = _fetch(client, "idem-raw", 0)
    values = [r.value for r in iter_records(fetched.records)]
    assert values == [b"a", b"b"]


def test_fetch_limits_offsets_and_topic_ids(broker):
    with RawClient(broker.bootstrap) as client:
        topic_id = _create(client, "fetch-limits")
        for value in (b"1" * 3000, b"2" * 3000, b"3" * 3000):
            assert _produce(client, "fetch-limits", _batch([value])).error_code == 0
        small = _fetch(client, "fetch-limits", 0, max_bytes=10)
        assert [r.value[:1] for r in iter_records(small.records)] == [b"1"]
        assert small.high_watermark == 3 and small.log_start_offset == 0
        by_id = _fetch(client, "fetch-limits", 1, version=13, topic_id=topic_id)
        assert [r.offset for r in iter_records(by_id.records)] == [1, 2]
        assert _fetch(client, "fetch-limits", 99).error_code == 1
        unknown = _fetch(client, "", 0, version=13, topic_id=uuid.uuid4())
        assert unknown.error_code == 100


def _large_fetch_round_trip(bootstrap: str) -> None:
    """Fetches above SENDFILE_MIN_BYTES (several MB of records) come back byte-identical."""
    values = [bytes([65 + n % 26]) * 100_000 for n in range(40)]
    with RawClient(bootstrap) as client:
        _create(client, "large-fetch")
        for start in range(0, len(values), 10):
            assert _produce(client, "large-fetch", _batch(values[start:start + 10])).error_code == 0
        fetched = _fetch(client, "large-fetch", 0)
    assert [r.value for r in iter_records(fetched.records)] == values


def test_large_fetch_is_sent_whole(broker):
    _large_fetch_round_trip(broker.bootstrap)


def test_large_fetch_on_uvloop_reads_slices_through_python(tmp_path, monkeypatch):
    from tests.conftest import _start

    monkeypatch.setenv("HEADRACE_EVENT_LOOP", "uvloop")
    process = _start(tmp_path)
    try:
        _large_fetch_round_trip(process.bootstrap)
    finally:
        process.stop()


LONG_POLL_MAX_WAIT_MS = 3_600_000  # far beyond the test's bounded wait: only a wake-up answers


def test_fetch_long_poll_is_woken_by_an_append(tmp_path):
    """The poll is parked (its waiter registered in the broker's AppendHub) before the append,
    and its max_wait is an hour: an answer within the test's bounded wait comes from a wake-up,
    never from max_wait running out."""
    broker = _InProcessBroker(tmp_path / "data", RealFileSystem())
    answers = []
    try:
        with RawClient(broker.bootstrap) as client:
            _create(client, "long-poll")

        def poll() -> None:
            with RawClient(broker.bootstrap) as poller:
                answers.append(_fetch(poller, "long-poll", 0, max_wait_ms=LONG_POLL_MAX_WAIT_MS))

        thread = threading.Thread(target=poll, daemon=True)
        thread.start()
        hub = broker.broker.state.appended
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while hub.waiter_count(("long-poll", 0)) == 0:  # observed: the fetch is parked
            assert thread.is_alive() and time.monotonic() < deadline, answers
            time.sleep(0.01)
        with RawClient(broker.bootstrap) as producer:
            assert _produce(producer, "long-poll", _batch([b"wake"])).error_code == 0
        thread.join(STARTUP_TIMEOUT_S)
        assert not thread.is_alive(), "the parked fetch was not woken by the append"
    finally:
        broker.stop()
    values = [r.value for r in iter_records(answers[0].records)]
    assert values == [b"wake"]


def test_list_offsets_by_time(broker):
    with RawClient(broker.bootstrap) as client:
        _create(client, "by-time")
        base = int(time.time() * 1000) - 60_000  # recent: older records fall to retention
        for timestamp in (base + 1000, base + 2000, base + 3000):
            batch = record_codec.build_batch([(b"k", b"v", [], timestamp)])
            assert _produce(client, "by-time", batch).error_code == 0
        def lookup(timestamp):
            body = client.request(LIST_OFFSETS, 7, {
                "replica_id": -1, "isolation_level": 0,
                "topics": [{"name": "by-time", "partitions": [
                    {"partition_index": 0, "timestamp": timestamp,
                     "current_leader_epoch": -1}]}]})
            answer = body.topics[0].partitions[0]
            return answer.offset, answer.timestamp
        assert lookup(-2) == (0, -1)
        assert lookup(-1) == (3, -1)
        assert lookup(-3) == (2, base + 3000)
        assert lookup(base + 1500) == (1, base + 2000)
        assert lookup(base + 9999)[0] == -1


_frames = st.one_of(
    st.binary(max_size=200).map(lambda b: struct.pack(">i", len(b)) + b),  # junk body
    st.binary(max_size=40).map(lambda b: struct.pack(">i", len(b) + 50) + b),  # truncated
    st.tuples(st.integers(-5, 80), st.integers(-3, 40), st.binary(max_size=120)).map(
        lambda t: (lambda body: struct.pack(">i", len(body)) + body)(
            struct.pack(">hhih", t[0], t[1], 1, -1) + t[2])),  # any key/version, junk body
    st.integers(-(2**31), 2**31 - 1).map(lambda n: struct.pack(">i", n)),  # bare length
)


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(frames=st.lists(_frames, min_size=1, max_size=4))
def test_malformed_frames_never_disturb_other_connections(broker, frames):
    with RawClient(broker.bootstrap) as victim:
        victim.sock.settimeout(0.2)
        try:
            for frame in frames:
                victim.send_bytes(frame)
            victim.receive_frame()
        except (ConnectionError, TimeoutError, OSError):
            pass
    with RawClient(broker.bootstrap) as other:
        assert other.request(API_VERSIONS, 0, {}).error_code == 0
        assert broker.process.poll() is None


MALFORMED_FRAMES = [
    struct.pack(">i", 7) + b"garbage",  # junk body
    struct.pack(">i", 60) + b"short",  # truncated
    struct.pack(">i", 10) + struct.pack(">hhih", 0, 40, 1, -1),  # unknown version, no body
    struct.pack(">i", 30) + struct.pack(">hhih", 3, 12, 1, -1) + b"\xff" * 20,  # junk Metadata
    struct.pack(">i", -1),  # negative length
]


def test_logs_are_intact_after_malformed_frames(broker):
    """Its own malformed frames (not the fuzz test's, which may not have run before), then
    the log of a topic is whole and the broker logged no traceback since this test began."""
    log_start = broker.log_bytes()
    for frame in MALFORMED_FRAMES:
        with RawClient(broker.bootstrap) as victim:
            try:
                victim.send_bytes(frame)
                victim.receive_frame()
            except (ConnectionError, TimeoutError, OSError):
                pass
    with RawClient(broker.bootstrap) as client:
        _create(client, "after-fuzz")
        values = [bytes([i]) * 10 for i in range(5)]
        for value in values:
            assert _produce(client, "after-fuzz", _batch([value])).error_code == 0
        fetched = _fetch(client, "after-fuzz", 0)
    assert [r.value for r in iter_records(fetched.records)] == values
    assert "Traceback" not in broker.log_text(since_byte=log_start)


def test_response_body_encoder_matches_kio_for_fetch_v4():
    from headrace.broker.fetch_response import TopicData, encode_fetch_body

    parts, size = encode_fetch_body(4, 0, 0, [TopicData("t", uuid.UUID(int=0))])
    encoded = b"".join(parts)
    assert len(encoded) == size
    body = wire.read_entity(wire.response_class(FETCH, 4), encoded, 0)[0]
    assert body.responses[0].topic == "t"


@pytest.mark.parametrize("version", range(3, 13))
def test_produce_response_encoder_matches_kio_byte_for_byte(version):
    from headrace.broker.handlers.produce import encode_produce_body

    responses = [
        {"name": "a", "partition_responses": [
            {"index": 0, "error_code": 0, "base_offset": 41, "log_append_time": -1,
             "log_start_offset": 3},
            {"index": 7, "error_code": 87, "base_offset": -1, "log_append_time": -1,
             "log_start_offset": -1, "error_message": "One or more records have been rejected",
             "record_errors": ((3, "Compacted topic cannot accept message without key"),
                               (9, None))},
        ]},
        {"name": "b-topic", "partition_responses": [
            {"index": 2, "error_code": 0, "base_offset": 2**40, "log_append_time": 1_700_000_000_123,
             "log_start_offset": 0}]},
    ]
    as_kio = [{**topic, "partition_responses": [
        {**partition, "record_errors": [
            {"batch_index": index, "batch_index_error_message": message}
            for index, message in partition.get("record_errors", ())]}
        for partition in topic["partition_responses"]]} for topic in responses]
    expected = wire.encode_body(wire.build(wire.response_class(PRODUCE, version),
                                           {"responses": as_kio, "throttle_time": 0}))
    assert encode_produce_body(version, responses) == expected


class _CheckpointFsyncGate(RealFileSystem):
    """Fault injection: an fsync of a recovery-point checkpoint being written hangs until
    ``release`` (a disk stalling on exactly that file)."""

    def __init__(self) -> None:
        self.path_of_fd: dict[int, str] = {}
        self.entered = threading.Event()
        self.released = threading.Event()

    def open(self, path, flags: int) -> int:
        fd = super().open(path, flags)
        self.path_of_fd[fd] = str(path)
        return fd

    def fsync(self, fd: int) -> None:
        if self.path_of_fd.get(fd, "").endswith(RECOVERY_POINT_CHECKPOINT + ".tmp"):
            self.entered.set()
            self.released.wait()
        super().fsync(fd)


class _InProcessBroker:
    """A ``Broker`` on its own event-loop thread, for tests that inject storage faults."""

    def __init__(self, data_dir, fs) -> None:
        config = BrokerConfig.load(None, overrides=[
            f"listeners=PLAINTEXT://127.0.0.1:{free_port()}", f"log.dirs={data_dir}",
            "offsets.topic.num.partitions=1", "log.initial.task.delay.ms=0",
            "log.flush.offset.checkpoint.interval.ms=100"])
        self.broker = Broker(config, fs=fs)
        self.serving = threading.Event()
        self.thread = threading.Thread(target=asyncio.run, args=(self._serve(),))
        self.thread.start()
        assert self.serving.wait(STARTUP_TIMEOUT_S), "in-process broker did not start"

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.stop_requested = asyncio.Event()
        await self.broker.start()
        self.serving.set()
        await self.stop_requested.wait()
        await self.broker.stop()

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.broker.port}"

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.stop_requested.set)
        self.thread.join()


def test_produce_is_answered_while_a_checkpoint_fsync_hangs(tmp_path):
    gate = _CheckpointFsyncGate()
    broker = _InProcessBroker(tmp_path / "data", gate)
    try:
        with RawClient(broker.bootstrap) as client:
            _create(client, "checkpoint-stall")
            assert gate.entered.wait(STARTUP_TIMEOUT_S), "maintenance never wrote a checkpoint"
            answer = _produce(client, "checkpoint-stall", _batch([b"not blocked"]), acks=-1)
            assert answer.error_code == 0 and not gate.released.is_set()
    finally:
        gate.released.set()
        broker.stop()
