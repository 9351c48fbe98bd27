"""Broker configuration: Kafka's broker config names and defaults, their sources, dynamic updates.

Owns ``BrokerConfig``. Values are resolved in Kafka's precedence order, lowest first:

1. defaults (``DEFAULT_CONFIG``, source code 5) -- Kafka's, except ``listeners``
   (127.0.0.1:9092), ``log.dir`` (./data) and ``node.id`` (1), which suit a single-node broker;
2. a server.properties file, then environment variables ``HEADRACE_<NAME>`` (``log.dirs`` ->
   ``HEADRACE_LOG_DIRS``), then ``--override key=value`` (``STATIC_BROKER_CONFIG``, 4);
3. the cluster-wide dynamic defaults set through AlterConfigs with an empty broker resource
   name (``DYNAMIC_DEFAULT_BROKER_CONFIG``, 3), persisted as Java properties in
   ``<first log dir>/dynamic-default-broker.properties``;
4. this broker's dynamic configs, set with its id as resource name (``DYNAMIC_BROKER_CONFIG``,
   2), in ``<first log dir>/dynamic-broker.properties``; both files are re-applied at start.

The source codes are Kafka's ``DescribeConfigsResponse.ConfigSource``. As Kafka's
``DynamicBrokerConfig``: the configs marked dynamic (the first broker synonym of every topic
config but ``log.message.format.version``, the cleaner settings, and
``headrace.broker.dynamic_broker_configs``) may be altered, per-broker ones only with a broker
id; a name Kafka does not know is a custom config, stored and described as read-only; any other
name is read-only. A failed check answers INVALID_REQUEST with Kafka's message ("Cannot update
these configs dynamically: Set(num.partitions)"), as Kafka 3.9's ``ConfigAdminManager`` does
for broker resources. Listeners registered with ``add_change_listener`` receive the effective
properties after each dynamic change (the broker pushes them to
``LogManager.set_broker_defaults``, the cleaner restarts its threads): the topic defaults and the
cleaner settings take effect at once; the others are stored and described only.

Cleaner settings are checked as Kafka does. Always (a bad static value stops the broker,
InvalidConfig): the ConfigDef ranges (``log.cleaner.threads``, ``log.cleaner.io.buffer.size``,
``log.cleaner.backoff.ms`` >= 0; and, not cleaner settings, the LogManager task intervals:
``log.retention.check.interval.ms`` >= 1, the checkpoint intervals and
``log.initial.task.delay.ms`` >= 0), ``log.cleaner.dedupe.buffer.size / log.cleaner.threads``
above 1 MiB (KafkaConfig's ``require``) and a load factor in (0, 1] (the offset map's domain).
When AlterConfigs changes one of ``CLEANER_RECONFIGURABLE_CONFIGS``, also
``LogCleaner.validateReconfiguration``: the new thread count is >= 1, not below half the current
one and not above double it; these and the buffer checks answer INVALID_REQUEST, as Kafka's
ConfigException in a dynamic update does; so do the thread-count bounds of Kafka's
``DynamicThreadPool`` configs.

Thread-safety: reads are lock-free over an immutable snapshot; ``alter_dynamic`` may run on
any thread: a change lock orders whole changes, listener calls included, so listeners see
changes in the order they were persisted.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType

from headrace.broker.acceptor import parse_per_ip_overrides
from headrace.broker.dynamic_broker_configs import DYNAMIC_BROKER_CONFIGS, THREAD_POOL_CONFIGS
from headrace.cluster.zookeeper_connect import parse_zookeeper_connect
from headrace.coordinator.config import COORDINATOR_CONFIGS
from headrace.coordinator.transaction_config import TRANSACTION_CONFIGS
from headrace.errors import InvalidConfig, InvalidRequest
from headrace.protocol.wire import DEFAULT_MAX_FRAME_BYTES
from headrace.storage.config import (
    TOPIC_CONFIGS,
    LogConfig,
    format_config_value,
    format_properties_text,
    parse_properties_text,
)
from headrace.storage.offset_map import DEFAULT_DEDUPE_BUFFER_SIZE_BYTES, DEFAULT_LOAD_FACTOR

log = logging.getLogger(__name__)

DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
DYNAMIC_CONFIG_FILE = "dynamic-broker.properties"
DYNAMIC_DEFAULT_CONFIG_FILE = "dynamic-default-broker.properties"
SHORT_MIN, SHORT_MAX = -(2**15), 2**15 - 1
INT_MIN = -(2**31)
LONG_MIN = -(2**63)
ENV_PREFIX = "HEADRACE_"
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
DEFAULT_QUEUED_MAX_REQUEST_BYTES = 512 * 1024 * 1024  # Kafka's is -1; see _SERVER_DEFS
MIN_DEDUPE_BUFFER_BYTES_PER_THREAD = 1024 * 1024  # KafkaConfig: "at least 1MB per cleaner thread"
CLEANER_RECONFIGURABLE_CONFIGS = frozenset({  # LogCleaner.ReconfigurableConfigs
    "log.cleaner.threads", "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.buffer.size", "log.cleaner.io.max.bytes.per.second", "log.cleaner.backoff.ms",
})
# ConfigDef ranges checked at start-up and on change: config -> smallest valid value.
_AT_LEAST = {"log.cleaner.threads": 0, "log.cleaner.io.buffer.size": 0,
             "log.cleaner.backoff.ms": 0, "log.retention.check.interval.ms": 1,
             "log.flush.offset.checkpoint.interval.ms": 0,
             "log.flush.start.offset.checkpoint.interval.ms": 0, "log.initial.task.delay.ms": 0,
             "max.connections": 0, "max.connections.per.ip": 0, "log.scrub.interval.ms": 1}


@dataclass(frozen=True, slots=True)
class BrokerConfigDef:
    """One broker config: name, type ("int", "long", "short", "boolean", "string", "list",
    "double", "class"), default as text (None: no default), whether AlterConfigs may change
    it and only per broker, the inclusive range and allowed values of a dynamic update, and
    whether it is internal (Kafka's ``defineInternal``: described only when set)."""

    name: str
    type: str
    default: str | None
    dynamic: bool = False
    sensitive: bool = False
    per_broker: bool = False
    min_value: float | None = None
    max_value: float | None = None
    allowed: tuple[str, ...] = ()
    internal: bool = False


@dataclass(frozen=True, slots=True)
class ConfigSynonym:
    name: str
    value: str | None
    source: int


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    """One described broker config: its value and source at the described level, and its
    synonyms in Kafka's precedence order (the first decides the source)."""

    name: str
    value: str | None
    source: int
    read_only: bool
    sensitive: bool
    synonyms: tuple[ConfigSynonym, ...] = ()


def _static(name: str, type_: str, default: str | None) -> BrokerConfigDef:
    return BrokerConfigDef(name, type_, default)


def _dynamic(name: str, type_: str, default: str | None) -> BrokerConfigDef:
    return BrokerConfigDef(name, type_, default, dynamic=True)


def _internal(name: str, type_: str, default: str | None) -> BrokerConfigDef:
    return BrokerConfigDef(name, type_, default, internal=True)


_SERVER_DEFS = (
    _static("listeners", "list", "PLAINTEXT://127.0.0.1:9092"),
    _static("advertised.listeners", "list", None),
    _static("node.id", "int", "1"),
    # Kafka's ZooKeeper-mode identity and session (cluster mode: see headrace.cluster). Without
    # zookeeper.connect the broker is the single node it always was, identified by node.id
    # (or broker.id when set); broker.id -1 with broker.id.generation.enable takes an id
    # from ZooKeeper (/brokers/seqid + reserved.broker.max.id), kept in meta.properties.
    _static("broker.id", "int", "-1"),
    _static("broker.id.generation.enable", "boolean", "true"),
    _static("reserved.broker.max.id", "int", "1000"),
    _static("zookeeper.connect", "string", None),
    _static("zookeeper.session.timeout.ms", "int", "18000"),
    _static("zookeeper.connection.timeout.ms", "int", None),  # None: the session timeout
    # The leader's ISR rule (headrace.cluster.partition_leader): a follower not caught up for
    # this long leaves the ISR (checked every half of it).
    _static("replica.lag.time.max.ms", "long", "30000"),
    _static("log.dirs", "list", None),
    _static("log.dir", "string", "./data"),
    _static("num.partitions", "int", "1"),
    _static("default.replication.factor", "int", "1"),
    _static("auto.create.topics.enable", "boolean", "true"),
    _static("delete.topic.enable", "boolean", "true"),
    _static("socket.request.max.bytes", "int", str(DEFAULT_MAX_FRAME_BYTES)),
    _static("connections.max.idle.ms", "long", "600000"),
    # Kafka's default is -1 (unbounded): Kafka reads one request per connection at a time,
    # headrace pipelines up to 64 per connection, so without a bound a few connections could
    # hold 64 maximum-size requests each. 512 MiB lets five maximum-size (100 MiB) requests
    # be received at once; -1 still means unbounded.
    _static("queued.max.request.bytes", "long", str(DEFAULT_QUEUED_MAX_REQUEST_BYTES)),
    _static("log.retention.check.interval.ms", "long", "300000"),
    _static("log.flush.scheduler.interval.ms", "long", str(LONG_MAX)),
    _static("log.flush.offset.checkpoint.interval.ms", "int", "60000"),
    _static("log.flush.start.offset.checkpoint.interval.ms", "int", "60000"),
    _static("replica.high.watermark.checkpoint.interval.ms", "long", "5000"),
    _internal("log.initial.task.delay.ms", "long", "30000"),
    _static("log.cleaner.enable", "boolean", "true"),
    _dynamic("log.cleaner.threads", "int", "1"),
    _dynamic("log.cleaner.backoff.ms", "long", "15000"),
    _dynamic("log.cleaner.dedupe.buffer.size", "long", str(DEFAULT_DEDUPE_BUFFER_SIZE_BYTES)),
    _dynamic("log.cleaner.io.buffer.size", "int", "524288"),
    _dynamic("log.cleaner.io.buffer.load.factor", "double", str(DEFAULT_LOAD_FACTOR)),
    _dynamic("log.cleaner.io.max.bytes.per.second", "double", "1.7976931348623157E308"),
    # The background scrub of sealed segments (headrace's own; see broker.scrub_service).
    _static("log.scrub.enable", "boolean", "true"),
    _static("log.scrub.io.max.bytes.per.second", "double", "4194304"),
    _static("log.scrub.interval.ms", "long", "86400000"),
    # The group coordinator's configs (offset.metadata.max.bytes, group.*, ...) are declared
    # in headrace.coordinator.config: see _coordinator_defs.
    _static("offsets.topic.replication.factor", "int", "3"),
    _static("offsets.topic.segment.bytes", "int", "104857600"),
    _static("offsets.commit.timeout.ms", "int", "5000"),
    _static("offsets.load.buffer.size", "int", "5242880"),
    # The follower's replica fetcher (headrace.broker.replica_fetcher).
    _static("replica.fetch.max.bytes", "int", "1048576"),
    _static("replica.fetch.response.max.bytes", "int", "10485760"),
    _static("replica.fetch.wait.max.ms", "int", "500"),
    _static("replica.fetch.min.bytes", "int", "1"),
    _static("replica.fetch.backoff.ms", "int", "1000"),
    _static("replica.socket.timeout.ms", "int", "30000"),
    _static("replication.quota.window.num", "int", "11"),
    _static("replication.quota.window.size.seconds", "int", "1"),
    # Controlled shutdown of a broker in a cluster (headrace.cluster.controlled_shutdown).
    _static("controlled.shutdown.enable", "boolean", "true"),
    _static("controlled.shutdown.max.retries", "int", "3"),
    _static("controlled.shutdown.retry.backoff.ms", "long", "5000"),
    _static("controller.socket.timeout.ms", "int", "30000"),
    # The controller's automatic preferred-leader rebalance (headrace.cluster.controller).
    _static("auto.leader.rebalance.enable", "boolean", "true"),
    _static("leader.imbalance.check.interval.seconds", "long", "300"),
    _static("leader.imbalance.per.broker.percentage", "int", "10"),
)

# Broker synonyms of topic configs that have no default of their own in Kafka
# (a coarser-unit synonym that only applies when set, e.g. log.retention.minutes).
_SYNONYM_DEFAULTS = {"log.roll.hours": "168", "log.retention.hours": "168", "log.roll.jitter.hours": "0"}


def _log_defs() -> tuple[BrokerConfigDef, ...]:
    """The broker-level defaults of every topic config (log.retention.ms, message.max.bytes...).
    Only the first synonym of each is dynamic (Kafka's ``DynamicLogConfig``), so
    ``log.retention.hours`` is read-only while ``log.retention.ms`` is not."""
    defs: dict[str, BrokerConfigDef] = {}
    for topic_def in TOPIC_CONFIGS.values():
        for position, (broker_key, _multiplier) in enumerate(topic_def.broker_synonyms):
            if broker_key in defs:
                continue
            if position == 0 and broker_key not in ("log.roll.ms", "log.retention.ms",
                                                    "log.roll.jitter.ms"):
                default = format_config_value(topic_def.default)
            else:
                default = _SYNONYM_DEFAULTS.get(broker_key)
            defs[broker_key] = BrokerConfigDef(
                broker_key, topic_def.type, default,
                dynamic=position == 0 and topic_def.broker_reconfigurable,
                min_value=topic_def.min_value, max_value=topic_def.max_value,
                allowed=topic_def.allowed)
    return tuple(defs.values())


def _coordinator_defs() -> tuple[BrokerConfigDef, ...]:
    return tuple(_static(d.name, d.type, str(d.default))
                 for d in (*COORDINATOR_CONFIGS.values(), *TRANSACTION_CONFIGS.values()))


def _other_dynamic_defs() -> tuple[BrokerConfigDef, ...]:
    return tuple(BrokerConfigDef(d.name, d.type, d.default, dynamic=True, per_broker=d.per_broker,
                                 min_value=d.min_value, max_value=d.max_value, allowed=d.allowed)
                 for d in DYNAMIC_BROKER_CONFIGS)


BROKER_CONFIGS: Mapping[str, BrokerConfigDef] = MappingProxyType(
    {d.name: d for d in (*_SERVER_DEFS, *_coordinator_defs(), *_log_defs(),
                         *_other_dynamic_defs())}
)
# One declaration per config: a name in two of those sources would have two defaults.
assert len(BROKER_CONFIGS) == (len(_SERVER_DEFS) + len(_coordinator_defs()) + len(_log_defs())
                               + len(_other_dynamic_defs()))
# Kafka's DynamicBrokerConfig.brokerConfigSynonyms: names of one config, in precedence order.
_SYNONYM_GROUPS = (("log.roll.ms", "log.roll.hours"),
                   ("log.roll.jitter.ms", "log.roll.jitter.hours"),
                   ("log.retention.ms", "log.retention.minutes", "log.retention.hours"))
BROKER_SYNONYMS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {name: group for group in _SYNONYM_GROUPS for name in group}
    | {"log.flush.interval.ms": ("log.flush.interval.ms", "log.flush.scheduler.interval.ms")})


def _scala_set(names) -> str:
    return f"Set({', '.join(sorted(names))})"


def env_name(config_name: str) -> str:
    """``log.dirs`` -> ``HEADRACE_LOG_DIRS``."""
    return ENV_PREFIX + config_name.upper().replace(".", "_").replace("-", "_")


def read_properties_file(path: Path) -> str:
    """The text of a properties file; InvalidConfig (one line, naming the file and byte) for
    a file that is not text: bytes that are not UTF-8, or a NUL byte."""
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise InvalidConfig(f"{path} is not a properties file: byte {error.start} is not "
                            "UTF-8 text") from None
    if "\0" in text:
        raise InvalidConfig(f"{path} is not a properties file: NUL byte at byte "
                            f"{data.index(0)}")
    return text


def parse_override(text: str) -> tuple[str, str]:
    """``key=value`` from the command line (InvalidConfig without '=')."""
    key, separator, value = text.partition("=")
    if not separator or not key.strip():
        raise InvalidConfig(f"override {text!r} is not key=value")
    return key.strip(), value.strip()


def parse_listener(listener: str) -> tuple[str, int]:
    """``PLAINTEXT://host:port`` or ``host:port`` -> (host, port); an empty host is 0.0.0.0."""
    address = listener.split("://", 1)[-1].strip()
    host, separator, port_text = address.rpartition(":")
    if not separator or not port_text.isdigit():
        raise InvalidConfig(f"Invalid value {listener} for configuration listeners: no port")
    host = host.strip("[]")
    return host or "0.0.0.0", int(port_text)


class BrokerConfig:
    """The broker's effective configuration (see the module docstring for precedence)."""

    def __init__(
        self,
        static_properties: Mapping[str, str] | None = None,
    ) -> None:
        self._static = dict(static_properties or {})
        self._per_broker: dict[str, str] = {}
        self._cluster_default: dict[str, str] = {}
        self._lock = threading.Lock()
        self._change_lock = threading.Lock()  # a whole alter_dynamic; taken before ``_lock``
        self._listeners: list[Callable[[dict[str, str]], None]] = []
        for key in self._static:
            if key not in BROKER_CONFIGS and key not in TOPIC_CONFIGS:
                log.warning("unknown broker config %s ignored", key)
        self._validate(self._effective(self._static, {}, {}))
        self._load_dynamic()

    # --- construction --------------------------------------------------------------------

    @classmethod
    def load(
        cls,
        properties_file: Path | None = None,
        environment: Mapping[str, str] | None = None,
        overrides: list[str] | tuple[str, ...] = (),
    ) -> BrokerConfig:
        """File, then HEADRACE_* environment variables, then ``key=value`` overrides."""
        static: dict[str, str] = {}
        if properties_file is not None:
            static.update(parse_properties_text(read_properties_file(Path(properties_file))))
        env = os.environ if environment is None else environment
        for name in BROKER_CONFIGS:
            value = env.get(env_name(name))
            if value is not None:
                static[name] = value
        for text in overrides:
            key, value = parse_override(text)
            static[key] = value
        return cls(static)

    # --- reads ---------------------------------------------------------------------------

    def get(self, name: str) -> str | None:
        """The effective value of a config as text (None when unset without a default)."""
        for layer in (self._per_broker, self._cluster_default, self._static):
            value = layer.get(name)
            if value is not None:
                return value
        definition = BROKER_CONFIGS.get(name)
        return definition.default if definition else None

    def get_int(self, name: str) -> int:
        value = self.get(name)
        if value is None:
            raise InvalidConfig(f"configuration {name} has no value")
        return int(value)

    def get_bool(self, name: str) -> bool:
        return (self.get(name) or "").strip().lower() == "true"

    def properties(self) -> dict[str, str]:
        """Every config that has a value, effective (dynamic over static over default)."""
        return self._effective(self._static, self._cluster_default, self._per_broker)

    def dynamic_configs(self, per_broker: bool) -> dict[str, str]:
        """The configs set dynamically for this broker, or as the cluster-wide default."""
        return dict(self._per_broker if per_broker else self._cluster_default)

    def describe(self, per_broker: bool = True) -> list[ConfigEntry]:
        """Kafka's ``ConfigHelper``: for this broker every config (custom dynamic ones too;
        internal ones only when set), its effective value and every synonym; for the cluster-wide default only the configs
        set there, with their default-level synonyms."""
        if per_broker:
            names = {n for n, d in BROKER_CONFIGS.items() if not d.internal or n in self._static}
            names |= set(self._cluster_default) | set(self._per_broker)
        else:
            names = set(self._cluster_default)
        entries = []
        for name in sorted(names):
            synonyms = self._synonyms(name)
            if not per_broker:
                synonyms = [s for s in synonyms if s.source == DYNAMIC_DEFAULT_BROKER_CONFIG]
            definition = BROKER_CONFIGS.get(name)
            value = self.get(name) if per_broker else self._cluster_default[name]
            entries.append(ConfigEntry(
                name, value, synonyms[0].source if synonyms else DEFAULT_CONFIG,
                read_only=definition is None or not definition.dynamic,
                sensitive=definition is not None and definition.sensitive,
                synonyms=tuple(synonyms)))
        return entries

    def _synonyms(self, name: str) -> list[ConfigSynonym]:
        """Every level's value of ``name`` and its synonyms, highest precedence first, from
        ``name`` on (Kafka's ``configSynonyms``)."""
        defaults = {n: d.default for n, d in BROKER_CONFIGS.items() if d.default is not None}
        layers = ((self._per_broker, DYNAMIC_BROKER_CONFIG),
                  (self._cluster_default, DYNAMIC_DEFAULT_BROKER_CONFIG),
                  (self._static, STATIC_BROKER_CONFIG), (defaults, DEFAULT_CONFIG))
        synonyms = [ConfigSynonym(synonym, layer[synonym], source)
                    for layer, source in layers
                    for synonym in BROKER_SYNONYMS.get(name, (name,)) if synonym in layer]
        while synonyms and synonyms[0].name != name:
            synonyms.pop(0)
        return synonyms

    # --- derived values ------------------------------------------------------------------

    @property
    def node_id(self) -> int:
        broker_id = self.get("broker.id")
        if broker_id is not None and int(broker_id) >= 0 and "node.id" not in self._static:
            return int(broker_id)
        return self.get_int("node.id")

    @property
    def log_dirs(self) -> list[Path]:
        text = self.get("log.dirs") or self.get("log.dir") or "./data"
        return [Path(item.strip()) for item in text.split(",") if item.strip()]

    @property
    def listener(self) -> tuple[str, int]:
        return parse_listener((self.get("listeners") or "").split(",")[0])

    @property
    def advertised_listener(self) -> tuple[str, int]:
        """Advertised host/port; a wildcard listen address advertises 127.0.0.1."""
        advertised = self.get("advertised.listeners")
        host, port = parse_listener((advertised or self.get("listeners") or "").split(",")[0])
        if host in ("0.0.0.0", "::"):
            host = "127.0.0.1"
        return host, port

    # --- dynamic configs -----------------------------------------------------------------

    def add_change_listener(self, callback: Callable[[dict[str, str]], None]) -> None:
        """``callback(effective_properties)`` after every applied dynamic change."""
        self._listeners.append(callback)

    def alter_dynamic(self, changes: Mapping[str, str | None], validate_only: bool,
                      per_broker: bool = True) -> None:
        """Set (value) or remove (None) this broker's dynamic configs, or the cluster-wide
        defaults, atomically. InvalidRequest, with Kafka's message, for a read-only name, a
        per-broker config at the default level or a bad value; nothing is applied then.
        Listeners are called after the change is persisted, in the order of the changes."""
        with self._change_lock:
            self._alter_dynamic_locked(changes, validate_only, per_broker)

    def _alter_dynamic_locked(self, changes: Mapping[str, str | None], validate_only: bool,
                              per_broker: bool) -> None:
        with self._lock:
            updated = self.dynamic_configs(per_broker)
            for name, value in changes.items():
                if value is None:
                    updated.pop(name, None)
                else:
                    updated[name] = value.strip()
            per_broker_layer = updated if per_broker else self._per_broker
            default_layer = self._cluster_default if per_broker else updated
            effective = self._effective(self._static, default_layer, per_broker_layer)
            try:
                _check_dynamic_layer(updated, per_broker)
                self._check_reconfiguration(set(changes), effective)
                self._validate(effective)
            except InvalidConfig as error:
                raise InvalidRequest(error.message) from None
            if validate_only:
                return
            self._persist(self._dynamic_path(per_broker), updated)
            if per_broker:
                self._per_broker = updated
            else:
                self._cluster_default = updated
        for callback in self._listeners:
            callback(effective)

    def _check_reconfiguration(self, changed: set[str], effective: Mapping[str, str]) -> None:
        """Kafka's ``validateReconfiguration`` of the cleaner and the thread pools."""
        current = self.properties()
        if CLEANER_RECONFIGURABLE_CONFIGS & changed:
            for name in CLEANER_RECONFIGURABLE_CONFIGS:
                _check_type(BROKER_CONFIGS[name], effective[name])
            validate_cleaner_reconfiguration(current, effective)
        for name in THREAD_POOL_CONFIGS:
            validate_thread_count_change(name, int(current[name]), int(effective[name]))

    def _load_dynamic(self) -> None:
        for per_broker in (False, True):
            path = self._dynamic_path(per_broker)
            if not path.exists():
                continue
            stored = _valid_stored_configs(parse_properties_text(path.read_text()), per_broker,
                                           path)
            layers = {per_broker: stored, not per_broker: self.dynamic_configs(not per_broker)}
            try:
                self._validate(self._effective(self._static, layers[False], layers[True]))
            except InvalidConfig as error:
                log.error("ignoring invalid %s: %s", path, error)
                continue
            if per_broker:
                self._per_broker = stored
            else:
                self._cluster_default = stored

    @staticmethod
    def _persist(path: Path, dynamic: Mapping[str, str]) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        with open(temporary, "w") as file:
            file.write(format_properties_text(dynamic))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)

    def _dynamic_path(self, per_broker: bool) -> Path:
        return self.log_dirs[0] / (DYNAMIC_CONFIG_FILE if per_broker
                                   else DYNAMIC_DEFAULT_CONFIG_FILE)

    @staticmethod
    def _effective(static: Mapping[str, str], cluster_default: Mapping[str, str],
                   per_broker: Mapping[str, str]) -> dict[str, str]:
        merged = {name: d.default for name, d in BROKER_CONFIGS.items() if d.default is not None}
        merged.update(static)
        merged.update(cluster_default)
        merged.update(per_broker)
        return merged

    @staticmethod
    def _validate(properties: Mapping[str, str]) -> None:
        for name, value in properties.items():
            definition = BROKER_CONFIGS.get(name)
            if definition is not None:
                _check_type(definition, value)
        _check_at_least(properties)
        _validate_cleaner(properties)
        _check_scrub_rate(properties)
        overrides = parse_per_ip_overrides(properties.get("max.connections.per.ip.overrides") or "")
        if int(properties["max.connections.per.ip"]) == 0 and not overrides:
            raise InvalidConfig("max.connections.per.ip can be set to zero only if "
                                "max.connections.per.ip.overrides property is set.")
        LogConfig.from_properties({}, dict(properties))
        parse_listener((properties.get("listeners") or "").split(",")[0])
        if properties.get("zookeeper.connect"):
            _validate_cluster_mode(properties)


def _check_dynamic_layer(layer: Mapping[str, str], per_broker: bool) -> None:
    """Kafka's ``DynamicBrokerConfig.validateConfigs`` and ``validateConfigTypes`` of one
    level's configs: none read-only, per-broker ones only per broker, values parse and lie in
    range. Names Kafka does not define are custom configs and pass."""
    read_only = {n for n in layer if n in BROKER_CONFIGS and not BROKER_CONFIGS[n].dynamic}
    if read_only:
        raise InvalidConfig(f"Cannot update these configs dynamically: {_scala_set(read_only)}")
    if not per_broker:
        only_per_broker = {n for n in layer if n in BROKER_CONFIGS and BROKER_CONFIGS[n].per_broker}
        if only_per_broker:
            raise InvalidConfig("Cannot update these configs at default cluster level, broker id "
                                f"must be specified: {_scala_set(only_per_broker)}")
    for name, value in layer.items():
        if name in BROKER_CONFIGS:
            _check_value(BROKER_CONFIGS[name], value)


def _valid_stored_configs(stored: Mapping[str, str], per_broker: bool,
                          path: Path) -> dict[str, str]:
    """Kafka's ``fromPersistentProps``: stored configs that may not (or no longer) be set at
    this level, or whose value does not parse, are logged and ignored."""
    kept = {}
    for name, value in stored.items():
        try:
            _check_dynamic_layer({name: value}, per_broker)
        except InvalidConfig as error:
            log.error("%s: ignoring %s: %s", path, name, error)
            continue
        kept[name] = value
    return kept


def validate_thread_count_change(name: str, current: int, new: int) -> None:
    """Kafka's ``DynamicThreadPool.validateReconfiguration`` for one thread-pool config."""
    if new == current:
        return
    prefix = f"Dynamic thread count update validation failed for {name}={new}"
    if new <= 0:
        raise InvalidConfig(f"{prefix}, value should be at least 1")
    if new < current // 2:
        raise InvalidConfig(f"{prefix}, value should be at least half the current value "
                            f"{current}")
    if new > current * 2:
        raise InvalidConfig(f"{prefix}, value should not be greater than double the current "
                            f"value {current}")


def _check_value(definition: BrokerConfigDef, value: str) -> None:
    """Type, range and allowed values, as Kafka's ConfigDef parses a dynamic config."""
    _check_type(definition, value)
    if definition.type in ("int", "long", "short", "double"):
        number = float(value)
        if definition.min_value is not None and number < definition.min_value:
            raise InvalidConfig(f"Invalid value {value} for configuration {definition.name}: "
                                f"Value must be at least {_number_text(definition.min_value)}")
        if definition.max_value is not None and number > definition.max_value:
            raise InvalidConfig(f"Invalid value {value} for configuration {definition.name}: "
                                f"Value must be no more than "
                                f"{_number_text(definition.max_value)}")
    if definition.allowed and definition.type == "string" and value.strip() not in \
            definition.allowed:
        raise InvalidConfig(f"Invalid value {value} for configuration {definition.name}: "
                            f"String must be one of: {', '.join(definition.allowed)}")


def _number_text(number: float) -> str:
    return str(int(number)) if float(number).is_integer() else str(number)


_INTEGER_RANGES = {"short": (SHORT_MIN, SHORT_MAX), "int": (INT_MIN, INT_MAX),
                   "long": (LONG_MIN, LONG_MAX)}


def _check_type(definition: BrokerConfigDef, value: str) -> None:
    text = value.strip()
    if definition.type in _INTEGER_RANGES:
        low, high = _INTEGER_RANGES[definition.type]
        try:
            number = int(text)
        except ValueError:
            number = None
        if number is None or not low <= number <= high:
            raise InvalidConfig(
                f"Invalid value {value} for configuration {definition.name}: "
                f"Not a number of type {definition.type.upper()}"
            )
    elif definition.type == "double":
        try:
            float(text)
        except ValueError:
            raise InvalidConfig(
                f"Invalid value {value} for configuration {definition.name}: "
                "Not a number of type DOUBLE"
            ) from None
    elif definition.type == "boolean" and text.lower() not in ("true", "false"):
        raise InvalidConfig(
            f"Invalid value {value} for configuration {definition.name}: Expected value to be "
            "either true or false"
        )


def _cleaner_buffer_problem(properties: Mapping[str, str]) -> str | None:
    """Kafka's per-thread dedupe buffer bound and the load factor's domain; None when fine."""
    threads = max(1, int(properties["log.cleaner.threads"]))
    if int(properties["log.cleaner.dedupe.buffer.size"]) // threads <= \
            MIN_DEDUPE_BUFFER_BYTES_PER_THREAD:
        return "log.cleaner.dedupe.buffer.size must be at least 1MB per cleaner thread."
    load_factor = float(properties["log.cleaner.io.buffer.load.factor"])
    if not 0.0 < load_factor <= 1.0:
        return (f"Invalid value {load_factor} for configuration "
                "log.cleaner.io.buffer.load.factor: the dedupe buffer load factor must lie in "
                "(0, 1]")
    return None


def _check_at_least(properties: Mapping[str, str]) -> None:
    for name, minimum in _AT_LEAST.items():
        value = int(properties[name])
        if value < minimum:
            raise InvalidConfig(f"Invalid value {value} for configuration {name}: Value must be "
                                f"at least {minimum}")


def _check_scrub_rate(properties: Mapping[str, str]) -> None:
    name = "log.scrub.io.max.bytes.per.second"
    if not float(properties[name]) > 0:
        raise InvalidConfig(f"Invalid value {properties[name]} for configuration {name}: "
                            "Value must be above 0")


def _validate_cluster_mode(properties: Mapping[str, str]) -> None:
    """KafkaConfig's checks of a ZooKeeper-mode broker: the connect string parses, the
    timeouts are positive, and broker.id lies in [-1, reserved.broker.max.id]."""
    parse_zookeeper_connect(properties["zookeeper.connect"])
    for name in ("zookeeper.session.timeout.ms", "zookeeper.connection.timeout.ms"):
        if name in properties and int(properties[name]) <= 0:
            raise InvalidConfig(f"Invalid value {properties[name]} for configuration {name}: "
                                "Value must be at least 1")
    if int(properties["replica.fetch.wait.max.ms"]) > int(properties["replica.socket.timeout.ms"]):
        raise InvalidConfig("replica.socket.timeout.ms should always be at least "
                            "replica.fetch.wait.max.ms to prevent unnecessary socket timeouts")
    broker_id = int(properties["broker.id"])
    if not -1 <= broker_id <= int(properties["reserved.broker.max.id"]):
        raise InvalidConfig("broker.id must be greater than or equal to -1 and not greater "
                            "than reserved.broker.max.id")


def _validate_cleaner(properties: Mapping[str, str]) -> None:
    problem = _cleaner_buffer_problem(properties)
    if problem is not None:
        raise InvalidConfig(problem)


def validate_cleaner_reconfiguration(current: Mapping[str, str],
                                     new: Mapping[str, str]) -> None:
    """Kafka's ``LogCleaner.validateReconfiguration`` plus the buffer checks, for a dynamic
    change of the cleaner settings: InvalidRequest naming the first problem."""
    threads = int(new["log.cleaner.threads"])
    current_threads = int(current["log.cleaner.threads"])
    if threads < 1:
        raise InvalidRequest("Log cleaner threads should be at least 1")
    if threads < current_threads // 2:
        raise InvalidRequest("Log cleaner threads cannot be reduced to less than half the "
                             f"current value {current_threads}")
    if threads > current_threads * 2:
        raise InvalidRequest("Log cleaner threads cannot be increased to more than double the "
                             f"current value {current_threads}")
    problem = _cleaner_buffer_problem(new)
    if problem is not None:
        raise InvalidRequest(problem)
