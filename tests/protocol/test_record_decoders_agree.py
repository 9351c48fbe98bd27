"""The two v2 record decoders agree: ``records.decode_batch`` (Python, used by ``dump-log
--deep`` and the cleaner's rewrites) and the kernel's ``read_record`` (C, behind
``kernel.decode_columns``).

Hypothesis builds a batch whose varints are written either shortest or padded to their full
5 (10) bytes with junk in the bits Kafka drops (past 32 / 64), damages a few bytes of the
records section, reseals the CRC so the damage reaches the record parsers, and decodes it
both ways: the same records, or both refuse. The Python decoder checks two things the
columnar decoder leaves to its callers -- offset deltas ascending within
``last_offset_delta`` and UTF-8 header keys -- so those are checked here on the kernel's
output before the outcomes are compared.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.errors import CorruptMessage
from headrace.protocol import kernel
from headrace.protocol.records import decode_batch, seal_batch
from headrace.protocol.varint import VARINT_MAX_BYTES, VARLONG_MAX_BYTES, encode_signed

BASE_OFFSET = 1_000
BASE_TIMESTAMP_MS = 1_700_000_000_000
UINT32_MASK = (1 << 32) - 1
UINT64_MASK = (1 << 64) - 1


def padded(value: int, max_bytes: int, junk: int) -> bytes:
    """``value`` zigzag-encoded in exactly ``max_bytes`` bytes, ``junk`` in the last byte's
    value bits past 32 (varint) or 64 (varlong), which Kafka's decoder drops."""
    bits, mask = (32, UINT32_MASK) if max_bytes == VARINT_MAX_BYTES else (64, UINT64_MASK)
    unsigned = ((value << 1) ^ (value >> 63)) & mask
    unsigned |= junk << bits
    out = bytearray((unsigned >> (7 * i)) & 0x7F | 0x80 for i in range(max_bytes - 1))
    out.append((unsigned >> (7 * (max_bytes - 1))) & 0x7F)
    return bytes(out)


@st.composite
def varints(draw, value: int, max_bytes: int = VARINT_MAX_BYTES) -> bytes:
    if draw(st.booleans()):
        return encode_signed(value)
    spare_bits = 3 if max_bytes == VARINT_MAX_BYTES else 6  # 5 * 7 - 32, 10 * 7 - 64
    return padded(value, max_bytes, draw(st.integers(0, (1 << spare_bits) - 1)))


@st.composite
def sized(draw, data: bytes | None) -> bytes:
    return draw(varints(-1)) if data is None else draw(varints(len(data))) + data


@st.composite
def record_bytes(draw, offset_delta: int) -> bytes:
    nullable = st.none() | st.binary(max_size=12)
    body = b"\x00" + draw(varints(draw(st.integers(-5, 5)), VARLONG_MAX_BYTES))
    body += draw(varints(offset_delta))
    body += draw(sized(draw(nullable))) + draw(sized(draw(nullable)))
    headers = draw(st.lists(st.tuples(st.text(max_size=4).map(str.encode), nullable),
                            max_size=2))
    body += draw(varints(len(headers)))
    for key, value in headers:
        body += draw(sized(key)) + draw(sized(value))
    return draw(varints(len(body))) + body


@st.composite
def damaged_batches(draw) -> bytes:
    count = draw(st.integers(1, 4))
    section = bytearray(b"".join(draw(record_bytes(delta)) for delta in range(count)))
    for _ in range(draw(st.integers(0, 3))):
        position = draw(st.integers(0, len(section) - 1))
        section[position] = draw(st.sampled_from([0x00, 0x01, 0x7F, 0x80, 0xFF])
                                 | st.integers(0, 255))
    header_fields = (BASE_OFFSET, 0, 0, count - 1, BASE_TIMESTAMP_MS, BASE_TIMESTAMP_MS + 5,
                     -1, -1, -1, count)
    return seal_batch(header_fields, bytes(section))


def python_decoded(batch: bytes) -> list[tuple] | None:
    try:
        decoded = decode_batch(batch)
    except CorruptMessage:
        return None
    return [(r.offset, r.timestamp_ms, r.key, r.value,
             tuple((h.key.encode(), h.value) for h in r.headers)) for r in decoded.records]


def _slices(offsets, data, valid):
    return [bytes(data[offsets[i]:offsets[i + 1]]) if valid[i] else None
            for i in range(len(offsets) - 1)]


def kernel_decoded(batch: bytes) -> list[tuple] | None:
    try:
        columns = kernel.decode_columns(batch, skip_control=False)
    except CorruptMessage:
        return None
    keys = _slices(columns.key_offsets, columns.key_data, columns.key_valid)
    values = _slices(columns.value_offsets, columns.value_data, columns.value_valid)
    header_count = len(columns.header_key_offsets) - 1
    header_keys = _slices(columns.header_key_offsets, columns.header_key_data,
                          [True] * header_count)
    header_values = _slices(columns.header_value_offsets, columns.header_value_data,
                            columns.header_value_valid)
    bounds = columns.header_list_offsets
    return [(int(columns.offsets[i]), int(columns.timestamps_ms[i]), keys[i], values[i],
             tuple(zip(header_keys[bounds[i]:bounds[i + 1]],
                       header_values[bounds[i]:bounds[i + 1]], strict=True)))
            for i in range(columns.count)]


def passes_python_only_checks(records: list[tuple], last_offset_delta: int) -> bool:
    deltas = [offset - BASE_OFFSET for offset, *_ in records]
    ascending = all(a < b for a, b in zip([-1, *deltas], deltas, strict=False))
    try:
        for *_, headers in records:
            for key, _ in headers:
                key.decode()
    except UnicodeDecodeError:
        return False
    return ascending and all(delta <= last_offset_delta for delta in deltas)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(damaged_batches())
def test_python_and_kernel_decode_every_batch_alike(batch):
    from_kernel = kernel_decoded(batch)
    last_offset_delta = int.from_bytes(batch[23:27], "big", signed=True)
    if from_kernel is not None and not passes_python_only_checks(from_kernel, last_offset_delta):
        from_kernel = None
    assert python_decoded(batch) == from_kernel
