"""The broker's shared state, handed to every request handler as ``ctx.broker``.

Owns ``BrokerState`` (config, log manager, clock, identity, producer id allocator, append
notification hub, the append thread), ``ProducerIdAllocator`` and ``AppendHub``.

Files, in the first log directory (Java properties text):

* ``meta.properties`` -- ``version=1``, ``cluster.id`` (22-char URL-safe base64 of a UUID,
  as Kafka's ``kafka-storage random-uuid``), ``node.id``; written once, read at start. In
  cluster mode the file is Kafka's ZooKeeper-mode version 0 instead (``cluster_membership``).
* ``producer-ids.properties`` -- ``next.block.start``: the first producer id not yet handed
  out in a persisted block. Ids are allocated in blocks of ``PRODUCER_ID_BLOCK_SIZE``; the
  block end is fsynced before any id of it is used, so ids are never reused after a crash.
  In cluster mode there is no such file: blocks are claimed in ZooKeeper
  (``headrace.cluster.producer_id_blocks``), so brokers never hand out the same id.

Thread-safety: handlers run on the event loop thread. ``AppendHub.notify`` may be called from
any thread (log append listeners) and hops to the loop with ``call_soon_threadsafe`` (plain
``call_soon`` when already on it). ``AppendHub`` must be created on the loop's thread.
``ProducerIdAllocator`` takes a lock. Appends run on ``append_executor``, a single thread,
because ``Log.append`` may fsync; reads are thread-safe and run on the loop. A small produce
may append on the loop thread instead, only while ``append_thread_idle`` (see there).
Checkpoint writes run on ``background_executor`` (one thread; the server awaits each job
before scheduling the next, so at most one is pending): no append waits for their fsyncs.
"""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from headrace.broker.config import BrokerConfig
from headrace.broker.os_threads import name_this_thread
from headrace.storage.config import format_properties_text, parse_properties_text

META_PROPERTIES_FILE = "meta.properties"
PRODUCER_IDS_FILE = "producer-ids.properties"
PRODUCER_ID_BLOCK_SIZE = 1000


def write_properties_durably(path: Path, properties: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    with open(temporary, "w") as file:
        file.write(format_properties_text(properties))
        file.flush()
        os.fsync(file.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def random_cluster_id() -> str:
    """Kafka's cluster id format: a UUID as 22 characters of URL-safe base64."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


def load_or_create_cluster_id(log_dir: Path, node_id: int) -> str:
    """The cluster id in ``meta.properties``, creating the file on first start."""
    path = log_dir / META_PROPERTIES_FILE
    if path.exists():
        cluster_id = parse_properties_text(path.read_text()).get("cluster.id")
        if cluster_id:
            return cluster_id
    cluster_id = random_cluster_id()
    write_properties_durably(
        path, {"version": "1", "cluster.id": cluster_id, "node.id": str(node_id)}
    )
    return cluster_id


class ProducerIdAllocator:
    """Hands out producer ids that are never reused, across restarts and crashes: from blocks
    persisted in ``log_dir``'s file, or, in a cluster, from blocks ``claim_block`` claims
    (``headrace.cluster.producer_id_blocks``: ``() -> (first id, end id exclusive)``)."""

    def __init__(self, log_dir: Path, block_size: int = PRODUCER_ID_BLOCK_SIZE,
                 claim_block: Callable[[], tuple[int, int]] | None = None) -> None:
        self._path = log_dir / PRODUCER_IDS_FILE
        self._block_size = block_size
        self._claim_block = claim_block or self._claim_file_block
        self._lock = threading.Lock()
        start = 0
        if claim_block is None and self._path.exists():
            start = int(parse_properties_text(self._path.read_text()).get("next.block.start", 0))
        self._next_id = start
        self._block_end = start

    def next_id_without_io(self) -> int | None:
        """The next id when it is in the block already claimed; None when taking it means
        claiming the next block (an fsync or a ZooKeeper write: call ``next_id`` off the event
        loop then)."""
        with self._lock:
            if self._next_id >= self._block_end:
                return None
            producer_id = self._next_id
            self._next_id += 1
            return producer_id

    def next_id(self) -> int:
        """The next id, claiming the next block first when the current one is used up."""
        with self._lock:
            if self._next_id >= self._block_end:
                self._next_id, self._block_end = self._claim_block()
            producer_id = self._next_id
            self._next_id += 1
            return producer_id

    def _claim_file_block(self) -> tuple[int, int]:
        block_end = self._next_id + self._block_size
        write_properties_durably(self._path, {"next.block.start": str(block_end)})
        return self._next_id, block_end


class AppendHub:
    """Wakes fetch long-polls when a partition they wait on gets new records.

    A waiter is an ``asyncio.Event`` registered for a set of (topic, partition) keys; each
    ``Log`` gets one append listener (hooked lazily by ``watch``) that calls ``notify`` from
    the appending thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._loop_thread_id = threading.get_ident()
        self._waiters: dict[tuple[str, int], set[asyncio.Event]] = {}
        self._hooked_logs: dict[tuple[str, int], Any] = {}

    def watch(self, log: Any) -> None:
        """Make sure appends to ``log`` are notified (idempotent; survives log re-creation)."""
        key = (log.topic, log.partition)
        if self._hooked_logs.get(key) is log:
            return
        self._hooked_logs[key] = log
        log.add_append_listener(lambda _log_end_offset: self.notify(key))

    def register(self, keys: list[tuple[str, int]], event: asyncio.Event) -> None:
        for key in keys:
            self._waiters.setdefault(key, set()).add(event)

    def unregister(self, keys: list[tuple[str, int]], event: asyncio.Event) -> None:
        for key in keys:
            waiters = self._waiters.get(key)
            if waiters is not None:
                waiters.discard(event)
                if not waiters:
                    del self._waiters[key]

    def waiter_count(self, key: tuple[str, int]) -> int:
        """How many fetches are parked on ``key`` (a read for tests and metrics)."""
        return len(self._waiters.get(key, ()))

    def notify(self, key: tuple[str, int]) -> None:
        """Thread-safe: schedule waking every waiter of ``key`` on the event loop.

        Appends to a partition nobody waits on cost no loop wake-up. That check cannot lose
        a wake-up: a fetch registers its event before re-reading the log, so an append it
        misses in that read finds the registration here (``in`` on a dict is atomic)."""
        if key not in self._waiters:
            return
        if threading.get_ident() == self._loop_thread_id:  # an inline append on the loop
            self._loop.call_soon(self._wake, key)
            return
        try:
            self._loop.call_soon_threadsafe(self._wake, key)
        except RuntimeError:  # the loop is closed: the broker is shutting down
            pass

    def _wake(self, key: tuple[str, int]) -> None:
        for event in self._waiters.get(key, ()):
            event.set()


@dataclass
class BrokerState:
    config: BrokerConfig
    log_manager: Any  # headrace.storage.manager.LogManager
    clock: Any  # headrace.storage.clock.Clock
    node_id: int
    cluster_id: str
    advertised_host: str
    advertised_port: int
    producer_ids: ProducerIdAllocator
    appended: AppendHub
    groups: Any = None  # headrace.broker.group_service.GroupService, set by the server
    transactions: Any = None  # headrace.broker.transaction_service.TransactionService, ditto
    cleaner: Any = None  # headrace.broker.cleaner_service.CleanerService, set by the server
    scrub: Any = None  # headrace.broker.scrub_service.ScrubService, set by the server
    # headrace.broker.cluster_membership.ClusterMembership in cluster mode (zookeeper.connect
    # set), None for a single-node broker; set by the server
    membership: Any = None
    # headrace.broker.cluster_service.ClusterService in cluster mode, None on a single node
    cluster: Any = None
    # headrace.broker.controller_service.ControllerService in cluster mode, set by the server
    controller: Any = None
    append_executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(
            1, thread_name_prefix="headrace-append", initializer=name_this_thread,
            initargs=("hr-append",))
    )
    background_executor: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(
            1, thread_name_prefix="headrace-background", initializer=name_this_thread,
            initargs=("hr-background",))
    )

    appends_submitted: int = 0  # jobs handed to the append thread; the loop thread writes it
    appends_completed: int = 0  # jobs it finished; only the append thread writes it

    async def run_append(self, function, *args):
        """Run a log-mutating call (append, create, delete...) on the single append thread."""
        loop = asyncio.get_running_loop()
        self.appends_submitted += 1
        return await loop.run_in_executor(self.append_executor, self._counted, function, args)

    def _counted(self, function, args):
        try:
            return function(*args)
        finally:
            self.appends_completed += 1

    @property
    def append_thread_idle(self) -> bool:
        """Event loop thread only: no job is queued on or running on the append thread.

        Only the loop thread submits append-thread jobs, so while this holds, log-mutating
        work done on the loop thread (``handlers.produce``'s inline appends) is serialized
        with every append-thread job, as if it ran there."""
        return self.appends_completed == self.appends_submitted

    async def run_background(self, function, *args):
        """Run work no request waits for (checkpoint writes and their fsyncs) on the single
        background thread, never on the append thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.background_executor, function, *args)
