"""Loading ``__consumer_offsets`` at start-up, against a broker process.

* A genuinely large offsets topic (200k commit records, written with the storage layer before
  the broker starts) keeps the coordinator loading long enough that a raw OffsetFetch sent
  right after start-up answers COORDINATOR_LOAD_IN_PROGRESS (14), then the committed offsets.
* 1,000 groups commit continuously through a broker; the offsets topic is then compacted with
  the storage-layer cleaner on the stopped broker's data directory. The loader replays every
  commit ever made before cleaning and, after it, at most the live keys plus the records of
  the active segments (which the cleaner never touches) -- counted from the broker's
  ``loaded_record_count`` log line, not timed -- and every group's offsets are intact.
"""

from __future__ import annotations

import re
import time

from confluent_kafka.admin import AdminClient, NewTopic

from headrace.coordinator.group import CommittedOffset
from headrace.coordinator.records import OFFSETS_TOPIC_NAME, partition_for_group
from headrace.coordinator.store import offset_commit_record
from headrace.protocol import wire
from headrace.protocol.records import build_batch
from headrace.storage.cleaner import Cleaner
from headrace.storage.clock import SystemClock
from headrace.storage.manager import LogManager
from headrace.storage.offset_map import OffsetMap
from tests.broker.raw_client import RawClient
from tests.conftest import BrokerProcess

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
LOAD_IN_PROGRESS = 14
TOPIC = "events"
POLL_DEADLINE_S = 60.0
POLL_INTERVAL_S = 0.005
LOAD_CATCH_STARTS = 3  # broker starts to catch one loading (see the test)
RECORDS_PER_BATCH = 1000
LOADED_LINE = re.compile(r"loaded_record_count=(\d+)")


def _offsets_topic_overrides(num_partitions: int, segment_bytes: int) -> dict[str, str]:
    return {"offsets.topic.num.partitions": str(num_partitions),
            "offsets.topic.segment.bytes": str(segment_bytes),
            "group.initial.rebalance.delay.ms": "0",
            # this test compacts the offsets topic itself, on the stopped broker's data
            "log.cleaner.enable": "false"}


def _open_logs(data_dir) -> LogManager:
    manager = LogManager([data_dir], {}, SystemClock())
    manager.startup()
    return manager


def _write_commit_history(data_dir, num_partitions: int, segment_bytes: int, group: str,
                          partitions: int, rounds: int) -> None:
    """``rounds`` commits of every partition of ``TOPIC`` by ``group``, offset = round."""
    manager = _open_logs(data_dir)
    try:
        manager.create_topic(OFFSETS_TOPIC_NAME, num_partitions,
                             {"cleanup.policy": "compact", "segment.bytes": str(segment_bytes)})
        log = manager.get_log(OFFSETS_TOPIC_NAME, partition_for_group(group, num_partitions))
        pending = []
        for round_index in range(rounds):
            for partition in range(partitions):
                committed = CommittedOffset(round_index, -1, "", 0)
                key, value = offset_commit_record(group, (TOPIC, partition), committed)
                pending.append((key, value, (), 0))
                if len(pending) == RECORDS_PER_BATCH:
                    log.append(bytearray(build_batch(pending)), 0)
                    pending.clear()
        if pending:
            log.append(bytearray(build_batch(pending)), 0)
    finally:
        manager.shutdown()


def _loaded_record_counts(broker: BrokerProcess) -> list[int]:
    return [int(count) for count in LOADED_LINE.findall(broker.log_text())]


def _wait_until_loaded(broker: BrokerProcess, starts: int) -> int:
    """The loader's record count of the ``starts``-th start-up of this broker."""
    deadline = time.monotonic() + POLL_DEADLINE_S
    while time.monotonic() < deadline:
        counts = _loaded_record_counts(broker)
        if len(counts) >= starts:
            return counts[starts - 1]
        time.sleep(POLL_INTERVAL_S)
    raise AssertionError(f"no loaded_record_count line for start {starts}")


def _fetch_groups(client: RawClient, groups: list[str], partitions: int) -> dict[str, dict]:
    topics = [{"name": TOPIC, "partition_indexes": list(range(partitions))}]
    body = client.request(OFFSET_FETCH, 9, {
        "groups": [{"group_id": group, "topics": topics} for group in groups]})
    return {g.group_id: {"error_code": g.error_code,
                         "offsets": {p.partition_index: p.committed_offset
                                     for t in g.topics for p in t.partitions}}
            for g in body.groups}


def _codes_until_loaded(broker: BrokerProcess, group: str,
                        partitions: int) -> tuple[list[int], dict]:
    """OffsetFetch ``group`` from the broker's start until it answers without error: the
    error codes seen and the last answer."""
    seen_codes = []
    with RawClient(broker.bootstrap) as client:
        deadline = time.monotonic() + POLL_DEADLINE_S
        while time.monotonic() < deadline:
            answer = _fetch_groups(client, [group], partitions)[group]
            seen_codes.append(answer["error_code"])
            if answer["error_code"] == 0:
                break
            time.sleep(POLL_INTERVAL_S)
    return seen_codes, answer


def test_offset_fetch_answers_load_in_progress_until_a_large_topic_is_loaded(tmp_path):
    data_dir = tmp_path / "data"
    group, partitions, rounds = "slow-load", 1000, 200
    _write_commit_history(data_dir, 1, 100 * 1024 * 1024, group, partitions, rounds)
    broker = BrokerProcess(data_dir, _offsets_topic_overrides(1, 100 * 1024 * 1024))
    # The load takes ~1 s; on a loaded machine the first request can come after it, so the
    # broker is started again (and loads again) until one start is caught loading.
    for start in range(1, LOAD_CATCH_STARTS + 1):
        broker.start()
        try:
            seen_codes, answer = _codes_until_loaded(broker, group, partitions)
            assert seen_codes[-1] == 0
            assert answer["offsets"] == {p: rounds - 1 for p in range(partitions)}
            assert _wait_until_loaded(broker, start) == partitions * rounds
        finally:
            broker.stop()
        if seen_codes[0] == LOAD_IN_PROGRESS:
            break
    assert seen_codes[0] == LOAD_IN_PROGRESS, f"no start of {LOAD_CATCH_STARTS} was caught loading"
    assert set(seen_codes[:-1]) == {LOAD_IN_PROGRESS}


def _commit_rounds(bootstrap: str, groups: list[str], partitions: int, rounds: int) -> None:
    """Every group commits every partition of ``TOPIC`` (created first: offsets of a topic that
    does not exist are refused) once per round; requests pipelined per round."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    created = admin.create_topics([NewTopic(TOPIC, num_partitions=partitions)])
    created[TOPIC].result(timeout=POLL_DEADLINE_S)
    with RawClient(bootstrap) as client:
        for round_index in range(rounds):
            sent = []
            for group in groups:
                topics = [{"name": TOPIC, "partitions": [
                    {"partition_index": p, "committed_offset": round_index,
                     "committed_metadata": ""} for p in range(partitions)]}]
                sent.append(client.send(OFFSET_COMMIT, 9, {
                    "group_id": group, "generation_id_or_member_epoch": -1,
                    "member_id": "", "topics": topics}))
            for correlation_id in sent:
                received_id, body = wire.decode_response(OFFSET_COMMIT, 9, client.receive_frame())
                assert received_id == correlation_id
                assert {p.error_code for t in body.topics for p in t.partitions} == {0}


def _clean_offsets_topic(data_dir, num_partitions: int) -> int:
    """Compact every offsets-topic partition; returns the records left in active segments."""
    manager = _open_logs(data_dir)
    try:
        cleaner = Cleaner(OffsetMap())
        active_records = 0
        for partition in range(num_partitions):
            log = manager.get_log(OFFSETS_TOPIC_NAME, partition)
            cleaner.clean(log, log.log_start_offset, SystemClock().now_ms())
            active_records += log.log_end_offset - log.segments[-1].base_offset
        return active_records
    finally:
        manager.shutdown()


def test_load_replays_live_keys_not_every_commit_once_compacted(tmp_path):
    num_partitions, segment_bytes, partitions, rounds = 5, 4 * 1024, 1, 3
    groups = [f"group-{index:04d}" for index in range(1000)]
    live_keys = len(groups) * partitions
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    broker = BrokerProcess(data_dir, _offsets_topic_overrides(num_partitions, segment_bytes))
    broker.start()
    try:
        _wait_until_loaded(broker, 1)
        _commit_rounds(broker.bootstrap, groups, partitions, rounds)
        broker.restart()
        assert _wait_until_loaded(broker, 2) == live_keys * rounds
        broker.stop()
        active_records = _clean_offsets_topic(data_dir, num_partitions)
        broker.start()
        loaded_after_cleaning = _wait_until_loaded(broker, 3)
        assert loaded_after_cleaning <= live_keys + active_records
        assert loaded_after_cleaning < live_keys * rounds // 2
        with RawClient(broker.bootstrap) as client:
            answers = _fetch_groups(client, groups, partitions)
        assert answers == {group: {"error_code": 0,
                                   "offsets": {p: rounds - 1 for p in range(partitions)}}
                           for group in groups}
    finally:
        broker.stop()
