"""Seeded request frames for the wire fuzzer: valid requests of every advertised API key
and version, then mutated where the structure is.

``valid_request(rng, api_key, api_version)`` fills kio's request entity for that version
with random plain values (small counts, a pool of topic and group names, real record
batches in ``records`` fields, boundary integers now and then), builds it with
``wire.build`` and encodes it field by field with kio's own field writers, recording a
``Span`` for every field: its byte range and what it is --

* ``count``: an array's item count (int32, or unsigned varint N+1 when flexible),
* ``length``: a string's or bytes' length prefix (int16/int32, or unsigned varint N+1),
* ``tagged``: a struct's tagged-field section (count, then tag/size/data; always empty as
  generated), with the tags the struct knows,
* ``int``: a fixed-width integer, ``value``: any other primitive.

The header (api key, api version, correlation id, client id length) has spans too.
``mutate(rng, request)`` applies one to three mutations (the spans place the first; later
ones land anywhere): counts and lengths replaced by
boundary values (-2, -1, 0, N+1, 2**31-1, 2**32-1 as a varint...), varints overlong or
unterminated, tagged sections replaced by unknown, duplicate, oversized or truncated tags,
truncation (at a field boundary or anywhere), appended bytes, bit flips, boundary bytes,
header fields (unknown key, unsupported or negative version, client id length past the
frame). The frame's int32 length is recomputed unless a mutation targets it.

Everything is a pure function of ``random.Random(f"{seed}:{case}")`` (``case_frame``), so
a failing case is rebuilt from (seed, case index). Thread-safe: no shared state besides
caches of immutable values.
"""

from __future__ import annotations

import io
import random
import struct
import uuid
from dataclasses import dataclass, fields
from functools import cache

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)
from kio.serial._serialize import get_field_writer

from headrace.broker.handlers import HANDLERS
from headrace.protocol import wire
from headrace.protocol.records import build_batch
from headrace.protocol.varint import encode_unsigned, read_unsigned
from tests.fuzz.recording_proxy import load_client_requests

FRAME_LENGTH_BYTES = 4
UVARINT_MASK = (1 << 64) - 1
MAX_ARRAY_ITEMS = 3
RECORDED_SHARE = 0.25  # of cases that start from a request a real client sent
CLIENT_ID = "fuzz"
TOPIC_NAMES = ("fuzz-a", "fuzz-b", "__consumer_offsets", "")
GROUP_IDS = ("fuzz-group", "")
INT_WIDTHS = {"int8": 1, "int16": 2, "int32": 4, "int64": 8, "uint16": 2, "uint32": 4,
              "uint64": 8, "error_code": 2, "timedelta_i32": 4, "timedelta_i64": 8,
              "datetime_i64": 8}
NAMED_FIELDS = {"topic": TOPIC_NAMES, "name": TOPIC_NAMES, "group": GROUP_IDS,
                "member": ("", "fuzz-member")}
# counts and lengths tried in place of the real one (besides N-1, N+1 and N*1000)
BOUNDARY_COUNTS = (-2, -1, 0, 2**15 - 1, 2**31 - 1, 2**32 - 1, 2**32, 2**35)


@dataclass(frozen=True, slots=True)
class Span:
    kind: str  # count, length, tagged, int, value (body); api_key, api_version, ... (header)
    start: int  # byte positions in the frame, length prefix included
    end: int
    flexible: bool = False  # counts and lengths are unsigned varints N+1
    known_tags: tuple[int, ...] = ()  # tagged: the tags this struct defines
    prefix_end: int = 0  # count, length: where the prefix ends (the items or bytes follow)


@dataclass(frozen=True, slots=True)
class WireRequest:
    api_key: int
    api_version: int
    frame: bytes  # int32 length prefix included
    spans: tuple[Span, ...]


@dataclass(frozen=True, slots=True)
class FuzzCase:
    seed: int
    index: int
    api_key: int
    api_version: int
    mutations: tuple[str, ...]
    frame: bytes
    length_matches: bool  # the frame's int32 length is the number of bytes after it


def advertised_versions() -> list[tuple[int, int]]:
    """Every (api key, version) the broker's handler table implements and kio has a schema
    for (the hand-coded old versions, ``wire.HAND_CODED_VERSIONS``, have none to generate
    from; tests/protocol/test_wire.py truncates and mutates them)."""
    return [(key, version) for key, handler in HANDLERS.items()
            for version in range(handler.min_version, handler.max_version + 1)
            if version not in wire.HAND_CODED_VERSIONS.get(key, ())]


# ----------------------------------------------------------------- valid requests


@cache
def _record_batches() -> tuple[bytes, ...]:
    plain = build_batch([(b"k", b"v", [("h", b"x")], 1_700_000_000_000),
                         (None, b"w" * 40, [], 1_700_000_000_001)])
    idempotent = build_batch([(b"k", b"v", [], 1_700_000_000_000)], producer_id=1,
                             producer_epoch=0, base_sequence=0)
    compressed = build_batch([(b"a", b"b" * 100, [], 1_700_000_000_000)] * 3, compression=1)
    return plain, idempotent, compressed, plain + plain


def _random_int(rng: random.Random, name: str, kafka_type: str) -> int:
    if "time" in kafka_type or "timeout" in name or "wait" in name or "time" in name:
        return rng.randrange(-1, 200)  # a long poll or rebalance must not stall the case
    if rng.random() < 0.1:
        bits = 8 * INT_WIDTHS.get(kafka_type, 4) - 1
        return rng.choice((-1, 0, 1, 2**bits - 1, -(2**bits)))
    return rng.choice((0, 0, 1, 2, 3, -1))


def _random_string(rng: random.Random, name: str) -> str:
    for part, pool in NAMED_FIELDS.items():
        if part in name and rng.random() < 0.8:
            return rng.choice(pool)
    return "".join(rng.choice("abcxyz-._é") for _ in range(rng.randrange(0, 12)))


def _random_primitive(rng: random.Random, field) -> object:
    kafka_type = get_schema_field_type(field)
    name = field.name
    if kafka_type == "string":
        return _random_string(rng, name)
    if kafka_type in ("bytes", "records"):
        return rng.choice(_record_batches()) if kafka_type == "records" else rng.randbytes(
            rng.randrange(0, 16))
    if kafka_type == "bool":
        return rng.random() < 0.5
    if kafka_type == "uuid":
        return uuid.UUID(int=rng.choice((0, 1, rng.getrandbits(128))))
    if kafka_type == "float64":
        return rng.choice((0.0, 1.5, -1.0))
    if kafka_type == "uint16":
        return rng.randrange(0, 3)
    return _random_int(rng, name, kafka_type)


def _random_values(rng: random.Random, entity_class: type) -> dict:
    values: dict = {}
    for field in fields(entity_class):
        if get_field_tag(field) is not None:
            continue  # tagged fields keep their defaults: generated sections are empty
        if is_optional(field) and rng.random() < 0.15:
            values[field.name] = None
            continue
        kind = classify_field(field)
        if isinstance(kind, EntityTupleField):
            values[field.name] = [_random_values(rng, kind.type_)
                                  for _ in range(rng.randrange(0, MAX_ARRAY_ITEMS + 1))]
        elif isinstance(kind, EntityField):
            values[field.name] = _random_values(rng, kind.type_)
        elif isinstance(kind, PrimitiveTupleField):
            values[field.name] = [_random_primitive(rng, field)
                                  for _ in range(rng.randrange(0, MAX_ARRAY_ITEMS + 1))]
        else:
            values[field.name] = _random_primitive(rng, field)
    return values


class _SpanWriter:
    """Encodes an entity field by field with kio's writers, noting each field's span."""

    def __init__(self, buffer: io.BytesIO, base: int) -> None:
        self.buffer = buffer
        self.base = base  # frame position of the buffer's first byte
        self.spans: list[Span] = []

    def position(self) -> int:
        return self.base + self.buffer.tell()

    def entity(self, entity, flexible: bool) -> None:
        known_tags = []
        for field in fields(type(entity)):
            tag = get_field_tag(field)
            if tag is not None:
                known_tags.append(tag)
                continue
            self.field(field, getattr(entity, field.name), flexible)
        if flexible:
            start = self.position()
            self.buffer.write(b"\x00")
            self.spans.append(Span("tagged", start, self.position(), True, tuple(known_tags)))

    def field(self, field, value, flexible: bool) -> None:
        kind = classify_field(field)
        start = self.position()
        if isinstance(kind, EntityTupleField):
            self._prefix(-1 if value is None else len(value), flexible, 4, "count")
            for item in value or ():
                self.entity(item, flexible)
            return
        if isinstance(kind, EntityField):
            if is_optional(field):
                self.buffer.write(b"\xff" if value is None else b"\x01")
                if value is None:
                    return
            self.entity(value, flexible)
            return
        get_field_writer(field, flexible, False, False)(self.buffer, value)
        end = self.position()
        kafka_type = get_schema_field_type(field)
        if isinstance(kind, PrimitiveTupleField):
            self.spans.append(Span("count", start, end, flexible,
                                   prefix_end=self._prefix_end(start, flexible, 4)))
        elif kafka_type in ("string", "bytes", "records"):
            legacy_width = 2 if kafka_type == "string" else 4
            self.spans.append(Span("length", start, end, flexible,
                                   prefix_end=self._prefix_end(start, flexible, legacy_width)))
        elif kafka_type in INT_WIDTHS and value is not None:
            self.spans.append(Span("int", start, end))
        else:
            self.spans.append(Span("value", start, end))

    def _prefix(self, count: int, flexible: bool, legacy_width: int, kind: str) -> None:
        start = self.position()
        if flexible:
            self.buffer.write(_uvarint(count + 1))
        else:
            self.buffer.write(struct.pack(">i" if legacy_width == 4 else ">h", count))
        self.spans.append(Span(kind, start, self.position(), flexible,
                               prefix_end=self.position()))

    def _prefix_end(self, start: int, flexible: bool, legacy_width: int) -> int:
        if not flexible:
            return start + legacy_width
        _, end = read_unsigned(self.buffer.getvalue(), start - self.base)
        return end + self.base


def _uvarint(value: int) -> bytes:
    """An unsigned varint; a negative value as its 64-bit two's complement (10 bytes)."""
    return encode_unsigned(value & UVARINT_MASK)


def _header(api_key: int, api_version: int, correlation_id: int,
            flexible: bool) -> tuple[bytes, list[Span]]:
    client_id = CLIENT_ID.encode()
    header = struct.pack(">hhih", api_key, api_version, correlation_id, len(client_id))
    header += client_id + (b"\x00" if flexible else b"")
    return header, _header_spans(header, flexible)


def _header_spans(header: bytes, flexible: bool) -> list[Span]:
    base = FRAME_LENGTH_BYTES
    spans = [Span("api_key", base, base + 2), Span("api_version", base + 2, base + 4),
             Span("correlation_id", base + 4, base + 8),
             Span("client_id_length", base + 8, base + 10)]
    if flexible:
        (client_id_length,) = struct.unpack_from(">h", header, 8)
        tagged_start = base + 10 + max(client_id_length, 0)
        spans.append(Span("tagged", tagged_start, base + len(header), True))
    return spans


def valid_request(rng: random.Random, api_key: int, api_version: int,
                  correlation_id: int = 1) -> WireRequest:
    """A well-formed request of this key and version with random values."""
    request_class = wire.request_class(api_key, api_version)
    entity = wire.build(request_class, _random_values(rng, request_class))
    flexible = request_class.__flexible__
    header, spans = _header(api_key, api_version, correlation_id, flexible)
    return _with_body(api_key, api_version, header, spans, entity)


def _with_body(api_key: int, api_version: int, header: bytes, header_spans: list[Span],
               entity) -> WireRequest:
    buffer = io.BytesIO()
    writer = _SpanWriter(buffer, FRAME_LENGTH_BYTES + len(header))
    writer.entity(entity, entity.__flexible__)
    payload = header + buffer.getvalue()
    frame = struct.pack(">i", len(payload)) + payload
    return WireRequest(api_key, api_version, frame, tuple(header_spans + writer.spans))


def recorded_request(frame: bytes) -> WireRequest | None:
    """A frame a real client sent (``recording_proxy``) with the spans of its fields: its
    body decoded with kio and written again by the span writer. A body that does not come
    out the same (tagged fields with values, trailing bytes) keeps only its header's spans;
    a frame of a key or version the broker does not implement gives None."""
    payload = frame[FRAME_LENGTH_BYTES:]
    header, position = wire.parse_request_header(payload)
    if (header.api_key, header.api_version) not in set(advertised_versions()):
        return None
    body_class = wire.request_class(header.api_key, header.api_version)
    if body_class.__flexible__:
        position = wire.skip_tagged_fields(payload, position)
    header_bytes = payload[:position]
    header_spans = _header_spans(header_bytes, body_class.__flexible__)
    entity, _ = wire.read_entity(body_class, payload, position)
    request = _with_body(header.api_key, header.api_version, header_bytes, header_spans, entity)
    if request.frame == frame:
        return request
    return WireRequest(header.api_key, header.api_version, frame, tuple(header_spans))


@cache
def _recorded_requests() -> tuple[WireRequest, ...]:
    requests = (recorded_request(frame) for frame in load_client_requests())
    return tuple(request for request in requests if request is not None)


def kio_encoding(api_key: int, api_version: int, frame: bytes) -> bytes:
    """The same request re-encoded by kio (``wire.encode_request``): a cross-check that the
    span writer writes exactly what kio writes."""
    payload = frame[FRAME_LENGTH_BYTES:]
    header, position = wire.parse_request_header(payload)
    body_class = wire.request_class(api_key, api_version)
    if body_class.__flexible__:
        position = wire.skip_tagged_fields(payload, position)
    body, _ = wire.read_entity(body_class, payload, position)
    return wire.encode_request(api_key, api_version, header.correlation_id, CLIENT_ID, body)


# ----------------------------------------------------------------- mutations


def _prefix_bytes(span: Span, value: int) -> bytes:
    if span.flexible:
        return _uvarint(value + 1)
    if span.prefix_end - span.start == 2:
        return struct.pack(">h", max(-(2**15), min(2**15 - 1, value)))
    return struct.pack(">i", max(-(2**31), min(2**31 - 1, value)))


def _current_prefix(frame: bytes, span: Span) -> int:
    if span.flexible:
        return read_unsigned(frame, span.start)[0] - 1
    fmt = ">h" if span.prefix_end - span.start == 2 else ">i"
    return struct.unpack_from(fmt, frame, span.start)[0]


def _prefix_at(rng: random.Random, frame: bytes, span: Span) -> bytes:
    """A count or length prefix with a boundary value (only the prefix, not the field)."""
    current = _current_prefix(frame, span)
    value = rng.choice((*BOUNDARY_COUNTS, current - 1, current + 1, current * 1000 + 7))
    if span.flexible and rng.random() < 0.2:
        replaced = _overlong_uvarint(rng, value + 1)
    else:
        replaced = _prefix_bytes(span, value)
    return frame[:span.start] + replaced + frame[span.prefix_end:]


def _overlong_uvarint(rng: random.Random, value: int) -> bytes:
    encoded = bytearray(_uvarint(value))
    encoded[-1] |= 0x80
    padding = [0x80] * rng.randrange(1, 6)
    if rng.random() < 0.5:
        return bytes(encoded) + bytes(padding) + b"\x00"  # overlong but terminated
    return bytes(encoded) + bytes(padding)  # never terminated: runs into the next field


def _tagged_section(rng: random.Random, span: Span) -> bytes:
    """A replacement tagged-field section: unknown or known tags, sizes that lie."""
    choice = rng.randrange(6)
    tags = list(span.known_tags) or [0]
    if choice == 0:  # an unknown tag with some data
        tag = rng.choice((7, 99, 2**31 - 1, 2**32 + 5))
        data = rng.randbytes(rng.randrange(0, 9))
        return _uvarint(1) + _uvarint(tag) + _uvarint(len(data)) + data
    if choice == 1:  # a known tag with garbage in it
        data = rng.randbytes(rng.randrange(0, 9))
        return _uvarint(1) + _uvarint(rng.choice(tags)) + _uvarint(len(data)) + data
    if choice == 2:  # the same tag twice, out of order
        data = rng.randbytes(2)
        return _uvarint(2) + (_uvarint(rng.choice(tags)) + _uvarint(2) + data) * 2
    if choice == 3:  # a size past the frame
        return _uvarint(1) + _uvarint(rng.choice(tags)) + _uvarint(rng.choice(
            (2**20, 2**31 - 1, 2**32 - 1, 2**40))) + b"\x00"
    if choice == 4:  # a huge tag count
        return _uvarint(rng.choice((2**31 - 1, 2**32 - 1, 1000)))
    return _overlong_uvarint(rng, 0)


def _mutate_once(rng: random.Random, request: WireRequest, frame: bytes) -> tuple[str, bytes]:
    """One mutation; the spans locate fields only while ``frame`` is the request's own."""
    spans = list(request.spans) if frame is request.frame else []
    if len(frame) <= FRAME_LENGTH_BYTES:
        return "append", frame + rng.randbytes(rng.randrange(1, 32))
    structural = [span for span in spans if span.kind in ("count", "length", "tagged")]
    choice = rng.random()
    if choice < 0.35 and structural:
        span = rng.choice(structural)
        if span.kind == "tagged":
            return "tagged", frame[:span.start] + _tagged_section(rng, span) + frame[span.end:]
        return span.kind, _prefix_at(rng, frame, span)
    if choice < 0.45 and spans:
        span = rng.choice([s for s in spans if s.kind == "int"] or spans)
        size = span.end - span.start
        value = rng.choice((-1, 0, 2**(8 * size - 1) - 1, -(2**(8 * size - 1))))
        return "int", frame[:span.start] + value.to_bytes(size, "big", signed=True) + frame[
            span.end:]
    if choice < 0.55 and len(frame) >= FRAME_LENGTH_BYTES + 10:
        return _mutate_header(rng, request, frame)
    if choice < 0.65:
        boundaries = sorted({span.start for span in spans} | {span.end for span in spans})
        cut = rng.choice(boundaries) if boundaries and rng.random() < 0.6 else rng.randrange(
            FRAME_LENGTH_BYTES, len(frame) + 1)
        return "truncate", frame[:cut]
    if choice < 0.72:
        return "append", frame + rng.randbytes(rng.randrange(1, 32))
    if choice < 0.85:
        out = bytearray(frame)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(FRAME_LENGTH_BYTES, len(out))
            out[at] ^= 1 << rng.randrange(8)
        return "bitflip", bytes(out)
    out = bytearray(frame)
    at = rng.randrange(FRAME_LENGTH_BYTES, len(out))
    out[at] = rng.choice((0x00, 0x7F, 0x80, 0xFF))
    return "byte", bytes(out)


def _mutate_header(rng: random.Random, request: WireRequest, frame: bytes) -> tuple[str, bytes]:
    choice = rng.randrange(4)
    base = FRAME_LENGTH_BYTES
    if choice == 0:
        key = rng.choice((-1, 7, 17, 67, 1000, 2**15 - 1, *HANDLERS))
        return "api_key", frame[:base] + struct.pack(">h", key) + frame[base + 2:]
    if choice == 1:
        handler = HANDLERS[request.api_key]
        version = rng.choice((-1, handler.max_version + 1, 2**15 - 1, handler.min_version - 1))
        return "api_version", frame[:base + 2] + struct.pack(">h", version) + frame[base + 4:]
    if choice == 2:
        length = rng.choice((-2, -1, 0, 2**15 - 1, len(frame)))
        return "client_id_length", frame[:base + 8] + struct.pack(">h", length) + frame[
            base + 10:]
    return "frame_length", struct.pack(">i", rng.choice(
        (0, 1, 9, len(frame) - FRAME_LENGTH_BYTES - 1, -1, -(2**31)))) + frame[base:]


def mutate(rng: random.Random, request: WireRequest) -> tuple[tuple[str, ...], bytes, bool]:
    """(mutation names, the mutated frame, whether its int32 length still matches)."""
    frame, names = request.frame, []
    for _ in range(rng.randrange(1, 4)):
        name, frame = _mutate_once(rng, request, frame)
        names.append(name)
    if "frame_length" in names:
        (declared,) = struct.unpack_from(">i", frame)
        return tuple(names), frame, declared == len(frame) - FRAME_LENGTH_BYTES
    frame = struct.pack(">i", len(frame) - FRAME_LENGTH_BYTES) + frame[FRAME_LENGTH_BYTES:]
    return tuple(names), frame, True


def case_frame(seed: int, index: int, correlation_id: int = 1) -> FuzzCase:
    """Case ``index`` of the campaign seeded ``seed``: a generated request, or one in
    ``1 / RECORDED_SHARE`` a request a real client sent (``client_requests.txt``); one in
    eight is sent unmutated."""
    rng = random.Random(f"{seed}:{index}")
    if _recorded_requests() and rng.random() < RECORDED_SHARE:
        request = rng.choice(_recorded_requests())
    else:
        api_key, api_version = rng.choice(advertised_versions())
        request = valid_request(rng, api_key, api_version, correlation_id)
    api_key, api_version = request.api_key, request.api_version
    if rng.random() < 0.125:
        return FuzzCase(seed, index, api_key, api_version, (), request.frame, True)
    names, frame, matches = mutate(rng, request)
    return FuzzCase(seed, index, api_key, api_version, names, frame, matches)

