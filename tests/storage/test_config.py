"""Topic configuration: defaults, broker synonyms, validation errors, round trips."""

from __future__ import annotations

import pytest

from headrace.errors import InvalidConfig
from headrace.storage.config import TOPIC_CONFIGS, LogConfig, validate_topic_overrides


def test_defaults_are_kafkas():
    config = LogConfig.from_properties({}, {})
    assert config.segment_bytes == 1073741824
    assert config.retention_ms == 7 * 24 * 3600 * 1000
    assert config.max_message_bytes == 1048588
    assert config.cleanup_policy == ("delete",)
    assert config.index_interval_bytes == 4096
    assert config.segment_index_bytes == 10485760
    assert config == LogConfig()
    assert set(TOPIC_CONFIGS) >= {"segment.bytes", "retention.ms", "cleanup.policy",
                                  "message.timestamp.after.max.ms", "min.insync.replicas"}


def test_broker_synonyms_in_kafkas_precedence():
    broker = {"log.retention.hours": "2", "log.retention.minutes": "3", "log.roll.hours": "1",
              "log.segment.bytes": "5000", "log.cleanup.policy": "compact,delete"}
    config = LogConfig.from_properties({}, broker)
    assert config.retention_ms == 3 * 60_000
    assert config.segment_ms == 3_600_000
    assert config.segment_bytes == 5000
    assert config.cleanup_policy == ("compact", "delete")
    assert LogConfig.from_properties({}, {**broker, "log.retention.ms": "-1"}).retention_ms == -1
    topic = LogConfig.from_properties({"retention.ms": "77"}, broker)
    assert topic.retention_ms == 77


@pytest.mark.parametrize(("key", "value"), [
    ("retention.ms", "-5"), ("segment.bytes", "abc"), ("segment.bytes", "3000000000"),
    ("message.timestamp.type", "WallTime"), ("cleanup.policy", "shred"),
    ("min.cleanable.dirty.ratio", "1.5"), ("compression.type", "brotli"),
    ("min.insync.replicas", "0"),
])
def test_invalid_values_name_key_and_value(key, value):
    with pytest.raises(InvalidConfig) as raised:
        LogConfig.from_properties({key: value}, {})
    assert key in raised.value.message and value in raised.value.message


def test_unknown_keys_and_bad_broker_defaults_are_rejected():
    with pytest.raises(InvalidConfig, match="no.such.config"):
        validate_topic_overrides({"no.such.config": "1"})
    with pytest.raises(InvalidConfig, match="log.segment.bytes"):
        LogConfig.from_properties({}, {"log.segment.bytes": "-1"})


def test_properties_round_trip():
    config = LogConfig.from_properties({"cleanup.policy": "delete,compact", "flush.ms": "10",
                                        "min.cleanable.dirty.ratio": "0.25"}, {})
    assert LogConfig.from_properties(config.to_properties(), {}) == config
    assert validate_topic_overrides({"cleanup.policy": "delete, compact"}) == {
        "cleanup.policy": "compact,delete"}
