"""Clients: the ``ParallelConsumer`` on confluent-kafka (at least once, or exactly once with
a transactional id), and the blocking wire client ``broker_connection`` that the command line
and the Spark executors share.

The consumer's names are imported on first use (PEP 562), so a process that needs only
``headrace.client.broker_connection`` (a Spark executor) does not load confluent-kafka.
"""

import importlib

_LAZY_NAMES = {
    "ConsumerMetrics": "headrace.client.parallel_consumer",
    "ParallelConsumer": "headrace.client.parallel_consumer",
    "ParallelConsumerOptions": "headrace.client.parallel_consumer",
    "OutputRecord": "headrace.client.parallel_consumer",
    "BufferLimits": "headrace.client.work_scheduler",
    "Ordering": "headrace.client.work_scheduler",
    "PartitionMetrics": "headrace.client.work_scheduler",
}

__all__ = sorted(_LAZY_NAMES)


def __getattr__(name: str):
    module = _LAZY_NAMES.get(name)
    if module is None:
        raise AttributeError(f"module 'headrace.client' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
