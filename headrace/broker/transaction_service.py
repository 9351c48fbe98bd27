"""The broker side of the transaction coordinator: storage, markers, timers and parked
requests around the pure ``headrace.coordinator.transaction.TransactionCoordinator``.

Owns ``TransactionService``:

* at start-up it creates the internal topic ``__transaction_state`` if missing
  (``transaction.state.log.num.partitions`` partitions, ``cleanup.policy=compact``,
  ``segment.bytes=transaction.state.log.segment.bytes``; the replication factor is 1 on one
  node), marks every partition loading (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and replays
  them in the background, ``transaction.state.log.load.buffer.size`` bytes at a time. Loading
  is per partition (``begin_loading`` / ``finish_loading`` / ``unload`` of the coordinator)
  so a cluster's leadership changes can drive it as they drive the group coordinator;
* ``call(request)`` runs one coordinator call and carries out its effects:
  ``AppendToTransactionLog`` becomes one uncompressed v2 batch appended to that partition
  on the append thread, its outcome reported back as ``AppendResult``; ``WriteTxnMarkers``
  writes one control batch per partition through ``Log.append_transaction_marker`` on the
  append thread, each partition's outcome reported
  back as ``TxnMarkersResult`` (failed ones are retried by the coordinator's timer);
* a timer calls ``tick(now_ms)`` at ``next_deadline_ms()`` (transaction timeouts,
  transactional id expiry, marker retries).

Producer ids come from the broker's persisted allocator (an fsync per 1000 ids, on the event
loop thread when a block runs out). The coordinator epoch of every partition is 0 on one
node. Thread-safety: event loop thread only; appends and markers for the effects of one call
go to the single append thread in one job, in the coordinator's order.
"""

from __future__ import annotations

import asyncio
import logging
import time

from headrace import errors
from headrace.broker.group_service import read_partition_records
from headrace.coordinator.messages import AppendResult, Completed, Pending
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

MAX_TIMER_SLEEP_MS = 1000  # re-check deadlines at least this often
SINGLE_NODE_COORDINATOR_EPOCH = 0


def _error_code(error: Exception) -> int:
    return error.code if isinstance(error, errors.KafkaError) else errors.UnknownServerError.code


def _carry_out_on_append_thread(manager, effects, now_ms: int) -> list:
    """Append thread: each append and marker effect in order; the result of each."""
    results: list = []
    for effect in effects:
        if isinstance(effect, AppendToTransactionLog):
            try:
                batch = build_batch([(key, value, (), now_ms) for key, value in effect.records])
                manager.get_log(TRANSACTION_STATE_TOPIC_NAME, effect.partition).append(
                    bytearray(batch), now_ms)
                results.append(AppendResult(effect.append_id))
            except Exception as error:  # every failure is reported to the coordinator
                log.warning("append to %s-%d failed: %s", TRANSACTION_STATE_TOPIC_NAME,
                            effect.partition, error)
                results.append(AppendResult(effect.append_id, _error_code(error)))
        else:
            results.append(TxnMarkersResult(effect.marker_id, _write_markers(
                manager, effect, now_ms)))
    return results


def _write_markers(manager, effect: WriteTxnMarkers, now_ms: int) -> dict:
    partition_errors = {}
    for topic, partition in effect.partitions:
        try:
            manager.get_log(topic, partition).append_transaction_marker(
                effect.producer_id, effect.producer_epoch, effect.commit,
                effect.coordinator_epoch, now_ms)
            partition_errors[(topic, partition)] = 0
        except Exception as error:
            log.warning("transaction marker for producer %d on %s-%d failed: %s",
                        effect.producer_id, topic, partition, error)
            partition_errors[(topic, partition)] = _error_code(error)
    return partition_errors


class TransactionService:
    def __init__(self, broker_state) -> None:
        self._state = broker_state
        properties = broker_state.config.properties()
        self._config = TransactionConfig.from_properties(properties)
        self.coordinator = TransactionCoordinator(
            self._config, broker_state.producer_ids.next_id,
            int(properties.get("offsets.topic.num.partitions", 50)))
        self._parked: dict[int, asyncio.Future] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()
        self.loaded = asyncio.Event()

    @property
    def num_partitions(self) -> int:
        return self._config.transaction_state_log_num_partitions

    def _now_ms(self) -> int:
        return self._state.clock.now_ms()

    # --- start-up and shutdown --------------------------------------------------------------

    async def start(self) -> None:
        """Create the transaction log if missing and start loading it in the background."""
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

    async def stop(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        for task in list(self._tasks):
            task.cancel()
        for future in self._parked.values():
            if not future.done():
                future.cancel()
        self._parked.clear()

    def _spawn(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _load_all(self) -> None:
        started_s = time.monotonic()
        for partition in range(self.num_partitions):
            await self.load_partition(partition)
        self.loaded.set()
        log.info("loaded %d transactional ids from %s in %d ms",
                 len(self.coordinator.transactional_ids()), TRANSACTION_STATE_TOPIC_NAME,
                 (time.monotonic() - started_s) * 1000)

    async def load_partition(self, partition: int) -> None:
        """Replay one partition (already ``begin_loading``) and send what it left pending."""
        buffer_bytes = self._config.transaction_state_log_load_buffer_size
        try:
            log_ = self._state.log_manager.get_log(TRANSACTION_STATE_TOPIC_NAME, partition)
            offset, end_offset = log_.log_start_offset, log_.log_end_offset
            while offset < end_offset:
                records, next_offset = await asyncio.to_thread(
                    read_partition_records, log_, offset, buffer_bytes)
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

    async def call(self, request) -> object:
        """Run one coordinator request; waits for the appends its response depends on."""
        outcome = self.coordinator.handle(request, self._now_ms())
        response = outcome.response
        future = None
        if isinstance(response, Pending):
            future = asyncio.get_running_loop().create_future()
            self._parked[response.token] = future
        await self._carry_out(outcome.effects)
        self._reschedule()
        if future is None:
            return response
        try:
            return await future
        finally:
            self._parked.pop(response.token, None)

    async def _carry_out(self, effects) -> None:
        writes = []
        for effect in effects:
            if isinstance(effect, Completed):
                future = self._parked.get(effect.token)
                if future is not None and not future.done():
                    future.set_result(effect.response)
            else:
                writes.append(effect)
        if not writes:
            return
        state = self._state
        results = await state.run_append(
            _carry_out_on_append_thread, state.log_manager, writes, self._now_ms())
        for result in results:
            outcome = self.coordinator.handle(result, self._now_ms())
            await self._carry_out(outcome.effects)
        self._reschedule()

    # --- timers -----------------------------------------------------------------------------

    def _reschedule(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        deadline_ms = self.coordinator.next_deadline_ms()
        delay_ms = MAX_TIMER_SLEEP_MS
        if deadline_ms is not None:
            delay_ms = min(max(deadline_ms - self._now_ms(), 0), MAX_TIMER_SLEEP_MS)
        self._timer = asyncio.get_running_loop().call_later(delay_ms / 1000, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        effects = self.coordinator.tick(self._now_ms())
        if effects:
            self._spawn(self._carry_out(effects))
        self._reschedule()
