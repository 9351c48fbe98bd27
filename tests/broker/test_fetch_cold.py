"""Fetching records that are not in the page cache: a consumer reading a segment dropped from
the page cache gets every record, byte for byte, and the broker reads the slices with
``O_DIRECT`` off the event loop, so the segment stays out of the page cache (``sendfile``
would have cached all of it)."""

from __future__ import annotations

import os
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from tests.page_cache import cached_pages, drop_from_page_cache

RECORDS = 6000
VALUE_BYTES = 1000
CONSUME_TIMEOUT_S = 60.0


def _produce(bootstrap: str, topic: str) -> list[bytes]:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    values = [os.urandom(VALUE_BYTES) for _ in range(RECORDS)]
    for value in values:
        producer.produce(topic, value, partition=0)
    assert producer.flush(30) == 0
    return values


def _consume_all(bootstrap: str, topic: str, fetch_bytes: int) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"cold-{topic}",
                         "enable.auto.commit": False, "fetch.max.bytes": max(fetch_bytes, 1 << 20),
                         "max.partition.fetch.bytes": fetch_bytes})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values: list[bytes] = []
    try:
        while len(values) < RECORDS:
            messages = consumer.consume(1000, CONSUME_TIMEOUT_S)
            assert messages, f"no records after {len(values)}"
            for message in messages:
                assert message.error() is None, message.error()
                values.append(message.value())
    finally:
        consumer.close()
    return values


@pytest.mark.required_where("cachestat")
def test_a_consumer_reads_a_segment_out_of_the_page_cache_without_caching_it(fresh_broker):
    topic = f"cold-{uuid.uuid4().hex[:8]}"
    produced = _produce(fresh_broker.bootstrap, topic)
    segment = fresh_broker.data_dir / f"{topic}-0" / "00000000000000000000.log"
    drop_from_page_cache(segment)
    assert cached_pages(segment) == 0
    # Slices both larger and smaller than the broker's sendfile threshold (64 KiB).
    assert _consume_all(fresh_broker.bootstrap, topic, 1024 * 1024) == produced
    pages = -(-segment.stat().st_size // 4096)
    assert cached_pages(segment) < pages // 2  # only what index lookups' header reads bring
    drop_from_page_cache(segment)
    assert _consume_all(fresh_broker.bootstrap, topic, 32 * 1024) == produced
    assert cached_pages(segment) < pages // 2
