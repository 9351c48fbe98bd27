"""acks=all in a cluster after the local append (``handlers.produce._replicated``), against
the real leader side (``cluster.leader_replicas.LeaderReplicas`` and its ``PartitionLeader``)
on a real log: a partition whose leader resigned while the records were being appended (the
replica manager applied a newer leader epoch meanwhile) answers NOT_LEADER_OR_FOLLOWER, never
success -- its records reached no follower and the new leader's followers truncate them (fault
campaign seed 100: a deposed leader that resumed after its session expired acknowledged three
such writes). A leader that keeps the partition answers once its followers have the records.
An append by a leader whose epoch the log has moved past (a newer state reached the log before
the replica manager applied it) answers NOT_LEADER_OR_FOLLOWER, which producers retry, never
FENCED_LEADER_EPOCH, which Kafka's brokers never answer to Produce (librdkafka fails the
records).

The interleaving is driven by hand, as it happens in the broker: the leaders are read when the
request starts, the append runs, the new state is applied, then the wait begins."""

from __future__ import annotations

import asyncio
import uuid

from headrace.broker.handlers.produce import _append_one, _replicated
from headrace.cluster.leader_replicas import LeaderReplicas
from headrace.cluster.metadata_cache import ClusterMetadata, TopicMetadata
from headrace.cluster.zookeeper_records import PartitionState
from headrace.errors import NotLeaderOrFollower
from headrace.protocol.records import build_batch
from headrace.storage.clock import ManualClock
from headrace.storage.manager import LogManager
from tests.storage.helpers import NOW_MS, open_log

LEADER, FOLLOWER, OTHER = 1, 2, 3
KEY = ("t", 0)  # open_log's partition
TIMEOUT_MS = 30_000
LAG_TIME_MAX_MS = 10_000


def _snapshot(leader: int, leader_epoch: int, isr: tuple[int, ...]) -> ClusterMetadata:
    topic = TopicMetadata(KEY[0], uuid.UUID(int=1), ((LEADER, FOLLOWER, OTHER),))
    return ClusterMetadata(topics={KEY[0]: topic},
                           states={KEY: PartitionState(leader, leader_epoch, isr, 1)},
                           state_versions={KEY: leader_epoch})


async def _run_append(function, *args):
    return function(*args)


def _leading(tmp_path, log=None) -> LeaderReplicas:
    replicas = LeaderReplicas(LEADER, None, ManualClock(NOW_MS), LAG_TIME_MAX_MS, _run_append,
                              lambda _key: None, lambda _topic, _partition: 0)
    log = log or open_log(tmp_path)
    replicas.apply(_snapshot(LEADER, 2, (LEADER, FOLLOWER, OTHER)), {KEY: log})
    return replicas


def _append(replicas: LeaderReplicas) -> list[dict]:
    """Three records appended by the partition's leader in its epoch, as the produce
    handler's append answers them before the acks=all wait."""
    leader = replicas.leaders[KEY]
    result = leader.log.append(build_batch([(b"k", b"v", [], NOW_MS)] * 3), NOW_MS, True,
                               leader.leader_epoch)
    return [{"name": KEY[0], "partition_responses": [
        {"index": KEY[1], "error_code": 0, "base_offset": result.base_offset,
         "required_offset": result.last_offset + 1}]}]


def test_a_leader_deposed_during_the_append_does_not_acknowledge_acks_all(tmp_path):
    async def scenario() -> int:
        replicas = _leading(tmp_path)
        appended_by = {KEY: replicas.leaders[KEY]}  # what the handler's append records
        responses = _append(replicas)
        # the session expired; the new session's state names another leader in a newer epoch
        replicas.apply(_snapshot(FOLLOWER, 4, (FOLLOWER, OTHER)), {})
        await _replicated(replicas, appended_by, responses, -1, TIMEOUT_MS)
        return responses[0]["partition_responses"][0]["error_code"]

    assert asyncio.run(scenario()) == NotLeaderOrFollower.code


def test_a_leader_that_keeps_the_partition_acknowledges_once_followers_have_the_records(
        tmp_path):
    async def scenario() -> tuple[int, int]:
        replicas = _leading(tmp_path)
        appended_by = {KEY: replicas.leaders[KEY]}  # what the handler's append records
        responses = _append(replicas)
        end = responses[0]["partition_responses"][0]["required_offset"]
        waiting = asyncio.ensure_future(
            _replicated(replicas, appended_by, responses, -1, TIMEOUT_MS))
        await asyncio.sleep(0)  # one loop turn (not a timed wait): the task registers its wait
        assert not waiting.done()
        for follower in (FOLLOWER, OTHER):
            replicas.record_follower_fetch(*KEY, follower, end, 0, 2)
        await waiting
        return responses[0]["partition_responses"][0]["error_code"], \
            replicas.leaders[KEY].log.high_watermark

    assert asyncio.run(scenario()) == (0, 3)


def test_an_append_in_an_epoch_the_log_moved_past_is_not_leader_never_fenced(tmp_path):
    async def scenario() -> tuple[dict, int]:
        manager = LogManager([tmp_path / "logs"], {}, ManualClock(NOW_MS))
        manager.startup()
        manager.create_topic(KEY[0], 1, {})
        log = manager.get_log(*KEY)
        replicas = _leading(tmp_path, log)  # leads in epoch 2
        log.begin_leader_epoch(4)  # the log reached epoch 4 before the state was applied
        end_before = log.log_end_offset
        appended_by: dict = {}
        answer = _append_one(manager, *KEY, build_batch([(b"k", b"v", [], NOW_MS)]), -1,
                             NOW_MS, 9, replicas, appended_by)
        manager.shutdown()
        return answer, log.log_end_offset - end_before

    answer, written = asyncio.run(scenario())
    assert (answer["error_code"], written) == (NotLeaderOrFollower.code, 0)
