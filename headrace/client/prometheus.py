"""Prometheus export of a ParallelConsumer's metrics (optional; prometheus-client).

Owns ``ParallelConsumerCollector``: a custom collector that reads ``ParallelConsumer.metrics()``
at scrape time, so no background thread or extra bookkeeping is needed. Metric names are prefixed
``headrace_parallel_consumer_``; per-partition gauges carry ``topic`` and ``partition`` labels.

Thread-safety: ``collect`` may run on the scrape thread; ``metrics()`` is thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from headrace.client.parallel_consumer import ParallelConsumer

PREFIX = "headrace_parallel_consumer_"
PARTITION_GAUGES = {
    "buffered_records": "records buffered, not yet handed to a worker",
    "buffered_bytes": "key+value bytes buffered",
    "in_flight": "records handed to a worker (in its current run), not yet completed",
    "committed_offset": "last offset committed to the group",
    "high_watermark": "partition high watermark seen by the consumer",
    "lag": "high watermark minus committed offset",
}
TOTAL_GAUGES = {
    "active_workers": "workers currently taking runs (sized to the handler's cost; 0: the poll thread runs them)",
}
TOTAL_COUNTERS = {
    "processed_records": "records whose handler succeeded",
    "failed_attempts": "handler invocations that raised",
    "dead_lettered_records": "records produced to the dead-letter topic",
    "commits": "offset commit requests sent",
}


class ParallelConsumerCollector(Collector):
    """Register with ``prometheus_client.REGISTRY.register(ParallelConsumerCollector(pc))``."""

    def __init__(self, consumer: ParallelConsumer) -> None:
        self._consumer = consumer

    def collect(self) -> Iterator[Metric]:
        snapshot = self._consumer.metrics()
        for name, documentation in PARTITION_GAUGES.items():
            gauge = GaugeMetricFamily(PREFIX + name, documentation, labels=["topic", "partition"])
            for partition in snapshot.partitions:
                value = getattr(partition, name)
                if value is not None:
                    gauge.add_metric([partition.topic, str(partition.partition)], value)
            yield gauge
        for name, documentation in TOTAL_GAUGES.items():
            yield GaugeMetricFamily(PREFIX + name, documentation, value=getattr(snapshot, name))
        for name, documentation in TOTAL_COUNTERS.items():
            yield CounterMetricFamily(PREFIX + name, documentation, value=getattr(snapshot, name))
