"""The broker side of the group coordinator: storage, timers and parked requests around the
pure ``headrace.coordinator.GroupCoordinator``.

Owns ``GroupService``:

* at start-up it creates the internal topic ``__consumer_offsets`` if missing
  (``offsets.topic.num.partitions`` partitions, ``cleanup.policy=compact``,
  ``segment.bytes=offsets.topic.segment.bytes``), marks every partition loading (requests for
  their groups answer COORDINATOR_LOAD_IN_PROGRESS) and replays the topic in the background,
  reading ``offsets.load.buffer.size`` bytes at a time;
* ``call(request)`` runs one coordinator call and carries out its effects: each ``Completed``
  resolves the asyncio future of a parked JoinGroup/SyncGroup/OffsetCommit; each
  ``AppendToOffsetsTopic`` becomes one uncompressed v2 batch (``build_batch``) appended to
  that partition's Log on the broker's append thread, and its outcome goes back to the
  coordinator as ``AppendResult(append_id, error_code)`` (the exception's Kafka code, or
  UNKNOWN_SERVER_ERROR), whose effects are carried out in turn. The coordinator decides what
  a failed append means for the clients (Kafka's GroupMetadataManager mapping). In a cluster
  the appends are Kafka's acks=-1 ones: NOT_ENOUGH_REPLICAS below
  min.insync.replicas, and each reported once replicated to the ISR (the partition's high
  watermark passed it), or with REQUEST_TIMED_OUT after ``offsets.commit.timeout.ms``;
* the loader logs, per start-up, the groups loaded, the records replayed
  (``loaded_record_count``, which a compacted offsets topic keeps near the number of live
  keys) and the time taken;
* in a cluster (``in_cluster``) nothing is created or loaded at start: the offsets topic is
  the cluster's, and ``leadership_changed`` loads the offsets partitions this broker begins to
  lead (COORDINATOR_LOAD_IN_PROGRESS meanwhile) and unloads those it stops leading (their
  groups leave memory, parked requests answer NOT_COORDINATOR); groups of partitions led
  elsewhere answer NOT_COORDINATOR. A load overtaken by an unload (a newer load number) stops;
* a timer (``coordinator_runtime.CoordinatorRuntime``, with the parked requests) calls
  ``tick(now_ms)`` at ``next_deadline_ms()`` (session and rebalance timeouts,
  the initial rebalance delay, offset retention).

Records on disk are the coordinator's ``__consumer_offsets`` formats
(``headrace.coordinator.records``), byte-compatible with Kafka's.

Thread-safety: event loop thread only. The coordinator is called only from the loop; appends
for all effects of one call are submitted to the single append thread in one job before the
loop yields, so records reach each partition in the order the coordinator produced them.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

import numpy as np

from headrace import errors
from headrace.broker.coordinator_runtime import CoordinatorRuntime
from headrace.coordinator.config import CoordinatorConfig
from headrace.coordinator.coordinator import GroupCoordinator
from headrace.coordinator.messages import (
    AppendResult,
    AppendToOffsetsTopic,
    Completed,
)
from headrace.coordinator.records import OFFSETS_TOPIC_NAME
from headrace.protocol import kernel
from headrace.protocol.batch import BATCH_HEADER_BYTES, parse_header
from headrace.protocol.control_records import marker_of_batch
from headrace.protocol.records import build_batch

log = logging.getLogger(__name__)



def coordinator_config_from(broker_config) -> CoordinatorConfig:
    """The coordinator settings from the broker's ``group.*`` / ``offsets.*`` configs."""
    return CoordinatorConfig.from_properties(broker_config.properties())


def _append_error_code(error: Exception) -> int:
    return error.code if isinstance(error, errors.KafkaError) else errors.UnknownServerError.code


def _append_all(manager, appends: list[AppendToOffsetsTopic], now_ms: int, leaders=None
                ) -> list[tuple[AppendResult, int]]:
    """Append thread: one batch per effect, in order; how each ended, with the offset past
    its records (-1 when it failed). In a cluster (``leaders``: the partitions led here) as
    Kafka's coordinator appends, with acks=-1: NOT_ENOUGH_REPLICAS below
    min.insync.replicas (``cluster.partition_leader``); the log stamps its leader's epoch."""
    results: list[tuple[AppendResult, int]] = []
    for effect in appends:
        try:
            batch = build_batch([(key, value, (), now_ms) for key, value in effect.records],
                                producer_id=effect.producer_id,
                                producer_epoch=effect.producer_epoch,
                                transactional=effect.producer_id >= 0)
            log_ = manager.get_log(OFFSETS_TOPIC_NAME, effect.partition)
            leader = leaders.get((OFFSETS_TOPIC_NAME, effect.partition)) if leaders else None
            if leader is None:
                appended = log_.append(bytearray(batch), now_ms)
            else:
                leader.check_enough_replicas()
                appended = log_.append(bytearray(batch), now_ms)
                if leader.flush_after_append:
                    log_.flush()
            results.append((AppendResult(effect.append_id), appended.last_offset + 1))
        except Exception as error:  # every failure is reported to the coordinator
            log.warning("append to %s-%d failed: %s", OFFSETS_TOPIC_NAME, effect.partition, error)
            results.append((AppendResult(effect.append_id, _append_error_code(error)), -1))
    return results


@dataclass(frozen=True, slots=True)
class LoadRun:
    """Consecutive batches of one kind, as the offsets loader replays them: plain records
    (``producer_id`` -1), a producer's transactional records, or its end-transaction marker
    (``marker_commit`` True/False, no records)."""

    producer_id: int
    records: list
    marker_commit: bool | None = None


def _read_whole_batches(log_, start_offset: int, max_bytes: int):
    """The bytes of whole batches from ``start_offset``, (position, header) of each, and the
    offset to continue from (== start when the log has nothing more)."""
    result = log_.read(start_offset, max_bytes)
    data = b"".join(piece.read_bytes() for piece in result.slices)
    batches, position, next_offset = [], 0, start_offset
    while position + BATCH_HEADER_BYTES <= len(data):
        header = parse_header(data, position)
        if position + header.size_bytes > len(data):
            break
        batches.append((position, header))
        position += header.size_bytes
        next_offset = header.next_offset
    return memoryview(data)[:position], batches, next_offset


def _decoded_records(data, start_offset: int):
    """(offsets, records) of the records at or after ``start_offset``: decoded by the compiled
    kernel into columns, then sliced, no per-record decoding in Python."""
    columns = kernel.decode_columns(data)
    first = int(np.searchsorted(columns.offsets, start_offset))
    key_data, value_data = columns.key_data.tobytes(), columns.value_data.tobytes()
    key_offsets, value_offsets = columns.key_offsets.tolist(), columns.value_offsets.tolist()
    key_valid, value_valid = columns.key_valid.tolist(), columns.value_valid.tolist()
    offsets = columns.offsets.tolist()
    records = [
        (offsets[i], key_data[key_offsets[i]:key_offsets[i + 1]],
         value_data[value_offsets[i]:value_offsets[i + 1]] if value_valid[i] else None)
        for i in range(first, columns.count) if key_valid[i]
    ]
    return records


def read_partition_records(log_, start_offset: int, max_bytes: int):
    """Worker thread: the (key, value) records of whole batches from ``start_offset``, and the
    offset to continue from (== start when the log has nothing more)."""
    data, batches, next_offset = _read_whole_batches(log_, start_offset, max_bytes)
    if not batches:
        return [], next_offset
    return [(key, value) for _, key, value in _decoded_records(data, start_offset)], next_offset


def read_partition_runs(log_, start_offset: int, max_bytes: int):
    """Worker thread: ``read_partition_records`` split into ``LoadRun``s, for a topic with
    transactional batches and markers (``__consumer_offsets`` after TxnOffsetCommit)."""
    data, batches, next_offset = _read_whole_batches(log_, start_offset, max_bytes)
    if not batches:
        return [], next_offset
    records = _decoded_records(data, start_offset)
    runs: list[LoadRun] = []
    index = 0
    for position, header in batches:
        batch_records = []
        while index < len(records) and records[index][0] < header.next_offset:
            batch_records.append(records[index][1:])
            index += 1
        if header.next_offset <= start_offset:
            continue
        if header.is_control:
            marker = marker_of_batch(data, position)
            if marker is not None:
                runs.append(LoadRun(header.producer_id, [], marker.commit))
            continue
        producer_id = header.producer_id if header.is_transactional else -1
        if runs and runs[-1].producer_id == producer_id and runs[-1].marker_commit is None:
            runs[-1].records.extend(batch_records)
        else:
            runs.append(LoadRun(producer_id, batch_records))
    return runs, next_offset


class GroupService(CoordinatorRuntime):
    def __init__(self, broker_state, in_cluster: bool = False) -> None:
        """``in_cluster``: the offsets topic is the cluster's; this broker coordinates the
        groups of the offsets partitions it leads (``leadership_changed``), no others."""
        super().__init__(broker_state)
        self._config = coordinator_config_from(broker_state.config)
        self._in_cluster = in_cluster
        self.coordinator = GroupCoordinator(self._config, owns_every_partition=not in_cluster)
        self._load_generations: dict[int, int] = {}  # partition -> its latest load's number
        self.loaded = asyncio.Event()

    @property
    def num_partitions(self) -> int:
        return self._config.offsets_topic_num_partitions

    # --- start-up and shutdown --------------------------------------------------------------

    async def start(self) -> None:
        """Create the offsets topic if missing and start loading it in the background (in
        a cluster: nothing until this broker leads offsets partitions)."""
        if self._in_cluster:
            self.loaded.set()
            self._reschedule()
            return
        await self._state.run_append(self._ensure_offsets_topic)
        for partition in range(self.num_partitions):
            self.coordinator.begin_loading(partition)
        self._spawn(self._load_all())
        self._reschedule()

    def _ensure_offsets_topic(self) -> None:
        manager = self._state.log_manager
        if OFFSETS_TOPIC_NAME in manager.topics():
            return
        segment_bytes = self._state.config.get("offsets.topic.segment.bytes")
        manager.create_topic(OFFSETS_TOPIC_NAME, self.num_partitions,
                             {"cleanup.policy": "compact", "segment.bytes": segment_bytes})

    async def _load_all(self) -> None:
        buffer_bytes = self._state.config.get_int("offsets.load.buffer.size")
        started_s = time.monotonic()
        for partition in range(self.num_partitions):
            try:
                await self._load_partition(partition, buffer_bytes)
                self.coordinator.finish_loading(partition, self._now_ms())
            except errors.KafkaStorageError as error:  # offline: its ERROR is already logged
                log.warning("%s-%d is offline; its groups start empty: %s", OFFSETS_TOPIC_NAME,
                            partition, error)
                self.coordinator.abandon_loading(partition)
            except Exception:
                log.exception("loading %s-%d failed; its groups start empty",
                              OFFSETS_TOPIC_NAME, partition)
                self.coordinator.abandon_loading(partition)
        self.loaded.set()
        log.info("loaded %d groups from %s: loaded_record_count=%d in %d ms",
                 len(self.coordinator.group_ids()), OFFSETS_TOPIC_NAME,
                 self.coordinator.loaded_record_count, (time.monotonic() - started_s) * 1000)
        self._reschedule()

    # --- cluster: leadership of offsets partitions ------------------------------------------

    def leadership_changed(self, gained, lost) -> None:
        """Event loop thread: the broker began or stopped leading partitions. Lost offsets
        partitions unload their groups (parked requests answer NOT_COORDINATOR); gained ones
        load in the background, answering COORDINATOR_LOAD_IN_PROGRESS meanwhile."""
        for topic, partition in sorted(lost):
            if topic == OFFSETS_TOPIC_NAME:
                self._load_generations[partition] = self._load_generations.get(partition, 0) + 1
                effects = self.coordinator.unload_partition(partition, self._now_ms())
                log.info("unloaded the groups of %s-%d", OFFSETS_TOPIC_NAME, partition)
                self._spawn(self._carry_out(effects))
        for topic, partition in sorted(gained):
            if topic == OFFSETS_TOPIC_NAME:
                generation = self._load_generations.get(partition, 0) + 1
                self._load_generations[partition] = generation
                self.coordinator.begin_loading(partition)
                self._spawn(self._load_led_partition(partition, generation))
        self._reschedule()

    async def _load_led_partition(self, partition: int, generation: int) -> None:
        buffer_bytes = self._state.config.get_int("offsets.load.buffer.size")
        started_s = time.monotonic()
        try:
            await self._load_partition(partition, buffer_bytes, generation)
        except Exception as error:  # offline or gone meanwhile: its groups start empty
            log.warning("loading %s-%d failed; its groups start empty: %s",
                        OFFSETS_TOPIC_NAME, partition, error)
            if self._load_generations.get(partition) == generation:
                self.coordinator.abandon_loading(partition)
            return
        if self._load_generations.get(partition) != generation:
            return  # unloaded (and maybe loading again) meanwhile
        records = self.coordinator.finish_loading(partition, self._now_ms())
        log.info("loaded %s-%d: %d records in %d ms", OFFSETS_TOPIC_NAME, partition, records,
                 (time.monotonic() - started_s) * 1000)
        self._reschedule()

    async def _load_partition(self, partition: int, buffer_bytes: int,
                              generation: int | None = None) -> None:
        log_ = self._state.log_manager.get_log(OFFSETS_TOPIC_NAME, partition)
        offset, end_offset = log_.log_start_offset, log_.log_end_offset
        while offset < end_offset:
            runs, next_offset = await asyncio.to_thread(
                read_partition_runs, log_, offset, buffer_bytes)
            if next_offset <= offset:
                break
            if generation is not None and self._load_generations.get(partition) != generation:
                return  # this partition was unloaded meanwhile
            for run in runs:
                if run.marker_commit is not None:
                    self.coordinator.load_marker(partition, run.producer_id, run.marker_commit)
                elif run.producer_id >= 0:
                    self.coordinator.load_transactional(partition, run.producer_id, run.records)
                else:
                    self.coordinator.load_partition(partition, run.records)
            offset = next_offset

    # --- requests ---------------------------------------------------------------------------

    async def _replicated(self, replication, appends: list[AppendToOffsetsTopic],
                          appended: list[tuple[AppendResult, int]]) -> list[AppendResult]:
        """Kafka's acks=-1 for the coordinator's appends: each successful one is reported
        once the partition's high watermark passed it (or with the error that ended the
        wait: REQUEST_TIMED_OUT past offsets.commit.timeout.ms, ...)."""
        timeout_ms = self._state.config.get_int("offsets.commit.timeout.ms")

        async def outcome(effect, result: AppendResult, end_offset: int) -> AppendResult:
            if result.error_code:
                return result
            code = await replication.wait_replicated(OFFSETS_TOPIC_NAME, effect.partition,
                                                     end_offset, timeout_ms)
            return AppendResult(result.append_id, code)

        return list(await asyncio.gather(*(
            outcome(effect, result, end_offset)
            for effect, (result, end_offset) in zip(appends, appended, strict=True))))

    async def _carry_out(self, effects) -> None:
        """Answer completions, run the appends (one job on the append thread, so records keep
        the coordinator's order) and hand each result back to the coordinator."""
        appends = []
        for effect in effects:
            if isinstance(effect, Completed):
                self._complete(effect.token, effect.response)
            elif isinstance(effect, AppendToOffsetsTopic):
                appends.append(effect)
        if not appends:
            return
        state = self._state
        replication = state.cluster.leader_replicas if state.cluster is not None else None
        appended = await state.run_append(
            _append_all, state.log_manager, appends, self._now_ms(),
            replication.leaders if replication is not None else None)
        results = [result for result, _ in appended]
        if replication is not None:
            results = await self._replicated(replication, appends, appended)
        for result in results:
            outcome = self.coordinator.handle(result, self._now_ms())
            await self._carry_out(outcome.effects)
