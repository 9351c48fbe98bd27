"""DescribeLogDirs (api key 35), versions 0-5: size on disk per partition, per log directory.

Kafka's semantics (``ReplicaManager.describeLogDirs``): one result per configured log directory,
named by its absolute path, even when it holds none of the requested partitions. Within it, the
requested partitions it holds, grouped by topic; a topic or partition that does not exist is
simply left out. ``topics`` null asks for every partition. Per partition:

* ``partition_size``: the log's size in bytes, the sum of its segment ``.log`` file sizes
  (indexes, snapshots and checkpoints are not counted), as Kafka's ``UnifiedLog.size``;
* ``offset_lag``: high watermark minus log end offset, floored at 0 -- always 0 on one node;
* ``is_future_key``: false (no AlterReplicaLogDirs moves).

v4+ adds the volume's ``total_bytes`` and ``usable_bytes`` (``statvfs``: blocks and blocks
available to unprivileged users, times the fragment size); v5 adds ``is_cordoned`` (false). A
directory that cannot be read answers KAFKA_STORAGE_ERROR with no topics, as Kafka does for an
offline log directory. The top-level error code is NONE (no authorizer, so
CLUSTER_AUTHORIZATION_FAILED never applies).

Stateless; runs on the event loop thread. ``Log.size_bytes`` reads the log's immutable view,
safe to call concurrently with appends. v0 has v1's format (kio lacks it; wire.py answers
v1's classes for it).
"""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from headrace.errors import (
    KafkaError,
    KafkaStorageError,
    NotLeaderOrFollower,
    UnknownTopicOrPartition,
)

API_KEY = 35
MIN_VERSION = 0
MAX_VERSION = 5

UNKNOWN_BYTES = -1  # Kafka's default for total_bytes/usable_bytes when not known


def _requested_partitions(log_manager: Any, topics: Any) -> set[tuple[str, int]]:
    """The (topic, partition) pairs asked for that exist on this broker."""
    if topics is None:
        return {(name, index) for name, info in log_manager.topics().items()
                for index in range(info.partitions)}
    wanted = set()
    for topic in topics:
        try:
            info = log_manager.topic(topic.topic)
        except UnknownTopicOrPartition:
            continue
        wanted.update((topic.topic, index) for index in topic.partitions
                      if 0 <= index < info.partitions)
    return wanted


def _sizes_by_dir(log_manager: Any, partitions: set[tuple[str, int]]
                  ) -> dict[str, dict[str, list[tuple[int, int]]]]:
    """log dir (absolute) -> topic -> [(partition, size in bytes)]."""
    by_dir: dict[str, dict[str, list[tuple[int, int]]]] = defaultdict(lambda: defaultdict(list))
    for topic, index in sorted(partitions):
        try:
            log = log_manager.get_log(topic, index)
        except (UnknownTopicOrPartition, KafkaStorageError, NotLeaderOrFollower):
            continue  # deleted since, offline, or (in a cluster) led by another broker
        by_dir[os.path.abspath(log.dir.parent)][topic].append((index, log.size_bytes))
    return by_dir


def _volume_bytes(log_dir: str) -> tuple[int, int]:
    """(total, usable) bytes of the volume holding ``log_dir``."""
    try:
        stats = os.statvfs(log_dir)
    except OSError as error:
        raise KafkaStorageError(f"Log directory {log_dir} is offline: {error}") from error
    return stats.f_blocks * stats.f_frsize, stats.f_bavail * stats.f_frsize


def _dir_result(log_dir: str, topics: dict[str, list[tuple[int, int]]]) -> dict[str, Any]:
    result: dict[str, Any] = {"log_dir": log_dir, "error_code": 0, "topics": [],
                              "total_bytes": UNKNOWN_BYTES, "usable_bytes": UNKNOWN_BYTES,
                              "is_cordoned": False}
    try:
        result["total_bytes"], result["usable_bytes"] = _volume_bytes(log_dir)
    except KafkaError as error:
        result["error_code"] = error.code
        return result
    result["topics"] = [
        {"name": topic, "partitions": [
            {"partition_index": index, "partition_size": size_bytes, "offset_lag": 0,
             "is_future_key": False} for index, size_bytes in sizes]}
        for topic, sizes in topics.items()
    ]
    return result


async def handle(ctx, request):
    log_manager = ctx.broker.log_manager
    by_dir = _sizes_by_dir(log_manager, _requested_partitions(log_manager, request.topics))
    log_dirs = [os.path.abspath(Path(d)) for d in log_manager.log_dirs]
    results = [_dir_result(log_dir, by_dir.get(log_dir, {})) for log_dir in log_dirs]
    return ctx.respond({"throttle_time": 0, "error_code": 0, "results": results})
