"""Kafka records: build and decode v2 record batches, read legacy message sets.

Owns the record-level formats below the batch header (``batch.py`` owns the header).

v2 record (magic 2), inside a batch's records section, possibly compressed as a whole::

    length varint              (bytes after this field)
    attributes int8            (unused, 0)
    timestamp_delta varlong    (from the batch's base_timestamp)
    offset_delta varint        (from the batch's base_offset)
    key_length varint, key     (-1: null key)
    value_length varint, value (-1: null value)
    header_count varint, then per header:
        key_length varint, key (UTF-8, never null), value_length varint, value (-1: null)

varint/varlong are zigzag-encoded base-128 (protobuf style), at most 5/10 bytes, decoded by
``headrace.protocol.varint`` with Kafka's rule (bits beyond 32/64 in the last byte dropped),
as the kernel's ``read_record`` decodes them.

Legacy message set entry (magic 0 and 1)::

    offset int64, message_size int32, crc uint32 (CRC-32 of magic..end), magic int8,
    attributes int8 (bits 0-2 codec, bit 3 LogAppendTime in v1), [timestamp int64 in v1],
    key int32 length + bytes (-1 null), value int32 length + bytes (-1 null)

A compressed legacy message is a wrapper whose value is a compressed message set of
uncompressed inner messages. v1 inner offsets are relative: the wrapper's offset is the
absolute offset of the last inner message. v0 inner offsets are absolute.

Compressed sections on produce are never inflated whole: ``walk_records_section`` walks the
declared records over the section's chunks (``section_chunks``: ``compression.
iter_decompressed``, 1 MiB at a time, at most ``MAX_RECORDS_SECTION_BYTES``) as Kafka's
streaming record iterators do -- the records wholly inside a chunk in one kernel call
(``kernel.walk_records``), a record straddling two chunks here -- and refuses bytes after the
last declared record; produce validation (``storage.validation``, for a section too large
to inflate whole) and ``recompress_batch`` (which feeds the same chunks to a
``StreamCompressor``) use it. Readers
that need a whole section (``decode_batch``, legacy wrappers) get it from
``compression.decompress_section``.

Pure functions over bytes-like objects; thread-safe. Per-record loops are pure Python for
now; the compiled kernel will take over the hot ones with the same signatures.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from headrace.errors import (
    CorruptMessage,
    InvalidRecord,
    MessageTooLarge,
    UnsupportedCompressionType,
)
from headrace.protocol import compression as codecs
from headrace.protocol.batch import (
    ATTRIBUTES_OFFSET,
    BATCH_HEADER_BYTES,
    COMPRESSION_MASK,
    CONTROL_BIT,
    CRC_OFFSET,
    CURRENT_MAGIC,
    LOG_OVERHEAD_BYTES,
    NO_TIMESTAMP,
    TIMESTAMP_TYPE_BIT,
    TRANSACTIONAL_BIT,
    BatchHeader,
    crc_is_valid,
    parse_header,
    peek_magic,
)
from headrace.protocol.kernel import WALK_MALFORMED, crc32c, walk_records
from headrace.protocol.varint import VARINT_MAX_BYTES, VARLONG_MAX_BYTES, read_signed, write_signed

MAGIC_V0 = 0
MAGIC_V1 = 1
LEGACY_TIMESTAMP_TYPE_BIT = 0x08
LEGACY_V0_HEADER_BYTES = 6  # crc, magic, attributes
LEGACY_V1_HEADER_BYTES = 14  # crc, magic, attributes, timestamp
LEGACY_KEY_VALUE_LENGTHS_BYTES = 8
INT32_MAX = (1 << 31) - 1

_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_CRC_FIELD = struct.Struct(">I")
_LEGACY_ENTRY = struct.Struct(">qi")
_LEGACY_V0 = struct.Struct(">Ibb")
_LEGACY_V1 = struct.Struct(">Ibbq")
_INT32 = struct.Struct(">i")


@dataclass(frozen=True, slots=True)
class Header:
    """One record header: a UTF-8 key and a nullable byte value."""

    key: str
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Record:
    """One decoded record with its absolute offset and timestamp."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: tuple[Header, ...] = ()


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A decoded v2 batch: its fixed header and its records (absolute offsets)."""

    header: BatchHeader
    records: tuple[Record, ...]


# ---------------------------------------------------------------- building v2 batches


RecordInput = tuple[bytes | None, bytes | None, Sequence[Any], int] | Any


def _record_fields(item: RecordInput) -> tuple[bytes | None, bytes | None, Sequence[Any], int]:
    if isinstance(item, tuple):
        key, value, headers, timestamp_ms = item
        return key, value, headers, timestamp_ms
    return item.key, item.value, item.headers, item.timestamp_ms


def _header_fields(header: Header | tuple[str, bytes | None]) -> tuple[str, bytes | None]:
    if isinstance(header, Header):
        return header.key, header.value
    key, value = header
    return key, value


def _write_nullable_bytes(out: bytearray, data: bytes | None) -> None:
    if data is None:
        write_signed(out, -1)
        return
    write_signed(out, len(data))
    out += data


def _encode_record(
    out: bytearray,
    offset_delta: int,
    timestamp_delta: int,
    key: bytes | None,
    value: bytes | None,
    headers: Sequence[Any],
) -> None:
    body = bytearray(b"\x00")  # attributes
    write_signed(body, timestamp_delta)
    write_signed(body, offset_delta)
    _write_nullable_bytes(body, key)
    _write_nullable_bytes(body, value)
    write_signed(body, len(headers))
    for header in headers:
        header_key, header_value = _header_fields(header)
        encoded_key = header_key.encode()
        write_signed(body, len(encoded_key))
        body += encoded_key
        _write_nullable_bytes(body, header_value)
    write_signed(out, len(body))
    out += body


def _offset_deltas(items: Sequence[RecordInput], base_offset: int, keep_offsets: bool) -> list[int]:
    if not keep_offsets:
        return list(range(len(items)))
    deltas = [item.offset - base_offset for item in items]
    for previous, delta in zip([-1, *deltas], deltas, strict=False):
        if delta <= previous or delta > INT32_MAX:
            raise ValueError(f"record offsets must increase from base offset {base_offset}")
    return deltas


def build_batch(
    records: Sequence[RecordInput],
    *,
    base_offset: int = 0,
    compression: int = codecs.NONE,
    producer_id: int = -1,
    producer_epoch: int = -1,
    base_sequence: int = -1,
    transactional: bool = False,
    control: bool = False,
    log_append_time: bool = False,
    partition_leader_epoch: int = -1,
    keep_offsets: bool = False,
    last_offset_delta: int | None = None,
) -> bytes:
    """Encode one v2 record batch.

    ``records``: ``(key, value, headers, timestamp_ms)`` tuples or objects with those
    attributes (e.g. ``Record``); headers are ``Header``s or ``(str, bytes | None)`` pairs.
    Records get offsets ``base_offset + 0, 1, ...`` unless ``keep_offsets`` (records then
    carry ``.offset``, as when the cleaner rewrites a batch with gaps);
    ``last_offset_delta`` overrides the batch's last offset delta (it may lie past the last
    record after compaction). ``compression`` is the codec id (``compression.GZIP``...).
    base_timestamp is the first record's timestamp and
    max_timestamp the largest, as Kafka's producer writes them.
    """
    deltas = _offset_deltas(records, base_offset, keep_offsets)
    fields = [_record_fields(item) for item in records]
    timestamps = [timestamp_ms for *_, timestamp_ms in fields]
    base_timestamp = timestamps[0] if timestamps else NO_TIMESTAMP
    payload = bytearray()
    for delta, (key, value, headers, timestamp_ms) in zip(deltas, fields, strict=True):
        _encode_record(payload, delta, timestamp_ms - base_timestamp, key, value, headers)
    last_delta = deltas[-1] if deltas else 0
    if last_offset_delta is not None:
        if last_offset_delta < last_delta:
            raise ValueError(f"last_offset_delta {last_offset_delta} precedes a record")
        last_delta = last_offset_delta
    attributes = compression | (TIMESTAMP_TYPE_BIT if log_append_time else 0)
    attributes |= (TRANSACTIONAL_BIT if transactional else 0) | (CONTROL_BIT if control else 0)
    header_fields = (
        base_offset,
        partition_leader_epoch,
        attributes,
        last_delta,
        base_timestamp,
        max(timestamps, default=NO_TIMESTAMP),
        producer_id,
        producer_epoch,
        base_sequence,
        len(records),
    )
    return seal_batch(header_fields, codecs.compress(compression, payload))


def seal_batch(header_fields: tuple[int, ...], records_section: bytes) -> bytes:
    """Header + records section with batch_length, magic and the CRC-32C filled in.

    ``header_fields``: base_offset, partition_leader_epoch, attributes, last_offset_delta,
    base_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence, records_count.
    """
    base_offset, partition_leader_epoch, *rest = header_fields
    batch_length = BATCH_HEADER_BYTES - LOG_OVERHEAD_BYTES + len(records_section)
    fields = (base_offset, batch_length, partition_leader_epoch, CURRENT_MAGIC, 0, *rest)
    batch = bytearray(_BATCH_HEADER.pack(*fields))
    batch += records_section
    _CRC_FIELD.pack_into(batch, CRC_OFFSET, crc32c(memoryview(batch)[ATTRIBUTES_OFFSET:]))
    return bytes(batch)


# ---------------------------------------------------------------- decoding v2 batches


def decode_batch(buf: bytes | bytearray | memoryview, pos: int = 0) -> RecordBatch:
    """Decode the v2 batch at ``pos``: check its CRC, decompress, decode every record.

    Raises CorruptMessage on any malformation (truncation, CRC mismatch, bad varints,
    record count or offset deltas disagreeing with the header, trailing bytes), and
    UnsupportedCompressionType on codec ids 5-7.
    """
    header, section = _checked_records_section(buf, pos)
    return RecordBatch(header, tuple(_decode_records(section, header)))


def recompress_batch(buf: bytes | bytearray | memoryview, pos: int, codec: int,
                     max_batch_bytes: int | None = None) -> bytes:
    """The v2 batch at ``pos`` rebuilt with ``codec`` (Kafka's broker-side recompression
    for a topic's ``compression.type``): every header field kept -- offsets, timestamps,
    producer id/epoch/sequence, transactional, control and timestamp-type bits -- except the
    codec bits, the length and the CRC; the records section is the same bytes, recompressed.

    Streaming: the section is inflated chunk by chunk (``compression.iter_decompressed``,
    at most ``MAX_RECORDS_SECTION_BYTES``), each chunk fed to the new codec and its records
    walked as they arrive (``walk_records_section``, fields decoded), so what is held is one
    chunk and the output -- which raises ``MessageTooLarge`` as soon as the rebuilt batch
    passes ``max_batch_bytes`` (the topic's max.message.bytes; None: no limit). The input
    is checked as ``decode_batch`` checks it (CRC, decompression, the records), so a
    malformed batch raises rather than leaving with a fresh valid CRC."""
    codecs.codec_name(codec)  # UnsupportedCompressionType for an unknown codec id
    header, payload = _checked_payload(buf, pos)
    compressor = codecs.StreamCompressor(codec)
    parts: list[bytes] = []
    size_bytes = BATCH_HEADER_BYTES

    def keep(piece: bytes) -> None:
        nonlocal size_bytes
        size_bytes += len(piece)
        if max_batch_bytes is not None and size_bytes > max_batch_bytes:
            raise MessageTooLarge(f"batch recompressed to {codecs.CODEC_NAMES[codec]} passes "
                                  f"max.message.bytes {max_batch_bytes}")
        parts.append(piece)

    def fed_to_compressor(chunks: Iterator[bytes | bytearray]) -> Iterator[bytes | bytearray]:
        for chunk in chunks:
            keep(compressor.compress(chunk))
            yield chunk

    walk_records_section(header, fed_to_compressor(section_chunks(header, payload)),
                         decode_fields=True)
    keep(compressor.finish())
    attributes = (header.attributes & ~COMPRESSION_MASK) | codec
    header_fields = (
        header.base_offset,
        header.partition_leader_epoch,
        attributes,
        header.last_offset_delta,
        header.base_timestamp,
        header.max_timestamp,
        header.producer_id,
        header.producer_epoch,
        header.base_sequence,
        header.records_count,
    )
    return seal_batch(header_fields, b"".join(parts))


def section_chunks(header: BatchHeader, payload: bytes | bytearray | memoryview,
                   max_section_bytes: int = codecs.MAX_RECORDS_SECTION_BYTES
                   ) -> Iterator[bytes | bytearray]:
    """The records section of a batch (``payload``: the bytes after its header) as inflated
    chunks of at most ``compression.DECOMPRESS_CHUNK_BYTES``."""
    return codecs.iter_decompressed(header.compression, payload, max_section_bytes)


# attributes, timestamp delta, offset delta, key length: what the walk reads of a record
# it does not decode whole
RECORD_PREFIX_MAX_BYTES = 1 + VARLONG_MAX_BYTES + 2 * VARINT_MAX_BYTES


def walk_records_section(header: BatchHeader, chunks: Iterator[bytes | bytearray], *,
                         decode_fields: bool = False,
                         window_bytes: int = codecs.DECOMPRESS_CHUNK_BYTES) -> int:
    """Walk the ``header.records_count`` records of a section arriving as ``chunks``, as
    Kafka's ``DefaultRecordBatch`` streaming iterators do: each record's length (> 0, within
    the section), prefix (offset delta increasing and at most last_offset_delta, key length)
    and, with ``decode_fields``, every field of each record of at most ``window_bytes``;
    after the last record the section must end. No more of the stream is pulled than the
    declared records span plus one chunk, and at most one chunk (with a record of at most
    ``window_bytes`` straddling two) is held; records of at most ``window_bytes`` are
    validated whole (by the kernel, or ``_decode_record`` with ``decode_fields``), larger
    ones by their length and prefix. Returns the offset of the first record without
    a key, or -1. Raises ``InvalidRecord`` (Kafka's InvalidRecordException: INVALID_RECORD)
    for malformed records; errors of the stream itself pass through."""
    reader = _SectionReader(chunks)
    previous_delta, keyless_delta, index = -1, -1, 0
    while index < header.records_count:
        if not decode_fields and reader.ensure(1):  # the records wholly in this chunk, in C
            reader.pos, walked, previous_delta, chunk_keyless, stop = walk_records(
                reader.buf, reader.pos, header.records_count - index, previous_delta,
                header.last_offset_delta)
            index += walked
            keyless_delta = keyless_delta if keyless_delta >= 0 else chunk_keyless
            if stop == WALK_MALFORMED:
                raise InvalidRecord(f"record {index} of {header.records_count} is malformed")
            if index == header.records_count or _hold_next_record(reader, index, window_bytes):
                continue  # done, or the next record joined from two chunks: the kernel's again
        offset_delta, has_key = _walk_record(reader, header, index, decode_fields, window_bytes)
        if not previous_delta < offset_delta <= header.last_offset_delta:
            raise InvalidRecord(f"record offset delta {offset_delta} out of order or range")
        previous_delta = offset_delta
        if not has_key and keyless_delta < 0:
            keyless_delta = offset_delta
        index += 1
    keyless_offset = header.base_offset + keyless_delta if keyless_delta >= 0 else -1
    if reader.ensure(1):
        raise InvalidRecord(f"incorrect declared batch size: bytes remain after the "
                            f"{header.records_count} records")
    return keyless_offset


def _hold_next_record(reader: _SectionReader, index: int, window_bytes: int) -> bool:
    """Join chunks until the record at the reader is wholly held, if it is at most
    ``window_bytes``; False (nothing joined past its length) for a larger one."""
    reader.ensure(VARINT_MAX_BYTES)  # fewer at the end of the section
    length, body = _parsed(read_signed, reader.buf, reader.pos, len(reader.buf))
    if length > window_bytes:
        return False
    _ensure_record_bytes(reader, body - reader.pos + max(length, 0), index)
    return True


def _walk_record(reader: _SectionReader, header: BatchHeader, index: int,
                 decode_fields: bool, window_bytes: int) -> tuple[int, bool]:
    """(offset delta, has a key) of the record at the reader, which moves past it."""
    if not reader.ensure(1):
        raise InvalidRecord(f"incorrect declared batch size: the section ends before record "
                            f"{index} of {header.records_count}")
    reader.ensure(VARINT_MAX_BYTES)  # fewer at the end of the section
    length, body = _parsed(read_signed, reader.buf, reader.pos, len(reader.buf))
    if length <= 0:
        raise InvalidRecord(f"record {index} has length {length}")
    reader.pos = body
    if decode_fields and length <= window_bytes:
        _ensure_record_bytes(reader, length, index)
        body_start = reader.pos  # the attributes byte, which _decode_record skips
        record, offset_delta, reader.pos = _parsed(
            _decode_record, reader.buf, body_start + 1, body_start + length, header)
        return offset_delta, record.key is not None
    _ensure_record_bytes(reader, min(length, RECORD_PREFIX_MAX_BYTES), index)
    offset_delta, has_key = _parsed(_record_prefix, reader.buf, reader.pos,
                                    reader.pos + min(length, RECORD_PREFIX_MAX_BYTES))
    if not reader.skip(length):
        raise InvalidRecord(f"record {index} of {length} bytes runs past the section")
    return offset_delta, has_key


def _ensure_record_bytes(reader: _SectionReader, size_bytes: int, index: int) -> None:
    if not reader.ensure(size_bytes):
        raise InvalidRecord(f"record {index} runs past the end of the section")


def _record_prefix(data: bytes | bytearray, pos: int, end: int) -> tuple[int, bool]:
    pos += 1  # attributes
    _, pos = read_signed(data, pos, end, VARLONG_MAX_BYTES)  # timestamp delta
    offset_delta, pos = read_signed(data, pos, end)
    key_length, pos = read_signed(data, pos, end)
    if key_length < -1:
        raise CorruptMessage(f"invalid key length {key_length}")
    return offset_delta, key_length >= 0


def _parsed(parse: Any, *args: Any) -> Any:
    """``parse(*args)`` over bytes already held, its CorruptMessage as Kafka's record error."""
    try:
        return parse(*args)
    except CorruptMessage as exc:
        raise InvalidRecord(f"invalid record structure: {exc.message}") from exc


class _SectionReader:
    """A records section read from its chunks: ``buf[pos:]`` is what is held -- the current
    chunk, or the tail of one joined to the next when a read straddles them."""

    __slots__ = ("_chunks", "buf", "pos")

    def __init__(self, chunks: Iterator[bytes | bytearray]) -> None:
        self._chunks = iter(chunks)
        self.buf: bytes | bytearray = b""
        self.pos = 0

    def ensure(self, size_bytes: int) -> bool:
        """At least ``size_bytes`` held from ``pos`` on; False if the section ends first."""
        while len(self.buf) - self.pos < size_bytes:
            chunk = next(self._chunks, None)
            if chunk is None:
                return False
            rest = self.buf[self.pos :]
            self.buf, self.pos = (bytes(rest) + bytes(chunk) if rest else chunk), 0
        return True

    def skip(self, size_bytes: int) -> bool:
        """Move ``size_bytes`` on, dropping whole chunks; False if the section ends first."""
        while len(self.buf) - self.pos < size_bytes:
            size_bytes -= len(self.buf) - self.pos
            chunk = next(self._chunks, None)
            if chunk is None:
                self.buf, self.pos = b"", 0
                return False
            self.buf, self.pos = chunk, 0
        self.pos += size_bytes
        return True


def _checked_payload(
    buf: bytes | bytearray | memoryview, pos: int
) -> tuple[BatchHeader, memoryview]:
    """Header and records section as stored (compressed or not) of the batch at ``pos``,
    after the structural and CRC checks."""
    header = parse_header(buf, pos)
    end = pos + header.size_bytes
    if end > len(buf):
        raise CorruptMessage(f"record batch at byte {pos} overruns the buffer")
    if not crc_is_valid(buf, pos, header):
        raise CorruptMessage(f"record batch at byte {pos} fails its CRC-32C check")
    if header.records_count < 0:
        raise CorruptMessage(f"record batch at byte {pos} has negative record count")
    if header.last_offset_delta < 0:
        raise CorruptMessage(f"record batch at byte {pos} has negative last offset delta")
    return header, memoryview(buf)[pos + BATCH_HEADER_BYTES : end]


def _checked_records_section(
    buf: bytes | bytearray | memoryview, pos: int
) -> tuple[BatchHeader, bytes | memoryview]:
    """Header and (decompressed) records section of the batch at ``pos``, after the
    structural and CRC checks; a section inflating past ``MAX_RECORDS_SECTION_BYTES`` (which
    produce refuses) is corrupt here."""
    header, section = _checked_payload(buf, pos)
    if header.compression != codecs.NONE:
        return header, codecs.decompress_section(header.compression, section, pos)
    return header, section


def _decode_records(section: bytes | memoryview, header: BatchHeader) -> Iterator[Record]:
    pos, end, previous_delta = 0, len(section), -1
    log_append_time = header.max_timestamp if header.is_log_append_time else None
    for _ in range(header.records_count):
        length, pos = read_signed(section, pos, end)
        if length <= 0 or pos + length > end:
            raise CorruptMessage(f"record length {length} at byte {pos} is out of bounds")
        record, offset_delta, pos = _decode_record(section, pos + 1, pos + length, header)
        if not previous_delta < offset_delta <= header.last_offset_delta:
            raise CorruptMessage(f"record offset delta {offset_delta} out of order or range")
        previous_delta = offset_delta
        if log_append_time is not None:
            record = Record(
                record.offset, log_append_time, record.key, record.value, record.headers
            )
        yield record
    if pos != end:
        raise CorruptMessage(f"{end - pos} bytes follow the last of {header.records_count} records")


def _decode_record(
    data: bytes | memoryview, pos: int, end: int, header: BatchHeader
) -> tuple[Record, int, int]:
    """Decode the record body in ``data[pos:end]`` (after its attributes byte)."""
    timestamp_delta, pos = read_signed(data, pos, end, VARLONG_MAX_BYTES)
    offset_delta, pos = read_signed(data, pos, end)
    key, pos = _read_varint_bytes(data, pos, end)
    value, pos = _read_varint_bytes(data, pos, end)
    header_count, pos = read_signed(data, pos, end)
    if header_count < 0:
        raise CorruptMessage(f"negative record header count {header_count}")
    headers = []
    for _ in range(header_count):
        header_key, pos = _read_varint_bytes(data, pos, end)
        if header_key is None:
            raise CorruptMessage("record header with a null key")
        header_value, pos = _read_varint_bytes(data, pos, end)
        headers.append(Header(_utf8(header_key), header_value))
    if pos != end:
        raise CorruptMessage(f"record length disagrees with its fields by {end - pos} bytes")
    timestamp_ms = header.base_timestamp + timestamp_delta
    record = Record(header.base_offset + offset_delta, timestamp_ms, key, value, tuple(headers))
    return record, offset_delta, end


def _read_varint_bytes(data: bytes | memoryview, pos: int, end: int) -> tuple[bytes | None, int]:
    length, pos = read_signed(data, pos, end)
    if length < 0:
        if length != -1:
            raise CorruptMessage(f"invalid length {length} at byte {pos}")
        return None, pos
    if pos + length > end:
        raise CorruptMessage(f"field of {length} bytes at byte {pos} overruns its record")
    return bytes(data[pos : pos + length]), pos + length


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise CorruptMessage(f"record header key is not UTF-8: {exc}") from exc


def entry_size_bytes(buf: bytes | bytearray | memoryview, pos: int) -> int:
    """The size of the v2 batch or legacy message at ``pos``, checked against ``buf``."""
    if len(buf) - pos < LOG_OVERHEAD_BYTES:
        raise CorruptMessage(f"entry at byte {pos} is truncated")
    (message_bytes,) = _INT32.unpack_from(buf, pos + 8)
    if message_bytes < 0 or pos + LOG_OVERHEAD_BYTES + message_bytes > len(buf):
        raise CorruptMessage(f"entry at byte {pos} of size {message_bytes} overruns the buffer")
    return LOG_OVERHEAD_BYTES + message_bytes


# ---------------------------------------------------------------- legacy message sets


@dataclass(frozen=True, slots=True)
class _LegacyMessage:
    offset: int
    magic: int
    attributes: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None

    @property
    def compression(self) -> int:
        return self.attributes & COMPRESSION_MASK


def is_legacy(buf: bytes | bytearray | memoryview) -> bool:
    """True if the entry at the start of ``buf`` is a magic 0 or 1 message."""
    return peek_magic(buf) in (MAGIC_V0, MAGIC_V1)


def decode_legacy(buf: bytes | bytearray | memoryview) -> list[Record]:
    """Every record of a legacy message set (magic 0/1), compressed wrappers expanded.
    CRC-32 checked; v0 records have timestamp -1."""
    records: list[Record] = []
    for message in _iter_legacy_messages(memoryview(buf)):
        records.extend(_expand_legacy(message))
    return records


def _iter_legacy_messages(view: memoryview) -> Iterator[_LegacyMessage]:
    pos = 0
    while pos < len(view):
        size_bytes = entry_size_bytes(view, pos)
        offset = _LEGACY_ENTRY.unpack_from(view, pos)[0]
        yield _parse_legacy_message(offset, view[pos + LOG_OVERHEAD_BYTES : pos + size_bytes])
        pos += size_bytes


def _parse_legacy_message(offset: int, message: memoryview) -> _LegacyMessage:
    if len(message) < LEGACY_V0_HEADER_BYTES:
        raise CorruptMessage(f"legacy message at offset {offset} is truncated")
    crc, magic, attributes = _LEGACY_V0.unpack_from(message, 0)
    if magic not in (MAGIC_V0, MAGIC_V1):
        raise CorruptMessage(f"message at offset {offset} has magic {magic}, expected 0 or 1")
    header_bytes = LEGACY_V1_HEADER_BYTES if magic == MAGIC_V1 else LEGACY_V0_HEADER_BYTES
    if len(message) < header_bytes + LEGACY_KEY_VALUE_LENGTHS_BYTES:
        raise CorruptMessage(f"legacy message at offset {offset} is truncated")
    if zlib.crc32(message[4:]) != crc:
        raise CorruptMessage(f"legacy message at offset {offset} fails its CRC-32 check")
    timestamp_ms = _LEGACY_V1.unpack_from(message, 0)[3] if magic == MAGIC_V1 else NO_TIMESTAMP
    key, pos = _read_int32_bytes(message, header_bytes)
    value, pos = _read_int32_bytes(message, pos)
    if pos != len(message):
        raise CorruptMessage(
            f"legacy message at offset {offset} has {len(message) - pos} extra bytes"
        )
    return _LegacyMessage(offset, magic, attributes, timestamp_ms, key, value)


def _read_int32_bytes(data: memoryview, pos: int) -> tuple[bytes | None, int]:
    if len(data) - pos < _INT32.size:
        raise CorruptMessage(f"legacy length field truncated at byte {pos}")
    (length,) = _INT32.unpack_from(data, pos)
    pos += _INT32.size
    if length == -1:
        return None, pos
    if length < 0 or pos + length > len(data):
        raise CorruptMessage(f"legacy field of {length} bytes at byte {pos} is out of bounds")
    return bytes(data[pos : pos + length]), pos + length


def _expand_legacy(message: _LegacyMessage) -> list[Record]:
    if message.compression == codecs.NONE:
        return [Record(message.offset, message.timestamp_ms, message.key, message.value)]
    inner = _inner_messages(message)
    relative_base = message.offset - inner[-1].offset if message.magic == MAGIC_V1 else 0
    log_append_time = message.magic == MAGIC_V1 and message.attributes & LEGACY_TIMESTAMP_TYPE_BIT
    return [
        Record(
            relative_base + each.offset,
            message.timestamp_ms if log_append_time else each.timestamp_ms,
            each.key,
            each.value,
        )
        for each in inner
    ]


def _inner_messages(wrapper: _LegacyMessage) -> list[_LegacyMessage]:
    if wrapper.compression not in (codecs.GZIP, codecs.SNAPPY, codecs.LZ4):
        raise UnsupportedCompressionType(
            f"codec {wrapper.compression} is not allowed in magic {wrapper.magic} messages"
        )
    if wrapper.value is None:
        raise CorruptMessage(f"compressed message at offset {wrapper.offset} has a null value")
    inner = []
    try:
        for each in _streamed_inner_messages(wrapper):
            if each.magic != wrapper.magic or each.compression != codecs.NONE:
                raise CorruptMessage(
                    f"inner message at offset {each.offset} is compressed or has another magic")
            inner.append(each)
    except MessageTooLarge as exc:
        raise CorruptMessage(f"compressed message at offset {wrapper.offset}: "
                             f"{exc.message}") from exc
    if not inner:
        raise CorruptMessage(f"compressed message at offset {wrapper.offset} holds no messages")
    return inner


def _streamed_inner_messages(wrapper: _LegacyMessage) -> Iterator[_LegacyMessage]:
    """The inner messages of a compressed wrapper, parsed as its value inflates (at most
    ``MAX_RECORDS_SECTION_BYTES``): garbage is refused after its first chunk, and beyond the
    messages parsed so far one message is held."""
    reader = _SectionReader(codecs.iter_decompressed(
        wrapper.compression, wrapper.value, codecs.MAX_RECORDS_SECTION_BYTES,
        legacy_lz4_header_checksum=wrapper.magic == MAGIC_V0))
    while reader.ensure(1):
        if not reader.ensure(LOG_OVERHEAD_BYTES):
            raise CorruptMessage(f"inner entry of the message at offset {wrapper.offset} "
                                 "is truncated")
        offset, size_bytes = _LEGACY_ENTRY.unpack_from(reader.buf, reader.pos)
        if size_bytes < 0 or not reader.ensure(LOG_OVERHEAD_BYTES + size_bytes):
            raise CorruptMessage(f"inner entry at offset {offset} of size {size_bytes} "
                                 "overruns its wrapper")
        start = reader.pos + LOG_OVERHEAD_BYTES
        yield _parse_legacy_message(offset, memoryview(reader.buf)[start : start + size_bytes])
        reader.pos = start + size_bytes
