"""TransactionService in process on real files: ``__transaction_state`` leadership moving
away and back (the cluster's hook) unloads and reloads a partition's transactional ids."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from headrace import errors
from headrace.broker.config import BrokerConfig
from headrace.broker.state import AppendHub, BrokerState, ProducerIdAllocator
from headrace.broker.transaction_service import TransactionService
from headrace.coordinator.transaction_messages import (
    AddPartitionsToTxnRequest,
    DescribeTransactionsRequest,
    InitProducerIdRequest,
)
from headrace.coordinator.transaction_records import TRANSACTION_STATE_TOPIC_NAME
from headrace.storage.clock import SystemClock
from headrace.storage.manager import LogManager

TXN = "moving-txn"
WAIT_S = 30


async def _state(data_dir: Path) -> BrokerState:
    config = BrokerConfig.load(None, environment={}, overrides=[
        f"log.dirs={data_dir}", "transaction.state.log.num.partitions=3"])
    manager = LogManager([data_dir], config.properties(), SystemClock())
    manager.startup()
    manager.create_topic("orders", 1, {})
    return BrokerState(
        config=config, log_manager=manager, clock=SystemClock(), node_id=1, cluster_id="c",
        advertised_host="127.0.0.1", advertised_port=1,
        producer_ids=ProducerIdAllocator(data_dir),
        appended=AppendHub(asyncio.get_running_loop()))


async def _described(service: TransactionService):
    return (await service.call(DescribeTransactionsRequest((TXN,)))).transactions[0]


async def _scenario(data_dir: Path) -> None:
    state = await _state(data_dir)
    service = TransactionService(state)
    try:
        await service.start()
        await asyncio.wait_for(service.loaded.wait(), WAIT_S)
        init = await service.call(InitProducerIdRequest(TXN, 60_000))
        added = await service.call(AddPartitionsToTxnRequest(
            TXN, init.producer_id, init.producer_epoch, (("orders", 0),)))
        assert added.partition_errors == {("orders", 0): 0}
        partition = {(TRANSACTION_STATE_TOPIC_NAME, service.coordinator.partition_for(TXN))}

        service.leadership_changed(gained=set(), lost=partition)
        assert (await _described(service)).error_code == errors.NotCoordinator.code
        again = await service.call(InitProducerIdRequest(TXN, 60_000))
        assert again.error_code == errors.NotCoordinator.code

        service.leadership_changed(gained=partition, lost=set(),
                                   leader_epochs={next(iter(partition)): 5})
        described = await _described(service)
        deadline_s = time.monotonic() + WAIT_S  # the load runs in the background
        while (described.error_code == errors.CoordinatorLoadInProgress.code
               and time.monotonic() < deadline_s):
            await asyncio.sleep(0.01)  # polling an observed state, bounded by the deadline
            described = await _described(service)
        assert (described.error_code, described.transaction_state, described.partitions) == (
            0, "Ongoing", (("orders", 0),))
        assert described.producer_id == init.producer_id
    finally:
        await service.stop()
        state.append_executor.shutdown(wait=True)


def test_leadership_moving_away_and_back_unloads_and_reloads(tmp_path: Path) -> None:
    asyncio.run(_scenario(tmp_path / "data"))
