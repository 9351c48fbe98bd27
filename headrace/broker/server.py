"""The broker process: start-up, the listening socket, background maintenance, clean shutdown.

Owns ``Broker`` (composition root: config -> LogManager -> BrokerState -> asyncio server) and
``run_broker`` (the blocking entry point used by ``headrace broker``).

Event loop: the default asyncio selector loop with ``asyncio.Protocol`` connections, chosen
by measurement (bench/broker_loop.py, kbench; figures in BENCHMARKS.md). On a quiet machine
the Protocol API and streams cost about the same per small request on the default loop
(streams 0.9-1.1x; under load streams were slower, and much slower at sendfile). uvloop
costs 0.2-0.6x the CPU per small round trip but its ``loop.sendfile`` raises
NotImplementedError, so fetched records are pread and written through Python: 0.73-0.79x the
fetch throughput of zero-copy ``os.sendfile``. In kbench (P=1, lz4, quiet) uvloop used less
broker CPU per GB produced and matched consume and p99, not enough to give up zero-copy
fetches. ``HEADRACE_EVENT_LOOP=uvloop`` (environment) runs the broker on uvloop to repeat the
comparison; a value other than ``asyncio``/``uvloop`` is a configuration error.

Start-up: load every log (recovering after an unclean shutdown), bind, then log the time
from process start to serving. Maintenance runs on the append thread, so it never runs
concurrently with an append: every ``MAINTENANCE_INTERVAL_MS`` rolls by segment.ms and the
flush of rolled segments (``LogManager.maintenance(now_ms)``), then expired ``.deleted``
files are unlinked on the background thread (``LogManager.remove_expired_files``). Kafka's
LogManager tasks run on their own intervals, each first after ``log.initial.task.delay.ms``:
the retention check every ``log.retention.check.interval.ms`` (so records are deleted by
retention.ms/retention.bytes no sooner than Kafka would), the flusher (flush.ms) every
``log.flush.scheduler.interval.ms``, and on the background thread the recovery-point and
log-start-offset checkpoints every ``log.flush.offset.checkpoint.interval.ms`` and
``log.flush.start.offset.checkpoint.interval.ms``, and the high watermarks replication
manages every ``replica.high.watermark.checkpoint.interval.ms`` (``LogManager.write_checkpoints``),
so no produce waits for their unlinks and fsyncs. A period of Long.MAX runs its task once, as
Kafka's scheduler does. A step that keeps failing (out of file
descriptors, a full disk) is logged with its traceback at most once per
``MAINTENANCE_FAILURE_LOG_INTERVAL_MS``.
The log cleaner (``CleanerService``) starts after the group coordinator has created
``__consumer_offsets``. Idle connections are closed after ``connections.max.idle.ms`` (a frame
still incomplete after it counts as idle: ``connection``). Connections are accepted by an
``acceptor.Acceptor`` (``max.connections``, ``max.connections.per.ip``, back-off when out of
file descriptors); the bytes of received requests are counted broker-wide by a
``request_memory.RequestMemory`` (``queued.max.request.bytes``).
SIGTERM/SIGINT: in a cluster first a controlled shutdown (the controller moves this broker's
leaderships away, ``cluster_service``), then stop accepting, let in-flight requests finish (up to ``SHUTDOWN_GRACE_MS``),
close connections, stop the cleaner threads (cleanings abort at their next chunk), then
``LogManager.shutdown()``.
Cluster mode (``zookeeper.connect`` set): a ``ClusterMembership`` joins before the broker
state is built (its broker id and cluster id come from ZooKeeper), registers
``/brokers/ids/<id>`` once the listener is bound, then starts its controller (a candidate in
the election, see ``headrace.cluster.controller``), which it stops before it leaves (closes the
session) last. It accepts connections only once its metadata cache holds a complete view (the
cluster id, itself among the live brokers, a live controller), waited for within
``zookeeper.connection.timeout.ms``; until then clients' connections wait in the listen
backlog, so no client is ever answered from an empty view. Before the group coordinator starts, a ``ClusterService`` reads the cluster's
metadata from ZooKeeper, brings the local logs in step with it and routes requests to the
partitions this broker leads.

Everything runs on one event-loop thread, plus the single append thread and the single
background thread of BrokerState, the ``log.cleaner.threads`` cleaner threads and the scrub
thread (``scrub_service``, stopped after the cleaner).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import time
from pathlib import Path

from headrace.broker.acceptor import Acceptor, listening_socket
from headrace.broker.cleaner_service import CleanerService
from headrace.broker.cluster_service import ClusterService
from headrace.broker.config import LONG_MAX, BrokerConfig
from headrace.broker.connection import KafkaConnection
from headrace.broker.controller_service import ControllerService
from headrace.broker.group_service import GroupService
from headrace.broker.rate_limited_log import RateLimitedLog
from headrace.broker.request_memory import RequestMemory
from headrace.broker.scrub_service import ScrubService
from headrace.broker.state import (
    AppendHub,
    BrokerState,
    ProducerIdAllocator,
    load_or_create_cluster_id,
)
from headrace.broker.transaction_service import TransactionService
from headrace.cluster.producer_id_blocks import block_claimer
from headrace.errors import InvalidConfig
from headrace.storage.clock import SystemClock
from headrace.storage.manager import LogManager

log = logging.getLogger(__name__)

MAINTENANCE_INTERVAL_MS = 1000
MAINTENANCE_FAILURE_LOG_INTERVAL_MS = 60_000  # a step failing every time: one traceback a minute
SHUTDOWN_GRACE_MS = 5000
LISTEN_BACKLOG = 1024
EVENT_LOOP_ENVIRONMENT_VARIABLE = "HEADRACE_EVENT_LOOP"
EVENT_LOOPS = ("asyncio", "uvloop")
DEFAULT_EVENT_LOOP = "asyncio"


class Broker:
    def __init__(self, config: BrokerConfig, clock=None, fs=None) -> None:
        """``fs``: the storage file system (``headrace.storage.fs.FileSystem``; the real one
        unless a test injects faults)."""
        self.config = config
        self.clock = clock or SystemClock()
        self.fs = fs
        self.connections: set[KafkaConnection] = set()
        self.state: BrokerState | None = None
        self._acceptor: Acceptor | None = None
        self.request_memory = RequestMemory(config.get_int("queued.max.request.bytes"),
                                            config.get_int("socket.request.max.bytes"))
        self._timers: list[asyncio.Task] = []

    async def start(self) -> None:
        config = self.config
        log_dirs = config.log_dirs
        for log_dir in log_dirs:
            log_dir.mkdir(parents=True, exist_ok=True)
        membership = cluster_membership(config)
        if membership is not None:  # cluster mode: identity from ZooKeeper, as Kafka first
            await asyncio.get_running_loop().run_in_executor(None, membership.join)
        log_manager = LogManager(log_dirs, config.properties(), self.clock, fs=self.fs)
        log_manager.startup()
        config.add_change_listener(log_manager.set_broker_defaults)
        host, port = config.listener
        advertised_host, advertised_port = config.advertised_listener
        self.state = BrokerState(
            config=config,
            log_manager=log_manager,
            clock=self.clock,
            node_id=membership.broker_id if membership else config.node_id,
            cluster_id=membership.cluster_id if membership
            else load_or_create_cluster_id(log_dirs[0], config.node_id),
            advertised_host=advertised_host,
            advertised_port=advertised_port,
            producer_ids=ProducerIdAllocator(log_dirs[0], claim_block=block_claimer(
                membership.session.client, membership.broker_id) if membership else None),
            appended=AppendHub(asyncio.get_running_loop()),
            membership=membership,
        )
        if membership is not None:
            self.state.cluster = ClusterService(self.state, membership.session.client)
            await self.state.cluster.start()
        self.state.groups = GroupService(self.state, in_cluster=membership is not None)
        await self.state.groups.start()
        if self.state.cluster is not None:
            self.state.cluster.follow_offsets_leadership(self.state.groups)
        self.state.transactions = TransactionService(self.state,
                                                     in_cluster=membership is not None)
        await self.state.transactions.start()
        self.state.cleaner = CleanerService(config, log_manager, self.clock)
        await asyncio.get_running_loop().run_in_executor(None, self.state.cleaner.start)
        self.state.scrub = ScrubService(config, log_manager, self.clock)
        self.state.scrub.start()
        loop = asyncio.get_running_loop()
        self._acceptor = Acceptor(
            listening_socket(host, port, LISTEN_BACKLOG), config,
            lambda on_closed: KafkaConnection(self.state, self.connections, self.request_memory,
                                              on_closed))
        bound_port = self._acceptor.port
        if advertised_port == 0:
            self.state.advertised_port = bound_port
        self.port = bound_port
        if membership is not None:  # connections wait in the backlog until the view is complete
            await self._register(membership)
        self._acceptor.start(loop)
        config.add_change_listener(
            lambda _properties: loop.call_soon_threadsafe(self._acceptor.config_changed))
        self._timers = [
            loop.create_task(self._maintenance_loop()),
            loop.create_task(self._idle_reaper_loop()),
            *(loop.create_task(self._log_manager_task(name, interval_config, job))
              for name, interval_config, job in self._log_manager_tasks()),
        ]

    async def _register(self, membership) -> None:
        """Register in ZooKeeper; on failure (broker.id taken) shut down what started."""
        try:
            await asyncio.get_running_loop().run_in_executor(
                None, membership.register, self.state.advertised_host,
                self.state.advertised_port, self.clock.now_ms())
            self.state.controller = ControllerService(membership, self.state.config)
            await asyncio.get_running_loop().run_in_executor(None, self.state.controller.start)
            await self.state.cluster.wait_for_complete_view(
                membership.session.connection_timeout_ms)
        except BaseException:
            await self.stop()
            raise

    def _log_manager_tasks(self):
        """Kafka's LogManager schedule: (task name, its interval's config, the job)."""
        state, manager = self.state, self.state.log_manager
        return (
            ("log retention check", "log.retention.check.interval.ms",
             lambda: state.run_append(manager.maintenance, self.clock.now_ms(), False, True)),
            ("log flusher", "log.flush.scheduler.interval.ms",
             lambda: state.run_append(manager.maintenance, self.clock.now_ms(), True, False)),
            ("recovery-point checkpoint", "log.flush.offset.checkpoint.interval.ms",
             lambda: state.run_background(manager.write_checkpoints, True, False)),
            ("log-start-offset checkpoint", "log.flush.start.offset.checkpoint.interval.ms",
             lambda: state.run_background(manager.write_checkpoints, False, True)),
            ("high-watermark checkpoint", "replica.high.watermark.checkpoint.interval.ms",
             lambda: state.run_background(manager.write_checkpoints, False, False, True)),
        )

    async def _log_manager_task(self, name: str, interval_config: str, job) -> None:
        """Run ``job`` after log.initial.task.delay.ms, then every ``interval_config`` ms;
        once only for a period of Long.MAX (what Kafka's scheduler does) or one not above 0
        (Kafka's runs a negative period once)."""
        period_ms = self.config.get_int(interval_config)
        failures = RateLimitedLog(log, MAINTENANCE_FAILURE_LOG_INTERVAL_MS)
        await asyncio.sleep(self.config.get_int("log.initial.task.delay.ms") / 1000)
        while True:
            try:
                await job()
            except Exception as error:  # e.g. out of file descriptors: retried next period
                failures.event(logging.ERROR, "%s failed: %s", name, error, exc_info=True)
            if period_ms >= LONG_MAX or period_ms <= 0:
                return
            await asyncio.sleep(period_ms / 1000)

    async def _maintenance_loop(self) -> None:
        state, manager = self.state, self.state.log_manager
        steps = (
            ("log maintenance", lambda: state.run_append(manager.maintenance,
                                                         self.clock.now_ms())),
            ("removing deleted files", lambda: state.run_background(
                manager.remove_expired_files, self.clock.now_ms())),
        )
        failures = {name: RateLimitedLog(log, MAINTENANCE_FAILURE_LOG_INTERVAL_MS)
                    for name, _ in steps}
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_MS / 1000)
            for name, step in steps:
                try:
                    await step()
                except Exception as error:  # e.g. out of file descriptors: retried next time
                    failures[name].event(logging.ERROR, "%s failed: %s", name, error,
                                         exc_info=True)

    async def _idle_reaper_loop(self) -> None:
        idle_limit_s = self.config.get_int("connections.max.idle.ms") / 1000
        check_every_s = max(min(idle_limit_s / 10, 30.0), 0.05)
        while True:
            await asyncio.sleep(check_every_s)
            now = time.monotonic()
            for connection in list(self.connections):
                if not connection.busy and now - connection.last_active_monotonic_s > idle_limit_s:
                    connection.abort(f"idle for more than {idle_limit_s * 1000:.0f} ms")

    async def stop(self) -> None:
        """Stop accepting, finish in-flight requests, close connections, shut the logs."""
        if self._acceptor is not None:
            self._acceptor.close()
        for timer in self._timers:
            timer.cancel()
        deadline = time.monotonic() + SHUTDOWN_GRACE_MS / 1000
        while any(c.busy for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        for connection in list(self.connections):
            connection.closing = True
            connection.transport.close()
        state = self.state
        if state is not None:
            if state.cluster is not None:
                await state.cluster.stop()
            if state.groups is not None:
                await state.groups.stop()
            if state.transactions is not None:
                await state.transactions.stop()
            if state.cleaner is not None:
                await asyncio.get_running_loop().run_in_executor(None, state.cleaner.stop)
            if state.scrub is not None:
                await asyncio.get_running_loop().run_in_executor(None, state.scrub.stop)
            await asyncio.get_running_loop().run_in_executor(
                None, state.background_executor.shutdown, True)
            await state.run_append(state.log_manager.shutdown)
            state.append_executor.shutdown(wait=True)
            if state.controller is not None:
                await asyncio.get_running_loop().run_in_executor(None, state.controller.stop)
            if state.membership is not None:  # last, as Kafka closes its ZooKeeper client
                await asyncio.get_running_loop().run_in_executor(None, state.membership.leave)


def cluster_membership(config: BrokerConfig):
    """The broker's ``ClusterMembership`` in cluster mode (``zookeeper.connect`` set), else
    None: a single-node broker does not even import the ZooKeeper client."""
    if not config.get("zookeeper.connect"):
        return None
    from headrace.broker.cluster_membership import ClusterMembership

    return ClusterMembership(config)


async def serve(config: BrokerConfig, process_start_monotonic_s: float) -> None:
    broker = Broker(config)
    stop_requested = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signal_number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signal_number, stop_requested.set)
    await broker.start()
    startup_ms = (time.monotonic() - process_start_monotonic_s) * 1000
    host, _ = config.listener
    log.info(
        "headrace broker %d serving on %s:%d (data in %s), started in %.0f ms",
        broker.state.node_id, host, broker.port,
        ",".join(str(d) for d in config.log_dirs), startup_ms,
    )
    await stop_requested.wait()
    log.info("shutting down")
    if broker.state.cluster is not None:
        await broker.state.cluster.controlled_shutdown()
    await broker.stop()
    log.info("shut down cleanly")


def raise_open_file_limit() -> None:
    """Raise the soft limit on open files to the hard limit, as the JVM does for Kafka
    (MaxFDLimit): each partition's active segment holds its log and index files open, and
    sealed segments open theirs when read, within a share of this limit (see
    ``headrace.storage.segment_files``), so a low default soft limit costs connections."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        log.info("raised the open-file limit from %d to %d", soft, hard)


def run_broker(
    properties_file: Path | None, overrides: list[str], process_start_monotonic_s: float
) -> None:
    """Blocking: run a broker until SIGTERM/SIGINT, on the event loop ``HEADRACE_EVENT_LOOP``
    names (``EVENT_LOOPS``; default ``DEFAULT_EVENT_LOOP``)."""
    config = BrokerConfig.load(properties_file, overrides=overrides)
    raise_open_file_limit()
    loop_name = os.environ.get(EVENT_LOOP_ENVIRONMENT_VARIABLE, DEFAULT_EVENT_LOOP)
    if loop_name not in EVENT_LOOPS:
        raise InvalidConfig(
            f"{EVENT_LOOP_ENVIRONMENT_VARIABLE}={loop_name}: expected one of {EVENT_LOOPS}")
    if loop_name == "uvloop":
        import uvloop

        uvloop.run(serve(config, process_start_monotonic_s))
    else:
        asyncio.run(serve(config, process_start_monotonic_s))
