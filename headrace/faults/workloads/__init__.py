"""Workloads: client processes that drive a broker and record what they did in a ``History``.

Shared here: ``Workload`` (the interface the runner drives), client threads that join the
run's network namespace before they create a client (librdkafka's own threads then start
inside it too), topic creation, and the confluent-kafka settings every client uses.
Thread-safety: a workload's ``start`` spawns its client threads; ``stop`` joins them, bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from confluent_kafka.admin import AdminClient, NewTopic

from headrace.faults.history import History
from headrace.faults.namespace import Namespace

TOPIC_CREATE_TIMEOUT_S = 30.0
THREAD_JOIN_TIMEOUT_S = 60.0
CLIENT_SETTINGS = {"log_level": 0, "reconnect.backoff.max.ms": 500,
                   "socket.connection.setup.timeout.ms": 5000}


class Workload:
    """What the runner drives: ``setup`` (topics), ``start`` (client threads), ``stop`` (they
    finish and report what is outstanding), ``final_reads`` (after healing), ``check``."""

    def __init__(self, bootstrap: str, history: History, namespace: Namespace | None) -> None:
        self.bootstrap = bootstrap
        self.history = history
        self.namespace = namespace
        self.stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self.thread_errors: list[str] = []

    def setup(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        raise NotImplementedError

    def final_reads(self) -> None:
        raise NotImplementedError

    def check(self, ops):
        raise NotImplementedError

    def spawn(self, name: str, target: Callable[[], None]) -> None:
        def body() -> None:
            try:
                if self.namespace is not None:
                    self.namespace.enter_current_thread()
                target()
            except Exception as error:  # noqa: BLE001 -- reported by the run, not lost
                self.thread_errors.append(f"{name}: {error!r}")

        thread = threading.Thread(target=body, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def reporting_errors(self, process: str):
        """Wrap a client callback so that it never raises into librdkafka (which would leave
        the exception pending for the next call): the error is kept for the run's report."""
        def wrap(callback):
            def wrapped(*args) -> None:
                try:
                    callback(*args)
                except Exception as error:  # noqa: BLE001 -- reported by the run
                    self.thread_errors.append(f"{process} callback: {error!r}")
            return wrapped
        return wrap

    def stop(self) -> None:
        self.stopping.set()
        deadline = time.monotonic() + THREAD_JOIN_TIMEOUT_S
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        alive = [thread.name for thread in self._threads if thread.is_alive()]
        if alive:
            raise TimeoutError(f"client threads still running after {THREAD_JOIN_TIMEOUT_S} s: "
                               f"{alive}")

    def in_namespace(self, function: Callable, timeout_s: float):
        """Call ``function`` where the clients live (inside the namespace, if any)."""
        if self.namespace is None:
            return function()
        return self.namespace.run_inside(function, timeout_s)


def create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **CLIENT_SETTINGS})
    futures = admin.create_topics([NewTopic(topic, partitions, 1)],
                                  request_timeout=TOPIC_CREATE_TIMEOUT_S)
    futures[topic].result(TOPIC_CREATE_TIMEOUT_S)


def finish(producer, timeout_s: float, fatal: bool) -> None:
    """Wait up to ``timeout_s`` for outstanding deliveries, then fail what is left (their
    reports arrive as errors: indeterminate sends). After a fatal error the producer is
    abandoned instead: confluent-kafka 2.16's flush then calls back with an exception pending
    (SystemError); sends without a report stay invoked only, which checkers read as unknown."""
    if fatal:
        return
    producer.flush(timeout_s)
    producer.purge()
    producer.flush(1)
