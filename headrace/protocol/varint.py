"""Kafka's base-128 varints: the one Python encoder and decoder of them.

Formats (protobuf's, as Kafka's ``ByteUtils``)::

    unsigned varint   7 value bits per byte, least significant group first; a byte with
                      its high bit (0x80) set says another byte follows
    signed varint     zigzag first ((v << 1) ^ (v >> 63): 0, -1, 1, -2 -> 0, 1, 2, 3),
                      then unsigned

A varint (int32) takes at most ``VARINT_MAX_BYTES`` (5) bytes and a varlong (int64) at most
``VARLONG_MAX_BYTES`` (10). Decoding follows Kafka's rule: an encoding that has not ended
after that many bytes is an error, and the value bits of the last byte beyond 32 (64) are
dropped, as Java's int (long) arithmetic drops them. The compiled kernel's
``read_varint``/``read_varlong`` (``_kernel.c``) decode the same way.

Decoders take the exception class to raise (``CorruptMessage`` for records, the wire
layer's ``MalformedFrame`` for request framing). Pure functions; thread-safe.
"""

from __future__ import annotations

from headrace.errors import CorruptMessage

VARINT_MAX_BYTES = 5
VARLONG_MAX_BYTES = 10
_VALUE_MASKS = {VARINT_MAX_BYTES: (1 << 32) - 1, VARLONG_MAX_BYTES: (1 << 64) - 1}
_UINT64_MASK = (1 << 64) - 1

Buffer = bytes | bytearray | memoryview


def write_unsigned(out: bytearray, value: int) -> None:
    """Append the non-negative ``value`` as an unsigned varint."""
    if value < 0:
        raise ValueError(f"unsigned varint of negative value {value}")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def encode_unsigned(value: int) -> bytes:
    """The non-negative ``value`` as an unsigned varint."""
    out = bytearray()
    write_unsigned(out, value)
    return bytes(out)


def write_signed(out: bytearray, value: int) -> None:
    """Append ``value`` (int32 or int64) zigzag-encoded as a varint or varlong."""
    write_unsigned(out, ((value << 1) ^ (value >> 63)) & _UINT64_MASK)


def encode_signed(value: int) -> bytes:
    """``value`` (int32 or int64) zigzag-encoded as a varint or varlong."""
    out = bytearray()
    write_signed(out, value)
    return bytes(out)


def read_unsigned(
    buf: Buffer,
    pos: int,
    end: int | None = None,
    max_bytes: int = VARINT_MAX_BYTES,
    error: type[Exception] = CorruptMessage,
) -> tuple[int, int]:
    """Decode an unsigned varint (``max_bytes`` 5) or varlong (10) at ``pos``, not reading at
    or past ``end`` (default: the buffer's end); returns ``(value, next_pos)``. Raises
    ``error`` when the bytes end first or the encoding is longer than ``max_bytes``."""
    limit = len(buf) if end is None else min(end, len(buf))
    value = shift = 0
    for index in range(pos, min(limit, pos + max_bytes)):
        byte = buf[index]
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value & _VALUE_MASKS[max_bytes], index + 1
        shift += 7
    if limit - pos < max_bytes:
        raise error(f"varint truncated at byte {pos}")
    raise error(f"varint at byte {pos} is longer than {max_bytes} bytes")


def read_signed(
    buf: Buffer,
    pos: int,
    end: int | None = None,
    max_bytes: int = VARINT_MAX_BYTES,
    error: type[Exception] = CorruptMessage,
) -> tuple[int, int]:
    """Decode a zigzag varint (``max_bytes`` 5: int32) or varlong (10: int64) at ``pos``, as
    ``read_unsigned`` bounds it; returns ``(value, next_pos)``."""
    raw, next_pos = read_unsigned(buf, pos, end, max_bytes, error)
    return (raw >> 1) ^ -(raw & 1), next_pos
