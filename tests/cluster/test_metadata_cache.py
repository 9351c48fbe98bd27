"""The metadata watcher against a real ZooKeeper: its first snapshot is complete even when
its reads lose the connection (each read of a fault-injecting client fails once)."""

from __future__ import annotations

import asyncio

from kazoo.client import KazooClient

from headrace.cluster import zookeeper_paths as paths
from headrace.cluster.metadata_cache import MetadataCache, MetadataWatcher
from headrace.cluster.zookeeper_session import COMMAND_RETRY
from tests.cluster.cluster_helpers import (
    SESSION_TIMEOUT_S,
    WAIT_TIMEOUT_S,
    ConnectionLossOnce,
    close,
    register_broker,
)


def test_the_first_snapshot_lists_brokers_whose_reads_lost_the_connection(
        zookeeper_ensemble, zookeeper_chroot, zookeeper_client):
    zookeeper_client.ensure_path(zookeeper_chroot)
    connect = zookeeper_ensemble.connect_string + zookeeper_chroot
    registrations = [register_broker(connect, broker_id) for broker_id in (1, 2)]
    session = KazooClient(hosts=connect, timeout=SESSION_TIMEOUT_S,  # the broker's retry bounds
                          command_retry={**COMMAND_RETRY, "deadline": SESSION_TIMEOUT_S})
    session.start(timeout=WAIT_TIMEOUT_S)
    flaky = ConnectionLossOnce(session)

    async def first_snapshot():
        cache = MetadataCache()
        watcher = MetadataWatcher(flaky, asyncio.get_running_loop(), cache)
        await asyncio.get_running_loop().run_in_executor(None, watcher.start)
        assert await cache.wait_until(lambda _metadata: cache.loaded, WAIT_TIMEOUT_S * 1000)
        watcher.stop()
        return cache.current

    try:
        snapshot = asyncio.run(first_snapshot())
        assert sorted(snapshot.brokers) == [1, 2]
        assert ("get", paths.broker_id_path(1)) in flaky.failed
    finally:
        close(session)
        for registration in registrations:
            close(registration)
