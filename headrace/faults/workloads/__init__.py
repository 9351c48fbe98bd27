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
from dataclasses import dataclass

from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from headrace.faults.history import FAIL, INFO, INVOKE, OK, History
from headrace.faults.namespace import Namespace

TOPIC_CREATE_TIMEOUT_S = 30.0
DEFAULT_REPLICATION_FACTOR = -1  # CreateTopics: the broker's default.replication.factor
THREAD_JOIN_TIMEOUT_S = 60.0
PRODUCER_POLL_S = 0.01
CLIENT_SETTINGS = {"log_level": 0, "reconnect.backoff.max.ms": 500,
                   "socket.connection.setup.timeout.ms": 5000}


@dataclass(frozen=True)
class WriterSettings:
    topic: str
    partitions: int
    prefix: str
    idempotent: bool
    max_writes: int
    max_in_flight: int
    message_timeout_ms: int


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

    def write_unique_values(self, process: str, f: str, settings: WriterSettings) -> None:
        """Send ``<prefix><n>`` for n < ``settings.max_writes`` round-robin over the
        partitions with one confluent-kafka producer (acks=all), recording each as ``f``
        (invoke, then ok with its offset or info), until ``stopping``, a fatal producer error
        (an idempotent producer that lost its sequence gives up, as in Kafka) or the count."""
        outstanding, fatal = [0], [False]

        @self.reporting_errors(process)
        def on_error(error) -> None:
            fatal[0] = fatal[0] or error.fatal()

        def report(value: str, partition: int):
            @self.reporting_errors(process)
            def on_delivery(error, message) -> None:
                outstanding[0] -= 1
                if error is None:
                    self.history.record(OK, process, f, value, partition=partition,
                                        offset=message.offset())
                else:
                    self.history.record(INFO, process, f, value, partition=partition,
                                        error=str(error.name()))
                    fatal[0] = fatal[0] or error.fatal()
            return on_delivery

        producer = Producer({"bootstrap.servers": self.bootstrap, "acks": "all",
                             "error_cb": on_error, "enable.idempotence": settings.idempotent,
                             "linger.ms": 0, "message.timeout.ms": settings.message_timeout_ms,
                             **CLIENT_SETTINGS})
        for sequence in range(settings.max_writes):
            while outstanding[0] >= settings.max_in_flight and not self.stopping.is_set():
                producer.poll(PRODUCER_POLL_S)
            if self.stopping.is_set() or fatal[0]:
                break
            value = f"{settings.prefix}{sequence}"
            partition = sequence % settings.partitions
            self.history.record(INVOKE, process, f, value, partition=partition)
            try:
                producer.produce(settings.topic, value.encode(), partition=partition,
                                 on_delivery=report(value, partition))
            except KafkaException as refused:  # a fatal error already: never enqueued
                self.history.record(FAIL, process, f, value, partition=partition,
                                    error=str(refused.args[0].name()))
                fatal[0] = True
                break
            outstanding[0] += 1
            producer.poll(0)
        _finish(producer, settings.message_timeout_ms / 1000, fatal[0])

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
    """``topic`` with the broker's default.replication.factor (1 for one node, the cluster
    target's 3) and its min.insync.replicas."""
    admin = AdminClient({"bootstrap.servers": bootstrap, **CLIENT_SETTINGS})
    futures = admin.create_topics([NewTopic(topic, partitions, DEFAULT_REPLICATION_FACTOR)],
                                  request_timeout=TOPIC_CREATE_TIMEOUT_S)
    futures[topic].result(TOPIC_CREATE_TIMEOUT_S)



def _finish(producer: Producer, timeout_s: float, fatal: bool) -> None:
    """Wait up to ``timeout_s`` for outstanding deliveries, then fail what is left (their
    reports arrive as errors: indeterminate sends). After a fatal error the producer is
    abandoned instead: sends without a report stay invoked only, which checkers read as
    unknown."""
    if fatal:
        return
    producer.flush(timeout_s)
    producer.purge()
    producer.flush(1)
