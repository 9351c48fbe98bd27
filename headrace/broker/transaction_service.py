"""The broker side of the transaction coordinator: storage, markers, timers and parked
requests around the pure ``headrace.coordinator.transaction.TransactionCoordinator``.

Owns ``TransactionService``:

* at start-up it creates the internal topic ``__transaction_state`` if missing
  (``transaction.state.log.num.partitions`` partitions, ``cleanup.policy=compact``,
  ``segment.bytes=transaction.state.log.segment.bytes``; the replication factor is 1 on one
  node), marks every partition loading (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and replays
  them in the background, ``transaction.state.log.load.buffer.size`` bytes at a time (in a
  cluster nothing is created or loaded at start: every id answers NOT_COORDINATOR until
  ``leadership_changed`` hands partitions over, which nothing calls yet). Loading
  is per partition (``begin_loading`` / ``finish_loading`` / ``unload`` of the coordinator)
  so a cluster's leadership changes can drive it as they drive the group coordinator;
* ``call(request)`` runs one coordinator call and carries out its effects:
  ``AppendToTransactionLog`` becomes one uncompressed v2 batch appended to that partition
  on the append thread, its outcome reported back as ``AppendResult``; ``WriteTxnMarkers``
  writes one control batch per partition through ``Log.append_transaction_marker`` on the
  append thread (one written to a ``__consumer_offsets`` partition also tells the group
  coordinator, ``TxnOffsetsCompleted``, to commit or drop the producer's pending offsets),
  each partition's outcome reported
  back as ``TxnMarkersResult`` (failed ones are retried by the coordinator's timer);
* a timer (``coordinator_runtime.CoordinatorRuntime``, with the parked requests) calls
  ``tick(now_ms)`` at ``next_deadline_ms()`` (transaction timeouts,
  transactional id expiry, marker retries).

Producer ids come from the broker's persisted allocator (an fsync per 1000 ids, on the event
loop thread when a block runs out). The coordinator epoch of every partition is 0 on one
node. Thread-safety: event loop thread only; appends and markers for the effects of one call
go to the single append thread in one job, in the coordinator's order. In a cluster the
transaction log records and the markers are Kafka's acks=-1 writes: each outcome is reported
once the partition's high watermark passed it (``cluster.leader_replicas.wait_replicated``),
or with the error that ended the wait.
"""

from __future__ import annotations

import asyncio
import logging
import time

from headrace import errors
from headrace.broker.coordinator_runtime import CoordinatorRuntime
from headrace.broker.group_service import read_partition_records
from headrace.coordinator.messages import (
    AppendResult,
    Completed,
    TxnOffsetsCompleted,
)
from headrace.coordinator.records import OFFSETS_TOPIC_NAME
from headrace.coordinator.transaction import TransactionCoordinator
from headrace.coordinator.transaction_config import TransactionConfig
from headrace.coordinator.transaction_messages import (
    AppendToTransactionLog,
    TxnMarkersResult,
    WriteTxnMarkers,
)
from headrace.coordinator.transaction_records import TRANSACTION_STATE_TOPIC_NAME
from headrace.protocol.records import build_batch

log = logging.getLogger(__name__)

SINGLE_NODE_COORDINATOR_EPOCH = 0
REPLICATION_TIMEOUT_MS = 30_000  # Kafka's request.timeout.ms, its coordinators' acks=-1 wait


def _error_code(error: Exception) -> int:
    return error.code if isinstance(error, errors.KafkaError) else errors.UnknownServerError.code


def _carry_out_on_append_thread(manager, effects, now_ms: int,
                                written: list | None = None) -> list:
    """Append thread: each append and marker effect in order; the result of each. With
    ``written`` (a cluster), also, per effect, the (topic, partition, end offset) of each
    record written, for the replication wait."""
    results: list = []
    for effect in effects:
        ends: list[tuple[str, int, int]] = []
        if written is not None:
            written.append(ends)
        if isinstance(effect, AppendToTransactionLog):
            try:
                batch = build_batch([(key, value, (), now_ms) for key, value in effect.records])
                appended = manager.get_log(TRANSACTION_STATE_TOPIC_NAME, effect.partition).append(
                    bytearray(batch), now_ms)
                ends.append((TRANSACTION_STATE_TOPIC_NAME, effect.partition,
                             appended.last_offset + 1))
                results.append(AppendResult(effect.append_id))
            except Exception as error:  # every failure is reported to the coordinator
                log.warning("append to %s-%d failed: %s", TRANSACTION_STATE_TOPIC_NAME,
                            effect.partition, error)
                results.append(AppendResult(effect.append_id, _error_code(error)))
        else:
            results.append(TxnMarkersResult(effect.marker_id, _write_markers(
                manager, effect, now_ms, ends)))
    return results


def _write_markers(manager, effect: WriteTxnMarkers, now_ms: int,
                   ends: list[tuple[str, int, int]] | None = None) -> dict:
    partition_errors = {}
    for topic, partition in effect.partitions:
        try:
            appended = manager.get_log(topic, partition).append_transaction_marker(
                effect.producer_id, effect.producer_epoch, effect.commit,
                effect.coordinator_epoch, now_ms)
            if ends is not None:
                ends.append((topic, partition, appended.last_offset + 1))
            partition_errors[(topic, partition)] = 0
        except Exception as error:
            log.warning("transaction marker for producer %d on %s-%d failed: %s",
                        effect.producer_id, topic, partition, error)
            partition_errors[(topic, partition)] = _error_code(error)
    return partition_errors


class TransactionService(CoordinatorRuntime):
    def __init__(self, broker_state, in_cluster: bool = False) -> None:
        """``in_cluster``: the transaction log is the cluster's; this broker coordinates the
        ids of the partitions it is given by ``leadership_changed``, none at start."""
        super().__init__(broker_state)
        self._in_cluster = in_cluster
        properties = broker_state.config.properties()
        self._config = TransactionConfig.from_properties(properties)
        self.coordinator = TransactionCoordinator(
            self._config, broker_state.producer_ids.next_id,
            int(properties.get("offsets.topic.num.partitions", 50)))
        self.loaded = asyncio.Event()
        self._load_generations: dict[int, int] = {}  # partition -> its latest load's number

    @property
    def num_partitions(self) -> int:
        return self._config.transaction_state_log_num_partitions

    # --- start-up and shutdown --------------------------------------------------------------

    async def start(self) -> None:
        """Create the transaction log if missing and start loading it in the background (in
        a cluster: nothing; no partition is led yet)."""
        if self._in_cluster:
            self.loaded.set()
            self._reschedule()
            return
        await self._state.run_append(self._ensure_topic)
        for partition in range(self.num_partitions):
            self.coordinator.begin_loading(partition, SINGLE_NODE_COORDINATOR_EPOCH)
        self._spawn(self._load_all())
        self._reschedule()

    def _ensure_topic(self) -> None:
        manager = self._state.log_manager
        if TRANSACTION_STATE_TOPIC_NAME in manager.topics():
            return
        manager.create_topic(TRANSACTION_STATE_TOPIC_NAME, self.num_partitions, {
            "cleanup.policy": "compact",
            "segment.bytes": str(self._config.transaction_state_log_segment_bytes)})

    async def _load_all(self) -> None:
        started_s = time.monotonic()
        for partition in range(self.num_partitions):
            await self.load_partition(partition)
        self.loaded.set()
        log.info("loaded %d transactional ids from %s in %d ms",
                 len(self.coordinator.transactional_ids()), TRANSACTION_STATE_TOPIC_NAME,
                 (time.monotonic() - started_s) * 1000)

    def leadership_changed(self, gained, lost, leader_epochs=None) -> None:
        """Event loop thread: the broker began or stopped leading partitions ((topic,
        partition) sets; the cluster's hook, shaped as the group service's). Lost
        ``__transaction_state`` partitions unload: their ids answer NOT_COORDINATOR, and
        requests waiting on an append answer it when the append returns. Gained ones load in
        the background with the partition's leader epoch (``leader_epochs``, default 0) as
        coordinator epoch, answering COORDINATOR_LOAD_IN_PROGRESS meanwhile; a load
        overtaken by a newer change of the partition stops."""
        for topic, partition in sorted(lost):
            if topic == TRANSACTION_STATE_TOPIC_NAME:
                self._load_generations[partition] = self._load_generations.get(partition, 0) + 1
                self.coordinator.unload(partition)
                log.info("unloaded the transactional ids of %s-%d", topic, partition)
        for topic, partition in sorted(gained):
            if topic == TRANSACTION_STATE_TOPIC_NAME:
                epoch = (leader_epochs or {}).get((topic, partition),
                                                  SINGLE_NODE_COORDINATOR_EPOCH)
                self.coordinator.begin_loading(partition, epoch)
                self._spawn(self.load_partition(partition))
        self._reschedule()

    async def load_partition(self, partition: int) -> None:
        """Replay one partition (already ``begin_loading``) and send what it left pending."""
        buffer_bytes = self._config.transaction_state_log_load_buffer_size
        generation = self._load_generations.setdefault(partition, 0) + 1
        self._load_generations[partition] = generation
        try:
            log_ = self._state.log_manager.get_log(TRANSACTION_STATE_TOPIC_NAME, partition)
            offset, end_offset = log_.log_start_offset, log_.log_end_offset
            while offset < end_offset:
                records, next_offset = await asyncio.to_thread(
                    read_partition_records, log_, offset, buffer_bytes)
                if self._load_generations.get(partition) != generation:
                    return  # unloaded, or loading again, meanwhile
                if next_offset <= offset:
                    break
                self.coordinator.load_records(partition, records)
                offset = next_offset
            effects = self.coordinator.finish_loading(partition, self._now_ms())
        except Exception:
            log.exception("loading %s-%d failed; its transactional ids are not served",
                          TRANSACTION_STATE_TOPIC_NAME, partition)
            self.coordinator.abandon_loading(partition)
            return
        await self._carry_out(effects)
        self._reschedule()

    # --- requests ---------------------------------------------------------------------------

    async def _carry_out(self, effects) -> None:
        writes = []
        for effect in effects:
            if isinstance(effect, Completed):
                self._complete(effect.token, effect.response)
            else:
                writes.append(effect)
        if not writes:
            return
        state = self._state
        written: list | None = [] if state.cluster is not None else None
        results = await state.run_append(
            _carry_out_on_append_thread, state.log_manager, writes, self._now_ms(), written)
        if written is not None:
            results = list(await asyncio.gather(*(
                self._replicated(result, ends) for result, ends in zip(results, written,
                                                                       strict=True))))
        for effect, result in zip(writes, results, strict=True):
            if isinstance(effect, WriteTxnMarkers):
                await self._complete_txn_offsets(effect, result)
            outcome = self.coordinator.handle(result, self._now_ms())
            await self._carry_out(outcome.effects)
        self._reschedule()

    async def _replicated(self, result, ends: list[tuple[str, int, int]]):
        """Kafka's acks=-1 for the coordinator's writes in a cluster: ``result`` once the
        high watermark of each partition written passed its record, with the error that
        ended a wait in place of success (REQUEST_TIMED_OUT after request.timeout.ms...)."""
        replication = self._state.cluster.leader_replicas
        codes = await asyncio.gather(*(
            replication.wait_replicated(topic, partition, end, REPLICATION_TIMEOUT_MS)
            for topic, partition, end in ends))
        failed = {(topic, partition): code
                  for (topic, partition, _), code in zip(ends, codes, strict=True) if code}
        if not failed:
            return result
        if isinstance(result, AppendResult):
            return AppendResult(result.append_id, next(iter(failed.values())))
        return TxnMarkersResult(result.marker_id, {**result.partition_errors, **failed})

    async def write_markers(self, markers: WriteTxnMarkers) -> dict:
        """Write one producer's markers at once, for a coordinator elsewhere (the
        WriteTxnMarkers request); each partition's error code."""
        ends: list[tuple[str, int, int]] = []
        partition_errors = await self._state.run_append(
            _write_markers, self._state.log_manager, markers, self._now_ms(), ends)
        if self._state.cluster is not None:
            replicated = await self._replicated(
                TxnMarkersResult(markers.marker_id, partition_errors), ends)
            partition_errors = dict(replicated.partition_errors)
        await self._complete_txn_offsets(
            markers, TxnMarkersResult(markers.marker_id, partition_errors))
        return partition_errors

    async def _complete_txn_offsets(self, effect: WriteTxnMarkers,
                                    result: TxnMarkersResult) -> None:
        """A marker written to an offsets partition commits or drops the producer's pending
        transactional offsets in the group coordinator."""
        for (topic, partition), code in result.partition_errors.items():
            if topic == OFFSETS_TOPIC_NAME and code == 0:
                await self._state.groups.call(
                    TxnOffsetsCompleted(partition, effect.producer_id, effect.commit))
