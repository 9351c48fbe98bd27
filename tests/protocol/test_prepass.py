"""The request pre-pass: every length and count checked before kio's native reader.

Property tests run in-process over every (api key, version) the broker advertises: a crash
in kio's reader would kill pytest, and the address space is capped while they run, so an
allocation sized from an unchecked count fails the run instead of passing unnoticed.
"""

import resource
import struct
import uuid
from contextlib import contextmanager
from dataclasses import fields

import pytest
from hypothesis import HealthCheck, given, settings  # before kio: it registers strategies
from hypothesis import strategies as st
from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    classify_field,
    get_field_tag,
    is_optional,
)
from kio.static.primitive import Records

from headrace.broker.handlers import HANDLERS
from headrace.errors import InvalidRequest
from headrace.protocol import prepass, wire

st.register_type_strategy(Records, st.binary(max_size=64).map(Records))  # kio ships none

ADVERTISED = [(key, version) for key, handler in HANDLERS.items()  # with a kio schema to walk
              for version in range(handler.min_version, handler.max_version + 1)
              if version not in wire.HAND_CODED_VERSIONS.get(key, ())]
ADDRESS_SPACE_HEADROOM_BYTES = 1 << 30
MUTATED_PREFIX_BYTES = 160  # count mutations are tried at every offset of this prefix
HUGE_COUNTS = (b"\xff\xff\xff\xff\x0f", b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff",
               b"\x80\x80\x80\x80\x08", b"\x7f\xff", b"\x00")
PROPERTY_SETTINGS = settings(max_examples=100, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow,
                                                    HealthCheck.data_too_large])


@contextmanager
def address_space_capped(headroom_bytes: int = ADDRESS_SPACE_HEADROOM_BYTES):
    """Cap this process's address space at its current size plus ``headroom_bytes``."""
    with open("/proc/self/statm") as statm:
        current_bytes = int(statm.read().split()[0]) * resource.getpagesize()
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = current_bytes + headroom_bytes
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _frame(key: int, version: int, body) -> bytes:
    return wire.encode_request(key, version, 7, "prepass-test", body)[4:]


def _body_offset(frame: bytes, body) -> int:
    return len(frame) - len(wire.encode_body(body))


def _assert_nulls_only_where_allowed(entity) -> None:
    if entity is None or not hasattr(entity, "__dataclass_fields__"):
        return
    for field in fields(entity):
        value = getattr(entity, field.name)
        if get_field_tag(field) is None and not is_optional(field):
            assert value is not None, f"{type(entity).__name__}.{field.name} decoded as null"
        kind = classify_field(field)
        if isinstance(kind, EntityField):
            _assert_nulls_only_where_allowed(value)
        elif isinstance(kind, EntityTupleField):
            for item in value or ():
                _assert_nulls_only_where_allowed(item)


def _decode_or_refuse(frame: bytes) -> None:
    """Decoding either succeeds (respecting the schema's nullability) or raises
    InvalidRequest (MalformedFrame); anything else fails the test."""
    try:
        request = wire.decode_request(frame)
    except InvalidRequest:
        return
    if not isinstance(request.body, wire.ProduceRequest):
        _assert_nulls_only_where_allowed(request.body)


@st.composite
def advertised_requests(draw):
    key, version = draw(st.sampled_from(ADVERTISED))
    body = draw(st.from_type(wire.request_class(key, version)))
    return key, version, body


@PROPERTY_SETTINGS
@given(advertised_requests())
def test_every_advertised_request_round_trips(request):
    key, version, body = request
    frame = _frame(key, version, body)
    assert prepass.problem_in(type(body), frame, _body_offset(frame, body)) is None
    decoded = wire.decode_request(frame)
    assert (decoded.header.api_key, decoded.header.api_version) == (key, version)
    if isinstance(decoded.body, wire.ProduceRequest):
        assert [(t.name, [(p.index, p.records and bytes(p.records)) for p in t.partition_data])
                for t in decoded.body.topic_data] == [
            (t.name, [(p.index, p.records) for p in t.partition_data]) for t in body.topic_data]
    else:
        assert decoded.body == body


@PROPERTY_SETTINGS
@given(advertised_requests())
def test_a_truncated_request_decodes_or_is_malformed(request):
    key, version, body = request
    frame = _frame(key, version, body)
    with address_space_capped():
        for end in range(_body_offset(frame, body), len(frame)):
            _decode_or_refuse(frame[:end])


@PROPERTY_SETTINGS
@given(advertised_requests(), st.sampled_from(HUGE_COUNTS))
def test_a_mutated_count_anywhere_decodes_or_is_malformed(request, huge_count):
    key, version, body = request
    frame = _frame(key, version, body)
    start = _body_offset(frame, body)
    with address_space_capped():
        for offset in range(start, min(len(frame), start + MUTATED_PREFIX_BYTES)):
            mutated = frame[:offset] + huge_count + frame[offset + len(huge_count):]
            _decode_or_refuse(mutated[:len(frame)])


@pytest.mark.parametrize(("key", "version"), ADVERTISED)
def test_every_advertised_version_survives_truncation_and_huge_counts_at_every_offset(key,
                                                                                     version):
    body = wire.build(wire.request_class(key, version), {})  # zero values, empty arrays
    frame = _frame(key, version, body)
    start = _body_offset(frame, body)
    assert wire.decode_request(frame).header.api_version == version
    with address_space_capped():
        for offset in range(start, len(frame)):
            _decode_or_refuse(frame[:offset])
            for huge_count in HUGE_COUNTS:
                _decode_or_refuse(frame[:offset] + huge_count + frame[offset + len(huge_count):])


def test_the_reported_metadata_frame_is_malformed_naming_its_field():
    frame = (struct.pack(">hhih", 3, 12, 2, 7) + b"rdkafka" + b"\x00"
             + bytes.fromhex("ffffffff0f") + b"\x00" * 3)
    with address_space_capped(), pytest.raises(wire.MalformedFrame, match="MetadataRequest.topics"):
        wire.decode_request(frame)


@pytest.mark.parametrize(("key", "version", "values"), [
    (8, 2, {"group_id": "g", "topics": None}),  # OffsetCommit
    (8, 9, {"group_id": "g", "topics": None}),
    (2, 1, {"topics": None}),  # ListOffsets
    (2, 7, {"topics": None}),
    (1, 12, {"topics": [{"topic": "t", "partitions": None}]}),  # Fetch, a nested array
])
def test_a_null_where_the_schema_has_none_is_malformed(key, version, values):
    body = wire.build(wire.request_class(key, version), values)
    with pytest.raises(wire.MalformedFrame, match="serialized as null"):
        wire.decode_request(_frame(key, version, body))


@pytest.mark.parametrize(("version", "name", "null"), [(2, b"\x00\x03abc", b"\xff\xff"),
                                                      (5, b"\x04abc", b"\x00")])
def test_a_null_topic_name_in_create_topics_is_malformed(version, name, null):
    body = wire.build(wire.request_class(19, version), {"topics": [
        {"name": "abc", "num_partitions": 1, "replication_factor": 1}]})
    frame = _frame(19, version, body)
    assert frame.count(name) == 1
    with pytest.raises(wire.MalformedFrame, match="topics.name: non-nullable"):
        wire.decode_request(frame.replace(name, null))


def test_a_nullable_array_may_be_null():
    body = wire.build(wire.request_class(3, 12), {"topics": None})
    assert wire.decode_request(_frame(3, 12, body)).body.topics is None


def _fetch_v12_with_cluster_id(tagged_section: bytes) -> bytes:
    body = wire.build(wire.request_class(1, 12), {"max_bytes": 1, "topics": []})
    encoded = wire.encode_body(body)
    assert encoded[-1] == 0  # the request's own (empty) tagged-field section
    return struct.pack(">hhih", 1, 12, 3, -1) + b"\x00" + encoded[:-1] + tagged_section


def test_known_tagged_fields_are_checked_and_unknown_ones_skipped():
    cluster_id = b"\x03ab"  # tag 0 is FetchRequest.cluster_id: compact string "ab"
    request = wire.decode_request(_fetch_v12_with_cluster_id(b"\x01\x00\x03" + cluster_id))
    assert request.body.cluster_id == "ab"
    unknown = wire.decode_request(_fetch_v12_with_cluster_id(b"\x01\x63\x02\xff\xff"))
    assert unknown.body.cluster_id is None
    with pytest.raises(wire.MalformedFrame, match="cluster_id"):  # length past its tag's size
        wire.decode_request(_fetch_v12_with_cluster_id(b"\x01\x00\x03\x09ab"))
    with pytest.raises(wire.MalformedFrame, match="cluster_id"):  # value shorter than its size
        wire.decode_request(_fetch_v12_with_cluster_id(b"\x01\x00\x04" + cluster_id + b"\x00"))
    with pytest.raises(wire.MalformedFrame, match="tagged fields"):
        wire.decode_request(_fetch_v12_with_cluster_id(b"\x01\x63\x7f\x00"))


def test_a_program_merges_fixed_width_fields_and_sizes_items_for_the_count_check():
    program = prepass.compile_program(wire.request_class(1, 12))
    assert "topics.partitions.partition..partition_max_bytes" in program.field_names
    words = program.words.tolist()
    struct_count, op_count = words[1], words[2]
    ops = words[4 + 4 * struct_count:][:4 * op_count]
    fixed_runs = [ops[i + 1] for i in range(0, len(ops), 4) if ops[i] == prepass.OP_FIXED]
    assert 32 in fixed_runs  # FetchPartition: 4+4+8+4+8+4 bytes walked as one skip
    partitions_op = program.field_names.index("topics.partitions")
    assert ops[4 * partitions_op:4 * partitions_op + 4][0] == prepass.OP_ARRAY_STRUCT
    assert ops[4 * partitions_op + 3] == 33  # 32 fixed bytes + the tagged-field count


@pytest.mark.parametrize(("count_bytes", "problem"), [
    (b"\xff\xff", "unsigned varint overruns the frame"),
    (b"\xff" * 5, "unsigned varint longer than 5 bytes"),  # exactly at the frame's end
    (b"\xff" * 5 + b"\x01", "unsigned varint longer than 5 bytes"),
])
def test_a_compact_count_cut_short_or_running_long_is_named_for_which(count_bytes, problem):
    metadata = wire.request_class(3, 12)
    assert prepass.problem_in(metadata, count_bytes, 0) == f"MetadataRequest.topics: {problem}"


def test_a_nested_structs_tagged_field_is_walked_with_its_own_type():
    """A Fetch v17 partition's tag 0 is replica_directory_id (a uuid) while the body's tag 0 is
    cluster_id (a nullable string): each struct's tag table must be its own."""
    fetch_v17 = wire.request_class(1, 17)
    body = wire.build(fetch_v17, {
        "cluster_id": None, "replica_state": {"replica_id": -1, "replica_epoch": -1},
        "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1,
        "topics": [{"topic_id": uuid.UUID(int=1), "partitions": [{
            "partition": 0, "current_leader_epoch": -1, "fetch_offset": 0,
            "last_fetched_epoch": -1, "log_start_offset": -1, "partition_max_bytes": 0,
            "replica_directory_id": uuid.UUID(int=2)}]}],
        "forgotten_topics_data": [], "rack_id": ""})
    frame = _frame(1, 17, body)
    assert prepass.problem_in(fetch_v17, frame, _body_offset(frame, body)) is None
