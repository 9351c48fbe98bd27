"""Clients built on confluent-kafka: the at-least-once ``ParallelConsumer``."""

from headrace.client.parallel_consumer import (
    ConsumerMetrics,
    ParallelConsumer,
    ParallelConsumerOptions,
)
from headrace.client.work_scheduler import BufferLimits, Ordering, PartitionMetrics

__all__ = [
    "BufferLimits",
    "ConsumerMetrics",
    "Ordering",
    "ParallelConsumer",
    "ParallelConsumerOptions",
    "PartitionMetrics",
]
