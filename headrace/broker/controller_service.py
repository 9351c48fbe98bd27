"""The broker's side of the cluster controller: start and stop it, and await its work.

Owns the one ``headrace.cluster.controller.Controller`` of a broker in cluster mode (on the
broker's ZooKeeper session, with ``unclean.leader.election.enable`` and the automatic leader
rebalance's ``auto.leader.rebalance.enable``, ``leader.imbalance.check.interval.seconds`` and
``leader.imbalance.per.broker.percentage``), started once the broker
is registered in ``/brokers/ids`` (as Kafka starts its controller after registering) and
stopped before the session is closed. ``run`` hands an action to the controller's event thread
and awaits it from the event loop, bounded by ``timeout_ms``: REQUEST_TIMED_OUT past it or
when ZooKeeper could not complete it, NOT_CONTROLLER when this broker is not (or no longer)
the active controller. A dynamic change of the broker's ``unclean.leader.election.enable`` to
true has the controller elect offline partitions again, as Kafka's does.

Thread-safety: ``start`` and ``stop`` block on ZooKeeper (the server calls them in an
executor); ``run`` is called on the event loop thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

from kazoo.exceptions import KazooException, SessionExpiredError

from headrace.cluster.controller import (
    UNCLEAN_LEADER_ELECTION_ENABLE,
    Controller,
    ControllerFenced,
    LeaderRebalance,
)
from headrace.cluster.zookeeper_session import ZooKeeperClientError
from headrace.errors import NotController, RequestTimedOut

T = TypeVar("T")


class ControllerService:
    def __init__(self, membership: Any, config: Any) -> None:
        self.controller = Controller(
            membership.session.client, membership.broker_id,
            unclean_leader_election=lambda: config.get_bool("unclean.leader.election.enable"),
            leader_rebalance=LeaderRebalance(
                enable=config.get_bool("auto.leader.rebalance.enable"),
                check_interval_s=config.get_int("leader.imbalance.check.interval.seconds"),
                imbalance_per_broker_percentage=config.get_int("leader.imbalance.per.broker.percentage")),
        )
        self._unclean_enabled = config.get_bool(UNCLEAN_LEADER_ELECTION_ENABLE)
        if hasattr(config, "add_change_listener"):
            config.add_change_listener(self._on_config_change)

    def _on_config_change(self, properties: dict[str, str]) -> None:
        """Kafka's ``UncleanLeaderElectionEnable``: the broker's dynamic
        ``unclean.leader.election.enable`` turned true elects offline partitions again (on the
        controller's thread; a no-op on a broker that is not the controller)."""
        enabled = properties.get(UNCLEAN_LEADER_ELECTION_ENABLE, "false").strip().lower() == "true"
        turned_on = enabled and not self._unclean_enabled
        self._unclean_enabled = enabled
        if turned_on and self.controller.is_active:
            self.controller.submit(self.controller.elect_offline_partitions)

    def start(self) -> None:
        """Start the candidate; ZooKeeper unreachable past the retries: ZooKeeperClientError."""
        try:
            self.controller.start()
        except KazooException as error:
            raise ZooKeeperClientError(f"starting the controller failed: ZooKeeper "
                                       f"unavailable ({error!r})") from None

    def stop(self) -> None:
        self.controller.stop()

    @property
    def is_active(self) -> bool:
        return self.controller.is_active

    async def run(self, action: Callable[[Any], T], timeout_ms: int) -> T:
        """``action(controller)`` on the controller's event thread; its result."""
        future = self.controller.submit(lambda: action(self.controller))
        try:
            return await asyncio.wait_for(asyncio.wrap_future(future), max(timeout_ms, 1) / 1000)
        except TimeoutError:
            future.cancel()
            raise RequestTimedOut(f"The controller did not answer within {timeout_ms} ms.") from None
        except (ControllerFenced, SessionExpiredError):
            raise NotController("This broker stopped being the controller.") from None
        except KazooException as error:  # e.g. the connection to ZooKeeper lost meanwhile
            raise RequestTimedOut(f"ZooKeeper did not complete the change: {error!r}") from None
