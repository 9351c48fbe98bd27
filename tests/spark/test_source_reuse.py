"""What the source carries from one Spark task or query to the next: leader connections kept
open between fetch clients, the fetch size's slow start, the worker heap frozen at the first
read, and the planner's cached AdminClients."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap

from conftest import append, new_topic

from headrace.spark.fetch import next_fetch_offset
from headrace.spark.offsets import AdminClientCache, BrokerOffsets
from headrace.spark.wire_fetch import (
    FIRST_FETCH_PARTITION_BYTES,
    FetchClientConfig,
    IdleConnections,
    PartitionFetchClient,
)
from headrace.storage.clock import ManualClock

MIB = 1024 * 1024
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _client(bootstrap: str, topic: str, pool: IdleConnections, partition: int = 0,
            **options: str) -> PartitionFetchClient:
    config = FetchClientConfig.from_client_options({"bootstrap.servers": bootstrap, **options})
    return PartitionFetchClient(config, topic, partition, idle_connections=pool)


def _cluster(client: PartitionFetchClient) -> tuple:
    return (client.config.bootstrap_servers, client.config.client_id)


def _fetched_offsets(client: PartitionFetchClient, offset: int) -> int:
    client.send_fetch(offset)
    response = client.receive_fetch()
    assert response.error_code == 0
    return next_fetch_offset(response.records, offset)[0]


def test_a_released_connection_serves_the_next_client_of_the_cluster(bootstrap):
    topic = new_topic(bootstrap, 2)
    append(bootstrap, topic, 0, [b"v%d" % i for i in range(5)])
    append(bootstrap, topic, 1, [b"w%d" % i for i in range(3)])
    pool = IdleConnections(max_connections=2)
    first = _client(bootstrap, topic, pool)
    assert _fetched_offsets(first, 0) == 5
    first.release()
    assert pool.idle_count == 1
    for partition, end_offset in ((0, 5), (1, 3)):  # Metadata, then Fetch, on that connection
        client = _client(bootstrap, topic, pool, partition)
        assert _fetched_offsets(client, 2) == end_offset
        assert pool.idle_count == 0
        client.release()
        assert pool.idle_count == 1
    other_cluster = _client(bootstrap, topic, pool, **{"client.id": "another"})
    assert _fetched_offsets(other_cluster, 0) == 5  # its own connection
    assert pool.idle_count == 1
    other_cluster.release()
    assert pool.idle_count == 2
    for cluster in (_cluster(first), _cluster(other_cluster)):
        pool.take(cluster).close()


def test_connections_with_requests_in_flight_or_closed_are_not_kept(bootstrap):
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v"])
    pool = IdleConnections(max_connections=2)
    busy = _client(bootstrap, topic, pool)
    busy.send_fetch(0)  # never received: the answer would reach the next client
    busy.release()
    assert pool.idle_count == 0
    idle = _client(bootstrap, topic, pool)
    assert _fetched_offsets(idle, 0) == 1
    idle.release()
    assert pool.idle_count == 1
    kept = pool.take(_cluster(idle))
    kept._socket.shutdown(socket.SHUT_RD)  # reads as the broker closing the connection
    pool.give_back(_cluster(idle), kept)
    assert pool.idle_count == 0


def test_a_closed_client_drops_its_connection(bootstrap):
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v"])
    pool = IdleConnections(max_connections=4)
    failed = _client(bootstrap, topic, pool)
    assert _fetched_offsets(failed, 0) == 1
    failed.close()  # after an error: the connection may be broken
    assert pool.idle_count == 0
    fresh = _client(bootstrap, topic, pool)
    assert _fetched_offsets(fresh, 0) == 1  # connects anew
    fresh.release()
    assert pool.idle_count == 1


def test_pool_keeps_at_most_its_connections(bootstrap):
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v"])
    pool = IdleConnections(max_connections=2)
    clients = [_client(bootstrap, topic, pool) for _ in range(3)]
    for client in clients:
        _fetched_offsets(client, 0)
    for client in clients:
        client.release()
    assert pool.idle_count == 2


def test_fetch_sizes_start_small_and_double_up_to_the_limit(bootstrap):
    topic = new_topic(bootstrap, 1)
    value = b"x" * (256 * 1024)
    append(bootstrap, topic, 0, [value] * 16, batch_per_record=True)  # 4 MiB, 256 KiB batches
    pool = IdleConnections(max_connections=1)
    client = _client(bootstrap, topic, pool, **{"max.partition.fetch.bytes": str(2 * MIB)})
    sizes, responses, offset = [], [], 0
    try:
        while offset < 16:
            sizes.append(client.partition_fetch_bytes)
            client.send_fetch(offset)
            records = client.receive_fetch().records
            offset, whole_bytes = next_fetch_offset(records, offset)
            responses.append(whole_bytes)
    finally:
        client.close()
    assert sizes[:3] == [FIRST_FETCH_PARTITION_BYTES, 2 * MIB, 2 * MIB]
    assert responses[0] <= FIRST_FETCH_PARTITION_BYTES < responses[1] <= 2 * MIB
    small = _client(bootstrap, topic, pool, **{"max.partition.fetch.bytes": "1000"})
    assert small.partition_fetch_bytes == 1000


def test_the_first_read_in_a_process_freezes_its_heap_once(bootstrap):
    topic = new_topic(bootstrap, 1)
    append(bootstrap, topic, 0, [b"v%d" % i for i in range(3)])
    script = textwrap.dedent(f"""
        import gc
        from headrace.spark.offsets import OffsetRange
        from headrace.spark.options import parse_source_options
        from headrace.spark.source import OffsetRangePartition, _read_partition
        options = parse_source_options({{"kafka.bootstrap.servers": "{bootstrap}",
                                         "subscribe": "{topic}"}}, streaming=False)
        partition = OffsetRangePartition(OffsetRange("{topic}", 0, 0, 3), options)
        counts = [gc.get_freeze_count()]
        for _ in range(2):
            rows = sum(batch.num_rows for batch in _read_partition(partition))
            assert rows == 3, rows
            counts.append(gc.get_freeze_count())
            gc.collect()
        print(*counts)
    """)
    environment = {**os.environ, "PYTHONPATH": REPO_ROOT}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            env=environment, timeout=120, check=True)
    before, after_first, after_second = map(int, result.stdout.split())
    assert before == 0
    assert after_first > 10_000  # pyspark, pyarrow and headrace's objects
    assert after_second <= after_first  # frozen once: the second read adds nothing


def test_admin_clients_are_shared_per_configuration_until_idle():
    clock = ManualClock()
    cache = AdminClientCache(max_clients=2, idle_ms=1000, clock=clock)
    first = cache.client({"bootstrap.servers": "127.0.0.1:1"})
    assert cache.client({"bootstrap.servers": "127.0.0.1:1"}) is first
    other = cache.client({"bootstrap.servers": "127.0.0.1:1", "client.id": "other"})
    assert other is not first
    clock.advance(999)
    assert cache.client({"bootstrap.servers": "127.0.0.1:1"}) is first  # used: kept
    clock.advance(1000)
    assert cache.client({"bootstrap.servers": "127.0.0.1:1"}) is not first  # idle: dropped


def test_admin_client_cache_drops_the_least_recently_used():
    cache = AdminClientCache(max_clients=2, idle_ms=60_000, clock=ManualClock())
    configs = [{"bootstrap.servers": f"127.0.0.1:{port}"} for port in (1, 2, 3)]
    one, two = cache.client(configs[0]), cache.client(configs[1])
    assert cache.client(configs[0]) is one
    cache.client(configs[2])  # drops configs[1], the least recently used
    assert cache.client(configs[0]) is one
    assert cache.client(configs[1]) is not two


def test_shared_broker_offsets_query_through_one_admin_client(bootstrap):
    topic = new_topic(bootstrap, 2)
    append(bootstrap, topic, 1, [b"v%d" % i for i in range(3)])
    cache = AdminClientCache(clock=ManualClock())
    keys = [(topic, 0), (topic, 1)]
    for _ in range(2):
        broker = BrokerOffsets.shared({"bootstrap.servers": bootstrap}, cache)
        assert broker.latest(keys) == {(topic, 0): 0, (topic, 1): 3}
    assert broker._admin is BrokerOffsets.shared({"bootstrap.servers": bootstrap}, cache)._admin
