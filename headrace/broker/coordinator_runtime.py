"""What the broker services around a pure coordinator share: ``CoordinatorRuntime``.

Owns, for a subclass that sets ``self.coordinator`` (``handle(request, now_ms) -> Outcome``,
``tick(now_ms) -> effects``, ``next_deadline_ms()``) and implements ``_carry_out(effects)``:
the requests parked on a ``Pending(token)`` until a ``Completed`` effect answers them
(``call`` / ``_complete``), the background tasks it spawns, and the one timer that calls
``tick`` at the coordinator's next deadline (at least every ``MAX_TIMER_SLEEP_MS``).
Used by ``group_service.GroupService`` and ``transaction_service.TransactionService``.

Thread-safety: event loop thread only.
"""

from __future__ import annotations

import asyncio

from headrace.coordinator.messages import Pending

MAX_TIMER_SLEEP_MS = 1000  # re-check deadlines at least this often


class CoordinatorRuntime:
    coordinator: object  # set by the subclass

    def __init__(self, broker_state) -> None:
        self._state = broker_state
        self._parked: dict[int, asyncio.Future] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._tasks: set[asyncio.Task] = set()

    def _now_ms(self) -> int:
        return self._state.clock.now_ms()

    async def _carry_out(self, effects) -> None:
        raise NotImplementedError

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

    async def call(self, request) -> object:
        """Run one coordinator request; waits for parked requests and for the appends the
        response depends on."""
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

    def _complete(self, token: int, response: object) -> None:
        future = self._parked.get(token)
        if future is not None and not future.done():
            future.set_result(response)

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
