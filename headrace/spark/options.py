"""Options of the headrace Spark source and sink, parsed once on the driver.

Owns: turning the string options Spark hands a data source (keys already lower-cased by
pyspark 4.3) into frozen dataclasses with the names and defaults of Spark's own Kafka
connector (``kafka.bootstrap.servers``, ``subscribe`` / ``subscribePattern`` / ``assign``,
``startingOffsets``, ``endingOffsets``, ``startingOffsetsByTimestamp``, ``startingTimestamp``,
``endingOffsetsByTimestamp``, ``endingTimestamp``, ``minPartitions``, ``failOnDataLoss``,
``includeHeaders``, ``maxOffsetsPerTrigger``, ``topic``, and the sink's ``exactlyOnce`` and
``transactionalIdPrefix``). Every ``kafka.*`` option is passed to the client with the prefix
removed; ``kafka.isolation.level`` (read_uncommitted by default, as Kafka's consumer) is
checked here.

Offset specifications are kept unresolved (``OffsetSpec``); resolving them needs a broker
(``headrace.spark.offsets``). Option values are JSON where Spark's are JSON.

Pure data; the dataclasses are immutable and picklable (they travel to executors).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

EARLIEST_OFFSET_SENTINEL = -2
LATEST_OFFSET_SENTINEL = -1
KAFKA_OPTION_PREFIX = "kafka."
DEFAULT_POLL_TIMEOUT_MS = 120_000
DEFAULT_RECORDS_PER_ARROW_BATCH = 65_536
DEFAULT_TRANSACTIONAL_ID_PREFIX = "headrace-spark"
# Spark's Kafka source rejects these client options: the source sets them itself.
SOURCE_UNSUPPORTED_KAFKA_KEYS = (
    "auto.offset.reset", "enable.auto.commit", "key.deserializer", "value.deserializer",
    "interceptor.classes",
)


class OptionError(ValueError):
    """An option is missing, malformed or contradicts another one."""


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """One unresolved starting or ending position.

    kind is "earliest", "latest", "offsets" (per-partition JSON, -2/-1 allowed),
    "timestamps" (per-partition JSON of epoch ms) or "timestamp" (one epoch ms for all).
    """

    kind: str
    per_partition: tuple[tuple[str, int, int], ...] = ()
    timestamp_ms: int = 0

    def partition_values(self) -> dict[tuple[str, int], int]:
        return {(topic, partition): value for topic, partition, value in self.per_partition}


@dataclass(frozen=True, slots=True)
class Subscription:
    """Which topic-partitions to read: exactly one of the three Kafka strategies."""

    strategy: str  # "subscribe", "subscribepattern" or "assign"
    topics: tuple[str, ...] = ()
    pattern: str = ""
    assigned: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class SourceOptions:
    client_config: tuple[tuple[str, str], ...]
    subscription: Subscription
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp_strategy: str = "error"
    min_partitions: int | None = None
    fail_on_data_loss: bool = True
    include_headers: bool = False
    max_offsets_per_trigger: int | None = None
    poll_timeout_ms: int = DEFAULT_POLL_TIMEOUT_MS
    records_per_arrow_batch: int = DEFAULT_RECORDS_PER_ARROW_BATCH

    def client_dict(self) -> dict[str, str]:
        return dict(self.client_config)


@dataclass(frozen=True, slots=True)
class SinkOptions:
    client_config: tuple[tuple[str, str], ...]
    topic: str | None = None
    exactly_once: bool = False
    transactional_id_prefix: str = DEFAULT_TRANSACTIONAL_ID_PREFIX

    def client_dict(self) -> dict[str, str]:
        return dict(self.client_config)


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(key).lower(): str(value) for key, value in options.items()}


def client_config_from(options: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The ``kafka.*`` options without their prefix; bootstrap servers are required."""
    lowered = _lower(options)
    config = {
        key[len(KAFKA_OPTION_PREFIX):]: value
        for key, value in lowered.items()
        if key.startswith(KAFKA_OPTION_PREFIX)
    }
    if "bootstrap.servers" not in config:
        raise OptionError("option 'kafka.bootstrap.servers' is required")
    return tuple(sorted(config.items()))


def _parse_bool(name: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    raise OptionError(f"option '{name}' must be true or false, got {text!r}")


def _parse_positive_int(name: str, text: str | None) -> int | None:
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        raise OptionError(f"option '{name}' must be an integer, got {text!r}") from None
    if value <= 0:
        raise OptionError(f"option '{name}' must be positive, got {value}")
    return value


def _parse_per_partition_json(name: str, text: str) -> tuple[tuple[str, int, int], ...]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError(f"option '{name}' is not valid JSON: {error}") from None
    if not isinstance(document, dict):
        raise OptionError(f"option '{name}' must be a JSON object of topic -> partition -> value")
    entries = []
    for topic, partitions in document.items():
        if not isinstance(partitions, dict):
            raise OptionError(f"option '{name}': topic {topic!r} must map to an object")
        for partition, value in partitions.items():
            if not isinstance(value, int) or isinstance(value, bool):
                raise OptionError(f"option '{name}': {topic}-{partition} must be an integer")
            entries.append((str(topic), int(partition), int(value)))
    return tuple(sorted(entries))


def _parse_subscription(options: dict[str, str]) -> Subscription:
    chosen = [key for key in ("subscribe", "subscribepattern", "assign") if key in options]
    if len(chosen) != 1:
        raise OptionError(
            "exactly one of 'subscribe', 'subscribePattern' or 'assign' must be set"
        )
    strategy = chosen[0]
    text = options[strategy]
    if strategy == "subscribe":
        topics = tuple(topic.strip() for topic in text.split(",") if topic.strip())
        if not topics:
            raise OptionError("option 'subscribe' names no topic")
        return Subscription(strategy, topics=topics)
    if strategy == "subscribepattern":
        if not text.strip():
            raise OptionError("option 'subscribePattern' is empty")
        return Subscription(strategy, pattern=text.strip())
    entries = _parse_assign_json(text)
    return Subscription(strategy, assigned=entries)


def _parse_assign_json(text: str) -> tuple[tuple[str, int], ...]:
    try:
        document = json.loads(text)
    except json.JSONDecodeError as error:
        raise OptionError(f"option 'assign' is not valid JSON: {error}") from None
    if not isinstance(document, dict) or not document:
        raise OptionError('option \'assign\' must look like {"topic":[0,1]}')
    assigned = []
    for topic, partitions in document.items():
        if not isinstance(partitions, list):
            raise OptionError(f"option 'assign': topic {topic!r} must map to a list")
        assigned.extend((str(topic), int(partition)) for partition in partitions)
    return tuple(sorted(assigned))


def _parse_offset_spec(
    options: dict[str, str], prefix: str, default_kind: str
) -> OffsetSpec:
    """Spark's precedence: <prefix>Timestamp, then <prefix>OffsetsByTimestamp, then Offsets."""
    single = options.get(f"{prefix}timestamp")
    if single is not None:
        try:
            return OffsetSpec("timestamp", timestamp_ms=int(single))
        except ValueError:
            raise OptionError(f"option '{prefix}Timestamp' must be epoch ms") from None
    by_timestamp = options.get(f"{prefix}offsetsbytimestamp")
    if by_timestamp is not None:
        entries = _parse_per_partition_json(f"{prefix}OffsetsByTimestamp", by_timestamp)
        return OffsetSpec("timestamps", per_partition=entries)
    text = options.get(f"{prefix}offsets", default_kind).strip()
    if text.lower() in ("earliest", "latest"):
        return OffsetSpec(text.lower())
    return OffsetSpec("offsets", per_partition=_parse_per_partition_json(f"{prefix}Offsets", text))


def parse_source_options(options: Mapping[str, str], streaming: bool) -> SourceOptions:
    """Validate the options of a batch (streaming=False) or streaming read."""
    lowered = _lower(options)
    for key in SOURCE_UNSUPPORTED_KAFKA_KEYS:
        if KAFKA_OPTION_PREFIX + key in lowered:
            raise OptionError(f"Kafka option '{key}' is not supported: the source manages it")
    isolation = lowered.get(KAFKA_OPTION_PREFIX + "isolation.level", "read_uncommitted")
    if isolation.strip().lower() not in ("read_uncommitted", "read_committed"):
        raise OptionError("option 'kafka.isolation.level' must be read_uncommitted or "
                          f"read_committed, got {isolation!r}")
    starting = _parse_offset_spec(lowered, "starting", "latest" if streaming else "earliest")
    ending = _parse_offset_spec(lowered, "ending", "latest")
    _check_offset_kinds(starting, ending, streaming, lowered)
    strategy = lowered.get("startingoffsetsbytimestampstrategy", "error").lower()
    if strategy not in ("error", "latest"):
        raise OptionError("option 'startingOffsetsByTimestampStrategy' must be error or latest")
    return SourceOptions(
        client_config=client_config_from(lowered),
        subscription=_parse_subscription(lowered),
        starting=starting,
        ending=ending,
        starting_timestamp_strategy=strategy,
        min_partitions=_parse_positive_int("minPartitions", lowered.get("minpartitions")),
        fail_on_data_loss=_parse_bool("failOnDataLoss", lowered.get("failondataloss", "true")),
        include_headers=_parse_bool("includeHeaders", lowered.get("includeheaders", "false")),
        max_offsets_per_trigger=_parse_positive_int(
            "maxOffsetsPerTrigger", lowered.get("maxoffsetspertrigger")
        ),
        poll_timeout_ms=_parse_positive_int(
            "kafkaConsumer.pollTimeoutMs", lowered.get("kafkaconsumer.polltimeoutms")
        )
        or DEFAULT_POLL_TIMEOUT_MS,
    )


def _check_offset_kinds(
    starting: OffsetSpec, ending: OffsetSpec, streaming: bool, options: dict[str, str]
) -> None:
    if streaming and any(key.startswith("ending") for key in options):
        raise OptionError("ending offsets are not valid in streaming queries")
    if streaming:
        return
    if starting.kind == "latest":
        raise OptionError("startingOffsets 'latest' is not valid for batch queries")
    if ending.kind == "earliest":
        raise OptionError("endingOffsets 'earliest' is not valid for batch queries")
    if any(value == LATEST_OFFSET_SENTINEL for _, _, value in starting.per_partition
           if starting.kind == "offsets"):
        raise OptionError("startingOffsets for batch queries cannot use -1 (latest)")
    if any(value == EARLIEST_OFFSET_SENTINEL for _, _, value in ending.per_partition
           if ending.kind == "offsets"):
        raise OptionError("endingOffsets for batch queries cannot use -2 (earliest)")


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The sink's options; ``exactlyOnce`` (default false) writes each streaming task in a
    transaction (``headrace.spark.sink``), which needs the ``topic`` option (its partition 0
    carries the committed batch ids) and derives the transactional ids itself."""
    lowered = _lower(options)
    config = dict(client_config_from(lowered))
    config.setdefault("enable.idempotence", "true")
    exactly_once = _parse_bool("exactlyOnce", lowered.get("exactlyonce", "false"))
    prefix = lowered.get("transactionalidprefix", DEFAULT_TRANSACTIONAL_ID_PREFIX).strip()
    topic = lowered.get("topic")
    if exactly_once and not topic:
        raise OptionError("option 'exactlyOnce' needs the 'topic' option: its partition 0 "
                          "holds the sink's committed batch ids")
    if exactly_once and "transactional.id" in config:
        raise OptionError("option 'kafka.transactional.id' is not supported with "
                          "'exactlyOnce': the sink derives one per task from "
                          "'transactionalIdPrefix'")
    if not prefix:
        raise OptionError("option 'transactionalIdPrefix' is empty")
    return SinkOptions(client_config=tuple(sorted(config.items())), topic=topic,
                       exactly_once=exactly_once, transactional_id_prefix=prefix)
