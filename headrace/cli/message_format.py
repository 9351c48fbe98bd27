"""kcat-style output format strings for consumed records (``headrace consume --format``).

Fields: ``%t`` topic, ``%p`` partition, ``%o`` offset, ``%k`` key, ``%s`` value, ``%T``
timestamp in ms (-1 when the record has none), ``%h`` headers as ``k=v,k2=v2``, ``%K`` key
length and ``%S`` value length in bytes (-1 for null), ``%%`` a percent sign. Escapes: ``\\n``
newline, ``\\t`` tab, ``\\r`` carriage return, ``\\\\`` backslash. A null key or value prints
as nothing (as kcat does). Keys and values are written as raw bytes, never re-encoded.

``JSON_LINES`` (``headrace consume --output json``) renders each record as one JSON object
on its own line: ``topic``, ``partition``, ``offset``, ``timestamp`` (ms, -1 when none),
``key`` and ``value`` (UTF-8 text, null when null; bytes that are not UTF-8 come as
``key_base64`` / ``value_base64`` instead) and ``headers`` (a list of ``[key, value]``, values
treated as ``value`` is).

A format is compiled once into a tuple of literal bytes and field codes; rendering is a join.
Pure functions and immutable objects; thread-safe.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from dataclasses import dataclass

from confluent_kafka import TIMESTAMP_NOT_AVAILABLE, Message

DEFAULT_FORMAT = "%s\\n"
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def _nullable_length(data: bytes | None) -> bytes:
    return b"-1" if data is None else str(len(data)).encode()


def _timestamp(message: Message) -> bytes:
    kind, timestamp_ms = message.timestamp()
    return b"-1" if kind == TIMESTAMP_NOT_AVAILABLE else str(timestamp_ms).encode()


def _headers(message: Message) -> bytes:
    pairs = message.headers() or []
    return b",".join(key.encode() + b"=" + (value or b"") for key, value in pairs)


_FIELDS: dict[str, Callable[[Message], bytes]] = {
    "t": lambda message: message.topic().encode(),
    "p": lambda message: str(message.partition()).encode(),
    "o": lambda message: str(message.offset()).encode(),
    "k": lambda message: message.key() or b"",
    "s": lambda message: message.value() or b"",
    "T": _timestamp,
    "h": _headers,
    "K": lambda message: _nullable_length(message.key()),
    "S": lambda message: _nullable_length(message.value()),
}


class FormatError(ValueError):
    """The format string uses an unknown ``%`` field or ends in a lone ``%`` or ``\\``."""


@dataclass(frozen=True, slots=True)
class MessageFormat:
    """A compiled format: literal byte strings and field renderers, in order."""

    parts: tuple[bytes | Callable[[Message], bytes], ...]

    def render(self, message: Message) -> bytes:
        return b"".join(part if isinstance(part, bytes) else part(message) for part in self.parts)


def _json_fields(name: str, data: bytes | None) -> dict[str, str | None]:
    if data is None:
        return {name: None}
    try:
        return {name: data.decode("utf-8")}
    except UnicodeDecodeError:
        return {f"{name}_base64": base64.b64encode(data).decode("ascii")}


def _json_header_value(data: bytes | None) -> str | None:
    return next(iter(_json_fields("value", data).values()))


def _json_line(message: Message) -> bytes:
    record = {"topic": message.topic(), "partition": message.partition(),
              "offset": message.offset(), "timestamp": int(_timestamp(message)),
              **_json_fields("key", message.key()), **_json_fields("value", message.value()),
              "headers": [[key, _json_header_value(value)]
                          for key, value in message.headers() or []]}
    return json.dumps(record).encode() + b"\n"


JSON_LINES = MessageFormat((_json_line,))


def compile_format(text: str) -> MessageFormat:
    """Compile a kcat-style format string; FormatError names the offending character."""
    parts: list[bytes | Callable[[Message], bytes]] = []
    literal: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char in "%\\":
            if index + 1 == len(text):
                raise FormatError(f"format ends with a lone {char!r}")
            code = text[index + 1]
            index += 2
            if char == "\\":
                literal.append(_ESCAPES.get(code, "\\" + code))
            elif code == "%":
                literal.append("%")
            elif code in _FIELDS:
                _flush_literal(parts, literal)
                parts.append(_FIELDS[code])
            else:
                raise FormatError(f"unknown format field %{code}")
            continue
        literal.append(char)
        index += 1
    _flush_literal(parts, literal)
    return MessageFormat(tuple(parts))


def _flush_literal(parts: list, literal: list[str]) -> None:
    if literal:
        parts.append("".join(literal).encode())
        literal.clear()


def shortcut_format(print_key: bool, print_offset: bool, print_partition: bool,
                    key_separator: str) -> str:
    """The format of the ``--print-*`` shortcuts, in the order of Kafka's console consumer:
    ``Partition:P<TAB>Offset:O<TAB>key<SEP>value``."""
    prefix = ""
    if print_partition:
        prefix += "Partition:%p\\t"
    if print_offset:
        prefix += "Offset:%o\\t"
    if print_key:
        prefix += "%k" + key_separator.replace("%", "%%")
    return prefix + DEFAULT_FORMAT
