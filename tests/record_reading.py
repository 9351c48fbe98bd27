"""Readers of whole record buffers that only the tests need: every record of a buffer of v2
batches or legacy messages (``iter_records``), and every batch header with its position
(``iter_headers``). Built on the production decoders (``records.decode_batch``,
``records.decode_legacy``, ``batch.parse_header``, ``batch.crc_is_valid``), so tests read
stored and fetched bytes exactly as the broker parses them. Pure functions; thread-safe.
"""

from __future__ import annotations

from collections.abc import Iterator

from headrace.errors import CorruptMessage
from headrace.protocol.batch import (
    CURRENT_MAGIC,
    BatchHeader,
    crc_is_valid,
    parse_header,
    peek_magic,
)
from headrace.protocol.records import Record, decode_batch, decode_legacy, entry_size_bytes


def iter_records(buf: bytes | bytearray | memoryview) -> Iterator[Record]:
    """Every record, with absolute offsets, of a buffer of whole entries: v2 batches or
    legacy (magic 0/1) messages. Raises CorruptMessage on a partial trailing entry."""
    pos, end = 0, len(buf)
    while pos < end:
        size_bytes = entry_size_bytes(buf, pos)
        if peek_magic(buf, pos) == CURRENT_MAGIC:
            yield from decode_batch(buf, pos).records
        else:
            yield from decode_legacy(memoryview(buf)[pos : pos + size_bytes])
        pos += size_bytes


def iter_headers(
    buf: bytes | bytearray | memoryview, verify_crc: bool = False
) -> Iterator[tuple[int, BatchHeader]]:
    """Yield ``(position, header)`` for each whole batch in ``buf``.

    Raises CorruptMessage on a malformed or (with ``verify_crc``) damaged batch, and on a
    trailing partial batch.
    """
    pos, end = 0, len(buf)
    while pos < end:
        header = parse_header(buf, pos)
        if pos + header.size_bytes > end:
            raise CorruptMessage(f"record batch at byte {pos} overruns the buffer")
        if verify_crc and not crc_is_valid(buf, pos, header):
            raise CorruptMessage(f"record batch at byte {pos} fails its CRC-32C check")
        yield pos, header
        pos += header.size_bytes
