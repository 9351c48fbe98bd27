"""Message-format conversion for the oldest Produce and Fetch versions, as Kafka 3.9 does it.

Owns the conversion between legacy message sets (magic 0 and 1, the formats of Produce
v0-2 and Fetch v0-3) and the v2 record batches the log stores. The per-message loops are
compiled (``_message_format.c``); this module decompresses and compresses (one call per
compressed wrapper or batch) and seals the v2 batch header.

Legacy message (magic 0/1)::

    offset int64, message_size int32, crc uint32 (CRC-32 of magic..end), magic int8,
    attributes int8 (bits 0-2 codec, bit 3 LogAppendTime in magic 1),
    [timestamp int64, magic 1], key int32 length + bytes (-1 null), value (same)

A compressed message is a wrapper whose value is the compressed set of uncompressed inner
messages of the same magic; magic 1 inner offsets are relative (the wrapper carries the
absolute offset of the last one), magic 0 inner offsets absolute. Compression of a
wrapper's value: gzip, xerial-framed snappy, LZ4 frames (magic 0 with Kafka's historic
wrong header checksum, see ``compression``).

Up-conversion (Kafka's LogValidator on a Produce of magic 0/1): every message's CRC is
checked (CORRUPT_MESSAGE), inner messages must share their wrapper's magic and be
uncompressed (INVALID_RECORD), a wrapper's value is parsed as it inflates (a chunk at a time,
at most ``compression.MAX_RECORDS_SECTION_BYTES``: a decompression bomb is refused at its
first bad inner message, holding at most one message), and all records become one v2 batch with offsets 0..n-1 (the
log assigns the real ones), the records' timestamps (-1 for magic 0; a magic 1 wrapper's
with LogAppendTime), no headers, no producer id, compressed with the codec of the set's last
compressed message (``compression.type=producer``; the log recompresses for another).

Down-conversion (Kafka's ``RecordsUtil.downConvert`` under ``LazyDownConversionRecords``,
for Fetch v0-1 to magic 0 and v2-3 to magic 1): control batches are dropped, headers are
dropped, an uncompressed batch loses its records before the fetch offset, a compressed batch
becomes one wrapper of the same codec (zstd has no legacy form: UNSUPPORTED_COMPRESSION_TYPE
when it comes first; a later zstd batch ends the conversion there). LogAppendTime batches
give their messages the batch's max timestamp and the LogAppendTime attribute (magic 1).
The records sent are sized as Kafka sizes them: ``max(fetched bytes, first converted
batch)``, truncated there, or padded with Kafka's "overflow" entry (offset -1, a length past
the end) that clients skip as a partial message.

Pure functions; thread-safe (the compiled loops release the GIL).
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from headrace.errors import (
    CorruptMessage,
    InvalidRecord,
    MessageTooLarge,
    UnsupportedCompressionType,
)
from headrace.protocol import _message_format
from headrace.protocol import compression as codecs
from headrace.protocol.batch import (
    BATCH_HEADER_BYTES,
    COMPRESSION_MASK,
    NO_TIMESTAMP,
    parse_header,
)
from headrace.protocol.records import seal_batch

MAGIC_V0 = 0
MAGIC_V1 = 1
LEGACY_TIMESTAMP_TYPE_BIT = 0x08
LEGACY_CODECS = (codecs.GZIP, codecs.SNAPPY, codecs.LZ4)
NO_PRODUCER_ID = -1
NO_PARTITION_LEADER_EPOCH = -1
OVERFLOW_ENTRY_MIN_BYTES = 12  # Kafka's MIN_OVERFLOW_MESSAGE_LENGTH: offset + length
OVERFLOW_CHUNK_MAX_BYTES = 128 * 1024  # LazyDownConversionRecordsSend.MAX_READ_SIZE
_OVERFLOW_HEAD = struct.Struct(">qi")

crc32 = _message_format.crc32


# ---------------------------------------------------------------- up-conversion


def upconvert(message_set: bytes | bytearray | memoryview) -> bytes:
    """One v2 batch holding the records of a legacy message set; b"" if it has none."""
    view = memoryview(message_set)
    sections: list[bytes] = []
    position, next_delta, base_timestamp, max_timestamp = 0, 0, None, NO_TIMESTAMP
    codec = codecs.NONE
    while position < len(view):
        section, position, next_delta, base_timestamp, max_timestamp, wrapper = (
            _message_format.legacy_to_records(
                view, position, next_delta, base_timestamp, max_timestamp, -1, False, 0))
        sections.append(section)
        if wrapper is None:
            continue
        offset, magic, attributes, timestamp, value_at, value_length = wrapper
        codec = attributes & COMPRESSION_MASK
        log_append_time = magic == MAGIC_V1 and bool(attributes & LEGACY_TIMESTAMP_TYPE_BIT)
        first_delta = next_delta
        unparsed = bytearray()  # the inflated bytes of a message not yet whole: at most one
        for chunk in _inflate_wrapper(codec, magic, offset, view[value_at:value_at + value_length]):
            unparsed += chunk
            section, used, next_delta, base_timestamp, max_timestamp, _ = (
                _message_format.legacy_to_records(
                    unparsed, 0, next_delta, base_timestamp, max_timestamp, magic,
                    log_append_time, timestamp))
            sections.append(section)
            del unparsed[:used]
        if unparsed:
            raise CorruptMessage(f"the last inner message of the message at offset {offset} "
                                 "is truncated")
        if next_delta == first_delta:
            raise InvalidRecord(f"compressed message at offset {offset} holds no messages")
    if next_delta == 0:
        return b""
    header_fields = (0, NO_PARTITION_LEADER_EPOCH, codec, next_delta - 1, base_timestamp,
                     max_timestamp, NO_PRODUCER_ID, -1, -1, next_delta)
    return seal_batch(header_fields, codecs.compress(codec, b"".join(sections)))


def _inflate_wrapper(codec: int, magic: int, offset: int, value: memoryview) -> Iterator[bytes]:
    """A wrapper's value inflated a chunk at a time, at most ``MAX_RECORDS_SECTION_BYTES``
    in all (a bomb is refused at its first bad inner message, never inflated whole)."""
    if codec not in LEGACY_CODECS:
        raise UnsupportedCompressionType(
            f"codec {codec} of the message at offset {offset} has no magic {magic} form")
    try:
        yield from codecs.iter_decompressed(codec, value, codecs.MAX_RECORDS_SECTION_BYTES,
                                            legacy_lz4_header_checksum=magic == MAGIC_V0)
    except MessageTooLarge as error:
        raise CorruptMessage(f"compressed message at offset {offset}: {error.message}") from error


# ---------------------------------------------------------------- down-conversion


def downconvert(batches: bytes | bytearray | memoryview, to_magic: int,
                fetch_offset: int) -> tuple[bytes, int]:
    """(messages, bytes of them up to the end of the first batch that converted to any) of
    the whole v2 batches in ``batches``; a trailing partial batch is left out.
    UnsupportedCompressionType when a zstd batch comes before any message."""
    view = memoryview(batches)
    parts: list[bytes] = []
    position, written_bytes, first_batch_bytes = 0, 0, 0
    while True:
        messages, position, first = _message_format.plain_batches_to_legacy(
            view, position, to_magic, fetch_offset)
        if first and not first_batch_bytes:
            first_batch_bytes = written_bytes + first
        parts.append(messages)
        written_bytes += len(messages)
        header = _whole_batch_header(view, position)
        if header is None:
            break
        position += header.size_bytes
        if header.is_control:
            continue
        if header.compression == codecs.ZSTD:
            if first_batch_bytes:
                break
            raise UnsupportedCompressionType("zstd batches have no magic 0/1 form")
        wrapper = _wrapper(view[position - header.size_bytes:position], header, to_magic)
        if wrapper:
            parts.append(wrapper)
            written_bytes += len(wrapper)
            first_batch_bytes = first_batch_bytes or written_bytes
    return b"".join(parts), first_batch_bytes


def _whole_batch_header(view: memoryview, position: int):
    if len(view) - position < BATCH_HEADER_BYTES:
        return None
    header = parse_header(view, position)
    return header if position + header.size_bytes <= len(view) else None


def _wrapper(batch: memoryview, header, to_magic: int) -> bytes:
    """The one compressed message a compressed batch becomes (b"" if it has no records)."""
    records = codecs.decompress(header.compression, batch[BATCH_HEADER_BYTES:])
    inner, count, _, last_offset, max_timestamp = _message_format.batch_records_to_legacy(
        batch[:BATCH_HEADER_BYTES], records, to_magic)
    if not count:
        return b""
    value = codecs.compress(header.compression, inner,
                            legacy_lz4_header_checksum=to_magic == MAGIC_V0)
    attributes = header.compression
    timestamp = max_timestamp
    if to_magic == MAGIC_V1 and header.is_log_append_time:
        attributes |= LEGACY_TIMESTAMP_TYPE_BIT
        timestamp = header.max_timestamp
    return _message_format.legacy_message(last_offset, to_magic, attributes, timestamp, None, value)


def down_converted_records(batches: bytes | bytearray | memoryview, to_magic: int,
                           fetch_offset: int) -> bytes:
    """The records field of a down-converting Fetch response for the fetched ``batches``,
    sized as Kafka's LazyDownConversionRecords sizes it (see the module docstring).
    Raises UnsupportedCompressionType (zstd first) and CorruptMessage (malformed batches)."""
    messages, first_batch_bytes = downconvert(batches, to_magic, fetch_offset)
    if first_batch_bytes:
        size_bytes = max(len(batches), first_batch_bytes)
    else:  # nothing converted: an overflow entry if there were whole batches, else nothing
        has_batch = _whole_batch_header(memoryview(batches), 0) is not None
        size_bytes = OVERFLOW_ENTRY_MIN_BYTES if has_batch else 0
        messages = b""
    if len(messages) >= size_bytes:
        return messages[:size_bytes]
    return messages + _overflow_padding(size_bytes - len(messages))


def _overflow_padding(remaining_bytes: int) -> bytes:
    """Kafka's overflow entries filling ``remaining_bytes``: offset -1 and a length past the
    end, so a client reads a partial message and stops."""
    parts = []
    while remaining_bytes > 0:
        chunk_bytes = max(OVERFLOW_ENTRY_MIN_BYTES, min(remaining_bytes + 1, OVERFLOW_CHUNK_MAX_BYTES))
        chunk = bytearray(chunk_bytes)
        _OVERFLOW_HEAD.pack_into(chunk, 0, -1, max(remaining_bytes + 1, BATCH_HEADER_BYTES))
        parts.append(bytes(chunk[:remaining_bytes]))
        remaining_bytes -= len(parts[-1])
    return b"".join(parts)

