"""The broker's side of controlled shutdown: before stopping, ask the controller to move this
broker's leaderships away, and wait (bounded) until it says none is left.

Owns ``request_controlled_shutdown_and_wait`` (one attempt) and ``ControlledShutdownPolicy``
(Kafka's configs: ``controlled.shutdown.enable`` true, ``controlled.shutdown.max.retries`` 3,
``controlled.shutdown.retry.backoff.ms`` 5000; each attempt waits for the controller's answer
up to ``controller.socket.timeout.ms``, 30000, the timeout of Kafka's controller channel).

The request is the controller's znode of headrace's own (``topic_admin``:
``/headrace/controlled_shutdown/<id>``, ephemeral, ``{"version":1,"broker_epoch":E}``); the
controller answers in the same znode with ``"partitions_remaining"``: the partitions this broker
still leads that have other replicas. An empty list means the broker may stop. Partitions with
one replica (every partition of this release) stay led here until the broker's registration
goes; the controller then marks them offline (leader -1), as Kafka does.

Thread-safety: blocking ZooKeeper calls; run off the event loop. No state of its own.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from headrace.cluster import topic_admin

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ControlledShutdownPolicy:
    enabled: bool = True
    max_retries: int = 3
    retry_backoff_ms: int = 5000
    answer_timeout_ms: int = 30_000

    @classmethod
    def from_config(cls, config) -> ControlledShutdownPolicy:
        return cls(config.get_bool("controlled.shutdown.enable"),
                   config.get_int("controlled.shutdown.max.retries"),
                   config.get_int("controlled.shutdown.retry.backoff.ms"),
                   config.get_int("controller.socket.timeout.ms"))


def request_controlled_shutdown_and_wait(
        zk: KazooClient, broker_id: int, broker_epoch: int, answer_timeout_ms: int
) -> list[tuple[str, int]] | None:
    """One attempt: the partitions the controller says this broker still leads (empty: done),
    or None when it did not answer within ``answer_timeout_ms``."""
    path = topic_admin.request_controlled_shutdown(zk, broker_id, broker_epoch)
    deadline = time.monotonic() + answer_timeout_ms / 1000
    while True:
        changed = threading.Event()
        try:
            data, _ = zk.get(path, watch=lambda _event, event=changed: event.set())
        except NoNodeError:
            return None
        _, remaining = topic_admin.decode_controlled_shutdown(data)
        if remaining is not None:
            return remaining
        if not changed.wait(max(0.0, deadline - time.monotonic())):
            return None


def shut_down_controlled(zk: KazooClient, broker_id: int, broker_epoch: int,
                         policy: ControlledShutdownPolicy) -> bool:
    """Kafka's ``KafkaServer.controlledShutdown``: up to ``max_retries`` attempts with
    ``retry_backoff_ms`` between them; whether the controller let this broker go with no
    leadership left to move. The broker stops either way."""
    if not policy.enabled:
        return False
    for attempt in range(1, policy.max_retries + 1):
        try:
            remaining = request_controlled_shutdown_and_wait(
                zk, broker_id, broker_epoch, policy.answer_timeout_ms)
        except KazooException as error:
            remaining = None
            log.warning("controlled shutdown attempt %d failed: %r", attempt, error)
        if remaining == []:
            log.info("controlled shutdown succeeded: no leadership left to move")
            return True
        if remaining is None:
            log.warning("controlled shutdown attempt %d: no answer from the controller "
                        "within %d ms", attempt, policy.answer_timeout_ms)
        else:
            log.warning("controlled shutdown attempt %d: %d partitions still led here",
                        attempt, len(remaining))
        if attempt < policy.max_retries:
            time.sleep(policy.retry_backoff_ms / 1000)
    log.warning("controlled shutdown failed after %d attempts; proceeding to an unclean "
                "shutdown", policy.max_retries)
    return False
