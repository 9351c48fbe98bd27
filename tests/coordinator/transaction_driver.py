"""Test helper: drives a TransactionCoordinator as the broker does, with an injected clock.

``TxnDriver`` owns every ``__transaction_state`` partition (loaded empty unless records are
given), keeps the records appended (``log``: per partition, in order, as a real compacted
topic would replay them) and the markers written (``markers``: (partition, producer id,
epoch, commit) in order). Appends succeed at once unless ``append_error_code`` is set;
markers are acknowledged at once unless their partition is in ``failing_marker_partitions``.
``call`` returns the response, also of a request that was parked and completed meanwhile
(None while it is still parked).
"""

from __future__ import annotations

import itertools

from headrace.coordinator.messages import AppendResult, Completed, Pending
from headrace.coordinator.transaction import TransactionCoordinator
from headrace.coordinator.transaction_config import TransactionConfig
from headrace.coordinator.transaction_messages import (
    AppendToTransactionLog,
    TxnMarkersResult,
    WriteTxnMarkers,
)

FIRST_PRODUCER_ID = 1000
MAX_TICKS_PER_ADVANCE = 10_000  # a timer due again at once would spin: fail instead


class TxnDriver:
    def __init__(self, config: TransactionConfig | None = None, now_ms: int = 1_000_000,
                 log: dict[int, list] | None = None, coordinator_epoch: int = 0) -> None:
        self.now_ms = now_ms
        self.coordinator = TransactionCoordinator(
            config or TransactionConfig(), itertools.count(FIRST_PRODUCER_ID).__next__)
        self.log: dict[int, list] = {p: list(r) for p, r in (log or {}).items()}
        self.markers: list[tuple] = []
        self.append_error_code = 0
        self.failing_marker_partitions: set[tuple[str, int]] = set()
        self.completed: dict[int, object] = {}
        for partition in range(self.coordinator.config.transaction_state_log_num_partitions):
            self.coordinator.begin_loading(partition, coordinator_epoch)
            self.coordinator.load_records(partition, self.log.get(partition, ()))
            self.run(self.coordinator.finish_loading(partition, self.now_ms))

    def call(self, request):
        outcome = self.coordinator.handle(request, self.now_ms)
        self.run(outcome.effects)
        if isinstance(outcome.response, Pending):
            return self.completed.pop(outcome.response.token, None)
        return outcome.response

    def advance(self, delta_ms: int) -> None:
        """Move the clock and fire every timer that falls due on the way."""
        end_ms = self.now_ms + delta_ms
        for _ in range(MAX_TICKS_PER_ADVANCE):
            deadline_ms = self.coordinator.next_deadline_ms()
            if deadline_ms is None or deadline_ms > end_ms:
                break
            self.now_ms = max(self.now_ms, deadline_ms)
            self.run(self.coordinator.tick(self.now_ms))
        else:
            raise AssertionError(f"timers still due after {MAX_TICKS_PER_ADVANCE} ticks")
        self.now_ms = end_ms

    def run(self, effects) -> None:
        for effect in effects:
            if isinstance(effect, Completed):
                self.completed[effect.token] = effect.response
            elif isinstance(effect, AppendToTransactionLog):
                if not self.append_error_code:
                    self.log.setdefault(effect.partition, []).extend(effect.records)
                self.run(self.coordinator.handle(
                    AppendResult(effect.append_id, self.append_error_code), self.now_ms).effects)
            elif isinstance(effect, WriteTxnMarkers):
                errors_by_partition = {}
                for tp in effect.partitions:
                    failing = tp in self.failing_marker_partitions
                    errors_by_partition[tp] = 6 if failing else 0  # NOT_LEADER_OR_FOLLOWER
                    if not failing:
                        self.markers.append((tp, effect.producer_id, effect.producer_epoch,
                                             effect.commit))
                self.run(self.coordinator.handle(
                    TxnMarkersResult(effect.marker_id, errors_by_partition), self.now_ms).effects)
            else:
                raise AssertionError(f"unexpected effect {effect!r}")
