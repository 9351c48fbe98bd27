"""Broker configuration: Kafka's broker config names and defaults, their sources, dynamic updates.

Owns ``BrokerConfig``. Values are resolved in Kafka's precedence order, lowest first:

1. defaults (``DEFAULT_CONFIG``, source code 5) -- Kafka's, except ``listeners``
   (127.0.0.1:9092), ``log.dir`` (./data) and ``node.id`` (1), which suit a single-node broker;
2. a server.properties file, then environment variables ``HEADRACE_<NAME>`` (``log.dirs`` ->
   ``HEADRACE_LOG_DIRS``), then ``--override key=value`` (``STATIC_BROKER_CONFIG``, 4);
3. dynamic broker configs set through AlterConfigs (``DYNAMIC_BROKER_CONFIG``, 1), persisted
   as Java properties in ``<first log dir>/dynamic-broker.properties`` and re-applied at start.

Only the configs marked dynamic (every ``log.*`` default a topic config falls back to,
``message.max.bytes``, ``compression.type``, ``min.insync.replicas``, the cleaner settings)
may be altered; others are read-only and AlterConfigs gets InvalidConfig. Listeners registered
with ``add_change_listener`` receive the effective properties after each dynamic change (the
broker pushes them to ``LogManager.set_broker_defaults``, the cleaner restarts its threads).

Cleaner settings are checked as Kafka does. Always (a bad static value stops the broker,
InvalidConfig): the ConfigDef ranges (``log.cleaner.threads``, ``log.cleaner.io.buffer.size``,
``log.cleaner.backoff.ms`` >= 0), ``log.cleaner.dedupe.buffer.size / log.cleaner.threads``
above 1 MiB (KafkaConfig's ``require``) and a load factor in (0, 1] (the offset map's domain).
When AlterConfigs changes one of ``CLEANER_RECONFIGURABLE_CONFIGS``, also
``LogCleaner.validateReconfiguration``: the new thread count is >= 1, not below half the current
one and not above double it; these and the buffer checks answer INVALID_REQUEST, as Kafka's
ConfigException in a dynamic update does.

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
from headrace.errors import InvalidConfig, InvalidRequest
from headrace.storage.config import (
    TOPIC_CONFIGS,
    LogConfig,
    format_properties_text,
    parse_properties_text,
)

log = logging.getLogger(__name__)

DYNAMIC_BROKER_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
DYNAMIC_CONFIG_FILE = "dynamic-broker.properties"
ENV_PREFIX = "HEADRACE_"
INT_MAX = 2**31 - 1
LONG_MAX = 2**63 - 1
DEFAULT_QUEUED_MAX_REQUEST_BYTES = 512 * 1024 * 1024  # Kafka's is -1; see _SERVER_DEFS
MIN_DEDUPE_BUFFER_BYTES_PER_THREAD = 1024 * 1024  # KafkaConfig: "at least 1MB per cleaner thread"
CLEANER_RECONFIGURABLE_CONFIGS = frozenset({  # LogCleaner.ReconfigurableConfigs
    "log.cleaner.threads", "log.cleaner.dedupe.buffer.size", "log.cleaner.io.buffer.load.factor",
    "log.cleaner.io.buffer.size", "log.cleaner.io.max.bytes.per.second", "log.cleaner.backoff.ms",
})
_AT_LEAST_ZERO = ("log.cleaner.threads", "log.cleaner.io.buffer.size", "log.cleaner.backoff.ms",
                  "max.connections", "max.connections.per.ip")


@dataclass(frozen=True, slots=True)
class BrokerConfigDef:
    """One broker config: name, type ("int", "long", "boolean", "string", "list", "double"),
    default as text (None: no default), and whether AlterConfigs may change it."""

    name: str
    type: str
    default: str | None
    dynamic: bool = False
    sensitive: bool = False


@dataclass(frozen=True, slots=True)
class ConfigEntry:
    name: str
    value: str | None
    source: int
    read_only: bool
    sensitive: bool


def _static(name: str, type_: str, default: str | None) -> BrokerConfigDef:
    return BrokerConfigDef(name, type_, default)


def _dynamic(name: str, type_: str, default: str | None) -> BrokerConfigDef:
    return BrokerConfigDef(name, type_, default, dynamic=True)


_SERVER_DEFS = (
    _static("listeners", "list", "PLAINTEXT://127.0.0.1:9092"),
    _static("advertised.listeners", "list", None),
    _static("node.id", "int", "1"),
    _static("broker.id", "int", None),
    _static("log.dirs", "list", None),
    _static("log.dir", "string", "./data"),
    _static("num.partitions", "int", "1"),
    _static("default.replication.factor", "int", "1"),
    _static("auto.create.topics.enable", "boolean", "true"),
    _static("delete.topic.enable", "boolean", "true"),
    _static("socket.request.max.bytes", "int", "104857600"),
    _static("connections.max.idle.ms", "long", "600000"),
    # Kafka's default is -1 (unbounded): Kafka reads one request per connection at a time,
    # headrace pipelines up to 64 per connection, so without a bound a few connections could
    # hold 64 maximum-size requests each. 512 MiB lets five maximum-size (100 MiB) requests
    # be received at once; -1 still means unbounded.
    _static("queued.max.request.bytes", "long", str(DEFAULT_QUEUED_MAX_REQUEST_BYTES)),
    _dynamic("max.connections", "int", str(INT_MAX)),
    _dynamic("max.connections.per.ip", "int", str(INT_MAX)),
    _dynamic("max.connections.per.ip.overrides", "string", ""),
    _static("log.retention.check.interval.ms", "long", "300000"),
    _static("log.flush.scheduler.interval.ms", "long", str(LONG_MAX)),
    _static("log.flush.offset.checkpoint.interval.ms", "int", "60000"),
    _dynamic("log.cleaner.enable", "boolean", "true"),
    _dynamic("log.cleaner.threads", "int", "1"),
    _dynamic("log.cleaner.backoff.ms", "long", "15000"),
    _dynamic("log.cleaner.dedupe.buffer.size", "long", "134217728"),
    _dynamic("log.cleaner.io.buffer.size", "int", "524288"),
    _dynamic("log.cleaner.io.buffer.load.factor", "double", "0.9"),
    _dynamic("log.cleaner.io.max.bytes.per.second", "double", "1.7976931348623157E308"),
    _static("offset.metadata.max.bytes", "int", "4096"),
    _static("group.initial.rebalance.delay.ms", "int", "3000"),
    _static("group.min.session.timeout.ms", "int", "6000"),
    _static("group.max.session.timeout.ms", "int", "1800000"),
    _static("group.max.size", "int", str(INT_MAX)),
    _static("offsets.topic.num.partitions", "int", "50"),
    _static("offsets.topic.replication.factor", "int", "3"),
    _static("offsets.topic.segment.bytes", "int", "104857600"),
    _static("offsets.retention.minutes", "int", "10080"),
    _static("offsets.retention.check.interval.ms", "long", "600000"),
    _static("offsets.commit.timeout.ms", "int", "5000"),
    _static("offsets.load.buffer.size", "int", "5242880"),
)

# Broker synonyms of topic configs that have no default of their own in Kafka
# (a coarser-unit synonym that only applies when set, e.g. log.retention.minutes).
_SYNONYM_DEFAULTS = {"log.roll.hours": "168", "log.retention.hours": "168", "log.roll.jitter.hours": "0"}


def _log_defs() -> tuple[BrokerConfigDef, ...]:
    """The broker-level defaults of every topic config (log.retention.ms, message.max.bytes...)."""
    defs: dict[str, BrokerConfigDef] = {}
    for topic_def in TOPIC_CONFIGS.values():
        for position, (broker_key, _multiplier) in enumerate(topic_def.broker_synonyms):
            if broker_key in defs:
                continue
            if position == 0 and broker_key not in ("log.roll.ms", "log.retention.ms",
                                                    "log.roll.jitter.ms"):
                default = _format(topic_def.default)
            else:
                default = _SYNONYM_DEFAULTS.get(broker_key)
            defs[broker_key] = _dynamic(broker_key, topic_def.type, default)
    return tuple(defs.values())


def _format(value: object) -> str:
    if isinstance(value, tuple):
        return ",".join(value)
    return str(value)


BROKER_CONFIGS: Mapping[str, BrokerConfigDef] = MappingProxyType(
    {d.name: d for d in (*_SERVER_DEFS, *_log_defs())}
)


def env_name(config_name: str) -> str:
    """``log.dirs`` -> ``HEADRACE_LOG_DIRS``."""
    return ENV_PREFIX + config_name.upper().replace(".", "_").replace("-", "_")


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
        self._dynamic: dict[str, str] = {}
        self._lock = threading.Lock()
        self._change_lock = threading.Lock()  # a whole alter_dynamic; taken before ``_lock``
        self._listeners: list[Callable[[dict[str, str]], None]] = []
        for key in self._static:
            if key not in BROKER_CONFIGS and key not in TOPIC_CONFIGS:
                log.warning("unknown broker config %s ignored", key)
        self._validate(self._effective(self._static, {}))
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
            static.update(parse_properties_text(Path(properties_file).read_text()))
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
        value = self._dynamic.get(name)
        if value is None:
            value = self._static.get(name)
        if value is None:
            definition = BROKER_CONFIGS.get(name)
            value = definition.default if definition else None
        return value

    def get_int(self, name: str) -> int:
        value = self.get(name)
        if value is None:
            raise InvalidConfig(f"configuration {name} has no value")
        return int(value)

    def get_bool(self, name: str) -> bool:
        return (self.get(name) or "").strip().lower() == "true"

    def properties(self) -> dict[str, str]:
        """Every config that has a value, effective (dynamic over static over default)."""
        return self._effective(self._static, self._dynamic)

    def describe(self) -> list[ConfigEntry]:
        entries = []
        for name, definition in sorted(BROKER_CONFIGS.items()):
            if name in self._dynamic:
                source = DYNAMIC_BROKER_CONFIG
            elif name in self._static:
                source = STATIC_BROKER_CONFIG
            else:
                source = DEFAULT_CONFIG
            entries.append(ConfigEntry(name, self.get(name), source, not definition.dynamic,
                                       definition.sensitive))
        return entries

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

    def alter_dynamic(self, changes: Mapping[str, str | None], validate_only: bool) -> None:
        """Set (value) or remove (None) dynamic broker configs, atomically. InvalidConfig for
        an unknown or read-only name or a bad value; nothing is applied then. Listeners are
        called after the change is persisted, in the order of the changes."""
        with self._change_lock:
            self._alter_dynamic_locked(changes, validate_only)

    def _alter_dynamic_locked(self, changes: Mapping[str, str | None],
                              validate_only: bool) -> None:
        with self._lock:
            updated = dict(self._dynamic)
            for name, value in changes.items():
                definition = BROKER_CONFIGS.get(name)
                if definition is None:
                    raise InvalidConfig(f"Unknown broker config name: {name}")
                if not definition.dynamic:
                    raise InvalidConfig(f"Cannot update these configs dynamically: {{{name}}}")
                if value is None:
                    updated.pop(name, None)
                else:
                    updated[name] = value.strip()
            effective = self._effective(self._static, updated)
            if CLEANER_RECONFIGURABLE_CONFIGS & set(changes):
                current = self._effective(self._static, self._dynamic)
                for name in CLEANER_RECONFIGURABLE_CONFIGS:
                    _check_type(BROKER_CONFIGS[name], effective[name])
                validate_cleaner_reconfiguration(current, effective)
            self._validate(effective)
            if validate_only:
                return
            self._persist(updated)
            self._dynamic = updated
        for callback in self._listeners:
            callback(effective)

    def _load_dynamic(self) -> None:
        path = self._dynamic_path()
        if not path.exists():
            return
        stored = parse_properties_text(path.read_text())
        known = {k: v for k, v in stored.items() if k in BROKER_CONFIGS and BROKER_CONFIGS[k].dynamic}
        try:
            self._validate(self._effective(self._static, known))
        except InvalidConfig as error:
            log.error("ignoring invalid %s: %s", path, error)
            return
        self._dynamic = known

    def _persist(self, dynamic: Mapping[str, str]) -> None:
        path = self._dynamic_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary = path.with_suffix(".tmp")
        with open(temporary, "w") as file:
            file.write(format_properties_text(dynamic))
            file.flush()
            os.fsync(file.fileno())
        os.replace(temporary, path)

    def _dynamic_path(self) -> Path:
        return self.log_dirs[0] / DYNAMIC_CONFIG_FILE

    @staticmethod
    def _effective(static: Mapping[str, str], dynamic: Mapping[str, str]) -> dict[str, str]:
        merged = {name: d.default for name, d in BROKER_CONFIGS.items() if d.default is not None}
        merged.update(static)
        merged.update(dynamic)
        return merged

    @staticmethod
    def _validate(properties: Mapping[str, str]) -> None:
        for name, value in properties.items():
            definition = BROKER_CONFIGS.get(name)
            if definition is not None:
                _check_type(definition, value)
        _check_at_least_zero(properties)
        _validate_cleaner(properties)
        overrides = parse_per_ip_overrides(properties.get("max.connections.per.ip.overrides") or "")
        if int(properties["max.connections.per.ip"]) == 0 and not overrides:
            raise InvalidConfig("max.connections.per.ip can be set to zero only if "
                                "max.connections.per.ip.overrides property is set.")
        LogConfig.from_properties({}, dict(properties))
        parse_listener((properties.get("listeners") or "").split(",")[0])


def _check_type(definition: BrokerConfigDef, value: str) -> None:
    text = value.strip()
    if definition.type in ("int", "long"):
        try:
            int(text)
        except ValueError:
            raise InvalidConfig(
                f"Invalid value {value} for configuration {definition.name}: "
                f"Not a number of type {definition.type.upper()}"
            ) from None
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


def _check_at_least_zero(properties: Mapping[str, str]) -> None:
    for name in _AT_LEAST_ZERO:
        value = int(properties[name])
        if value < 0:
            raise InvalidConfig(f"Invalid value {value} for configuration {name}: Value must be "
                                "at least 0")


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
