"""segment_io.append_plain_batch and write_batch: the append path's one-call validate, offset
and write; and the CRC-32C variants they use, at each of the folded one's loop boundaries.

Its decision is checked against the two calls the general append path makes
(``validate_batches`` with its record checks, then ``first_batch_outside_limits``) plus the
plain path's own scope (exactly one batch, room in the segment, no producer id, the topic's
codec, uncompressed records, a header max timestamp equal to the records' largest): every
batch with a bad CRC raises the same CorruptMessage, every request the record checks refuse is
declined, every declined request leaves the file untouched, every accepted one lands in the
file byte-for-byte with its base offset rewritten and the leader epoch stamped, and the caller's buffer -- writable or a
read-only view of a larger frame -- is never changed. Writes go to real
files; the failed-write tests run a child process under a file-size limit.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import textwrap

import crc32c
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from headrace.errors import CorruptMessage, InvalidRecord
from headrace.protocol import kernel
from headrace.protocol.batch import COMPRESSION_MASK, CONTROL_BIT, TIMESTAMP_TYPE_BIT
from headrace.protocol.compression import GZIP, NONE
from headrace.protocol.records import build_batch
from headrace.storage import segment_io

NOW_MS = 1_700_000_000_000
LEADER_EPOCH = 7  # stamped as partitionLeaderEpoch (header bytes 12..15) by every write


def _stamped(original: bytes | bytearray, base_offset: int) -> bytes:
    """``original`` as written at ``base_offset`` by the leader of ``LEADER_EPOCH``."""
    return (struct.pack(">q", base_offset) + bytes(original[8:12])
            + struct.pack(">i", LEADER_EPOCH) + bytes(original[16:]))
NO_LIMIT = 2**63 - 1
OPEN_LIMITS = (NO_LIMIT, NO_LIMIT, NO_LIMIT, -1, False, False)


def _batch(count: int = 3, timestamp_ms: int = NOW_MS, **options) -> bytearray:
    records = [(b"k%d" % i, b"v" * (10 + i), [], timestamp_ms + i) for i in range(count)]
    return bytearray(build_batch(records, **options))


def _reference(buf: bytearray, max_size_bytes: int, base_offset: int, max_last_offset: int,
               now_ms: int, limits: tuple[int, int, int, int]) -> tuple[int, int] | None:
    """What the general path decides, restricted to the plain path's scope; raises as it does."""
    max_message_bytes, before_max_ms, after_max_ms, required_codec, compacted, from_client = limits
    checks = (compacted, True, from_client, now_ms, before_max_ms, after_max_ms)
    header_max_timestamp = struct.unpack_from(">q", buf, 35)[0] if len(buf) >= 43 else None
    header_log_append_time = len(buf) >= 23 and buf[22] & TIMESTAMP_TYPE_BIT
    try:
        summaries = kernel.validate_batches(buf, checks)
    except (InvalidRecord, kernel.RecordsRejected):
        return None
    if len(summaries) != 1 or kernel.first_batch_outside_limits(
            summaries, max_message_bytes, now_ms, before_max_ms, after_max_ms, False) >= 0:
        return None
    _, size_bytes, attributes, last_offset_delta, _, max_timestamp, producer_id, _ = summaries[0]
    control = attributes & CONTROL_BIT
    if (size_bytes > max_size_bytes or base_offset + last_offset_delta > max_last_offset
            or (required_codec >= 0 and not control
                and attributes & COMPRESSION_MASK != required_codec)):
        return None
    # else the caller checks the sequence, the compressed records or the max timestamp first
    written = ((producer_id < 0 or bool(control)) and not attributes & COMPRESSION_MASK
               and max_timestamp == header_max_timestamp and not header_log_append_time)
    return base_offset + last_offset_delta, max_timestamp, written


def _damaged(buf: bytearray, damage: str) -> bytearray:
    if damage == "truncated":
        return buf[:-1]
    if damage == "short header":
        return buf[:40]
    if damage == "magic":
        return buf[:16] + b"\x01" + buf[17:]
    if damage == "length":
        return buf[:8] + struct.pack(">i", 20) + buf[12:]
    if damage == "crc":
        return buf[:-1] + bytes([buf[-1] ^ 0x40])
    if damage == "record count":  # a valid CRC over a count that disagrees with the offsets
        return bytearray(build_batch([(None, b"x", [], NOW_MS)], last_offset_delta=3))
    return buf


@st.composite
def requests(draw):
    shape = draw(st.sampled_from(["one", "one", "one", "two", "empty"]))
    if shape == "empty":
        return bytearray()
    options = {"compression": draw(st.sampled_from([NONE, GZIP])),
               "producer_id": draw(st.sampled_from([-1, -1, 7])),
               "control": draw(st.booleans()),
               "log_append_time": draw(st.sampled_from([False, False, True]))}
    if options["producer_id"] >= 0:
        options |= {"producer_epoch": 1, "base_sequence": 0}
    timestamp_ms = draw(st.sampled_from([NOW_MS, NOW_MS - 10_000, NOW_MS + 10_000, -1]))
    buf = _batch(draw(st.integers(1, 4)), timestamp_ms, **options)
    buf = _damaged(buf, draw(st.sampled_from(
        ["none"] * 6 + ["truncated", "short header", "magic", "length", "crc", "record count"])))
    if shape == "two":
        buf += _batch(1)
    return buf


LIMITS = st.tuples(st.sampled_from([NO_LIMIT, 150, 60]), st.sampled_from([NO_LIMIT, 5_000]),
                   st.sampled_from([NO_LIMIT, 5_000]), st.sampled_from([-1, NONE, GZIP]),
                   st.booleans(), st.booleans())


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests(), st.sampled_from([NO_LIMIT, 200, 60]), st.integers(0, 2**40),
       st.sampled_from([NO_LIMIT, 2**40 + 1]), LIMITS, st.booleans())
def test_decides_and_raises_exactly_as_the_general_path(tmp_path, buf, max_size_bytes,
                                                         base_offset, max_last_offset, limits,
                                                         as_frame_view):
    path = tmp_path / "segment.log"
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        original = bytes(buf)
        if as_frame_view:  # a read-only slice of a request frame, as the broker passes it
            buf = memoryview(b"head" + original + b"tail")[4:-4]
        arguments = (max_size_bytes, base_offset, max_last_offset, NOW_MS, limits)
        try:
            expected = _reference(bytearray(buf), *arguments)
        except CorruptMessage as error:  # raised alike, or declined for the general path
            try:
                declined = segment_io.append_plain_batch(buf, fd, base_offset, LEADER_EPOCH, max_size_bytes,
                                                     max_last_offset, NOW_MS, limits)
            except CorruptMessage as raised:
                assert str(raised) == str(error)
            else:
                assert declined is None
            expected = None
        else:
            assert segment_io.append_plain_batch(buf, fd, base_offset, LEADER_EPOCH, max_size_bytes,
                                             max_last_offset, NOW_MS, limits) == expected
        written = path.read_bytes()
    finally:
        os.close(fd)
    assert bytes(buf) == original
    if expected is None or not expected[2]:
        assert written == b""
    else:
        assert written == _stamped(original, base_offset)


@pytest.mark.parametrize("damage", ["magic", "crc"])
def test_a_damaged_batch_in_scope_raises_what_validate_batches_raises(tmp_path, damage):
    """Damage the header does not show (the plain path's scope is decided from the header)
    is caught by the kernel itself, with validate_batches' exact error."""
    buf = _batch()
    if damage == "magic":
        buf[16] = 1
    else:
        buf[-1] ^= 0x40
    with pytest.raises(CorruptMessage) as expected:
        kernel.validate_batches(bytes(buf))
    fd = os.open(tmp_path / "segment.log", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    with pytest.raises(CorruptMessage) as raised:
        segment_io.append_plain_batch(buf, fd, 5, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS, OPEN_LIMITS)
    os.close(fd)
    assert str(raised.value) == str(expected.value)
    assert os.path.getsize(tmp_path / "segment.log") == 0 and buf[:8] == bytes(8)


def test_appends_after_what_the_file_holds_and_returns_last_offset_and_max_timestamp(tmp_path):
    path = tmp_path / "segment.log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    first, second = _batch(3), _batch(5, NOW_MS + 100)
    assert segment_io.append_plain_batch(first, fd, 10, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS,
                                     OPEN_LIMITS) == (12, NOW_MS + 2, True)
    assert segment_io.append_plain_batch(second, fd, 13, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS,
                                     OPEN_LIMITS) == (17, NOW_MS + 104, True)
    os.close(fd)
    assert path.read_bytes() == (_stamped(first, 10)
                                 + _stamped(second, 13))
    assert first[:8] == second[:8] == bytes(8)  # the callers' buffers are left as they were
    assert kernel.validate_batches(path.read_bytes())[1][0] == len(first)


def test_a_producer_batch_is_validated_then_written_by_write_batch(tmp_path):
    path = tmp_path / "segment.log"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    batch = _batch(2, producer_id=7, producer_epoch=0, base_sequence=4)
    original = bytes(batch)
    assert segment_io.append_plain_batch(batch, fd, 20, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS,
                                     OPEN_LIMITS) == (21, NOW_MS + 1, False)
    assert path.read_bytes() == b"" and bytes(batch) == original
    segment_io.write_batch(memoryview(original), fd, 20, LEADER_EPOCH)
    os.close(fd)
    assert path.read_bytes() == _stamped(original, 20)
    assert bytes(batch) == original


def test_write_batch_rejects_what_it_cannot_write(tmp_path):
    path = tmp_path / "segment.log"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    with pytest.raises(OSError):
        segment_io.write_batch(_batch(), fd, 0, LEADER_EPOCH)
    os.close(fd)
    with pytest.raises(TypeError):
        segment_io.write_batch("not a buffer", 1, 0, LEADER_EPOCH)
    with pytest.raises(ValueError):
        segment_io.write_batch(bytearray(15), 1, 0, LEADER_EPOCH)
    with pytest.raises(TypeError):
        segment_io.write_batch(_batch(), 1, 0)
    with pytest.raises(ValueError):
        segment_io.write_batch(_batch(), 1, 0, -2)
    assert path.read_bytes() == b""


def test_objects_that_are_no_buffer_are_declined_for_the_general_path_to_report(tmp_path):
    fd = os.open(tmp_path / "segment.log", os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    for buf in ("not a buffer", None, memoryview(bytes(_batch()) * 2)[::2]):
        assert segment_io.append_plain_batch(buf, fd, 0, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS,
                                         OPEN_LIMITS) is None
    os.close(fd)
    assert os.path.getsize(tmp_path / "segment.log") == 0


def test_malformed_arguments_raise():
    buf = _batch()
    with pytest.raises(TypeError):
        segment_io.append_plain_batch(buf, 1, 0, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS)
    with pytest.raises(TypeError):
        segment_io.append_plain_batch(buf, 1, 0, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS, (1, 2, 3))
    with pytest.raises(TypeError):
        segment_io.append_plain_batch(buf, "1", 0, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS, OPEN_LIMITS)
    with pytest.raises(ValueError):
        segment_io.append_plain_batch(buf, -1, 0, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS, OPEN_LIMITS)
    assert buf == _batch()  # nothing rewritten


def test_a_descriptor_that_cannot_write_raises_oserror(tmp_path):
    path = tmp_path / "segment.log"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDONLY)
    with pytest.raises(OSError):
        segment_io.append_plain_batch(_batch(), fd, 0, LEADER_EPOCH, NO_LIMIT, NO_LIMIT, NOW_MS,
                                        OPEN_LIMITS)
    os.close(fd)
    assert path.read_bytes() == b""


_FILE_SIZE_LIMITED_CHILD = textwrap.dedent("""
    import errno, os, resource, signal, sys
    from headrace.protocol import kernel
    from headrace.storage import segment_io
    from headrace.protocol.records import build_batch
    path, past_first_bytes = sys.argv[1], int(sys.argv[2])
    first = bytearray(build_batch([(None, b"a" * 100, [], 0)]))
    limit = len(first) + past_first_bytes
    second = bytearray(build_batch([(None, b"b" * 400, [], 0)]))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a fatal signal
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.RLIM_INFINITY))
    limits = (2**63 - 1, 2**63 - 1, 2**63 - 1, -1, False, False)
    segment_io.append_plain_batch(first, fd, 0, 3, 2**62, 2**62, 0, limits)
    try:
        segment_io.append_plain_batch(second, fd, 1, 3, 2**62, 2**62, 0, limits)
    except OSError as error:
        print(errno.errorcode[error.errno], len(first), os.fstat(fd).st_size)
""")


@pytest.mark.parametrize("past_first_bytes", [4, 130])
def test_a_write_cut_short_by_an_error_is_truncated_away(tmp_path, past_first_bytes):
    """The file-size limit lets the second batch's first writev through partly (within its
    new base offset, or past it); the next write fails with EFBIG and the partial batch is
    removed again."""
    path = tmp_path / "segment.log"
    child = subprocess.run([sys.executable, "-c", _FILE_SIZE_LIMITED_CHILD, str(path),
                            str(past_first_bytes)],
                           capture_output=True, text=True, check=True)
    code, first_size, size_after = child.stdout.split()
    assert code == "EFBIG"
    assert int(size_after) == int(first_size) == path.stat().st_size


def test_crc32c_agrees_with_the_reference_across_every_folding_boundary():
    """Lengths around the folded CRC's steps: its 256-byte minimum, its 256-byte main loop,
    its 64-byte tail loop and the bytes left for the crc32 instruction; unaligned starts."""
    data = os.urandom(3 * 4096 + 700)
    for length in [*range(240, 600), 1023, 1024, 1025, 4095, 4096, 4097, 12_288 + 655]:
        for skip in (0, 5):
            view = memoryview(data)[skip : skip + length]
            assert kernel.crc32c(view) == crc32c.crc32c(view), (length, skip)


_CRC_VARIANT_CHILD = textwrap.dedent("""
    import os, struct, sys
    import crc32c
    import numpy as np
    from headrace.errors import CorruptMessage
    from headrace.protocol import kernel
    from headrace.protocol.records import build_batch
    from headrace.spark import encoder
    from headrace.storage import segment_io
    data = os.urandom(3 * 4096 + 700)
    for length in [*range(0, 600), 1023, 1024, 1025, 4095, 4096, 4097, 12_288 + 655]:
        for skip in (0, 5):
            view = memoryview(data)[skip : skip + length]
            assert kernel.crc32c(view) == crc32c.crc32c(view), (length, skip)
    batch = bytearray(build_batch([(b"k", b"v" * 5000, [], 1_700_000_000_000)] * 3))
    kernel.validate_batches(batch)
    batch[-1] ^= 1
    try:
        kernel.validate_batches(batch)
    except CorruptMessage:
        print(kernel.CRC32C_VARIANT)
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT)
    limits = (2**63 - 1, 2**63 - 1, 2**63 - 1, -1, False, False)
    try:  # the storage extension's append path checks with its own copy of the CRC
        segment_io.append_plain_batch(batch, fd, 0, 3, 2**63 - 1, 2**63 - 1, 1_700_000_000_000,
                                      limits)
    except CorruptMessage:
        print(segment_io.CRC32C_VARIANT)
    values = encoder.BinaryColumn(np.array([0, 5000], np.int32), b"v" * 5000)
    sealed = encoder.encode_batches(1, None, values, None, None, np.zeros(1, np.int32),
                                    1_700_000_000_000, encoder.ProducerFields(), 0, 1 << 20)
    if struct.unpack_from(">I", sealed.data, 17)[0] == crc32c.crc32c(memoryview(sealed.data)[21:]):
        print(encoder.CRC32C_VARIANT)  # the spark extension seals with its own copy
""")


@pytest.mark.parametrize("variant", [
    pytest.param(variant, marks=pytest.mark.required_where(f"crc32c_{variant}"))
    for variant in ("portable", "interleaved", "folded")])
def test_every_crc32c_variant_agrees_with_the_reference(variant, tmp_path):
    """Each variant, forced through HEADRACE_KERNEL_CRC32C in a process of its own (the one
    this process picked is only the CPU's fastest): the same CRCs as the reference, and
    validation still catches a flipped bit, with that variant in use (CRC32C_VARIANT) -- in
    each extension that computes CRCs (protocol's, storage's append path, the Spark encoder),
    which all read the switch."""
    if variant not in kernel.CRC32C_VARIANTS_SUPPORTED:
        pytest.skip(f"this CPU cannot run the {variant} CRC-32C")
    environment = {**os.environ, kernel.CRC32C_VARIANT_ENV: variant}
    child = subprocess.run([sys.executable, "-c", _CRC_VARIANT_CHILD, str(tmp_path / "log")],
                           capture_output=True, text=True, check=True, env=environment)
    assert child.stdout.split() == [variant] * 3
