"""The request pre-pass: every length and count in a request body checked before decoding.

kio's native (Rust) reader sizes allocations from counts read off the wire before checking
them: a compact array count of 2^32-2 in a 30-byte Metadata request makes it allocate ~34 GB
and abort the process. kio cannot be patched from here, so ``problem_in(entity_class,
frame, position)`` walks the body first and returns what is wrong with it, or None; only a
body it passes reaches kio. The rules: a length must fit in the bytes left of the frame;
a count of N items needs at least N x the item's minimum encoded size (Kafka's generated
readers refuse a count above the bytes remaining, one byte per item; the item's real
minimum is a tighter bound on what kio then allocates); a null only where the schema
allows one (Kafka's readers throw "non-nullable field ... was serialized as null" and the
request is invalid); a known tagged field's value fills its size exactly. Unknown
tagged fields are skipped; trailing bytes after the body are allowed (librdkafka leaves
some). One difference from Kafka's readers: a negative legacy length other than -1 is
malformed (Kafka reads any negative length as null; kio refuses them).

The walk is derived from kio's dataclass schema (``kio.serial._introspect``): ``compile``
turns a request class, once, into a compact int32 program (format in ``_prepass.c``): one
op per field, adjacent fixed-width fields merged into one skip, one table entry per
struct with its known tags, and each struct's minimum encoded size precomputed for the
count check. The walker is C (``headrace.protocol._prepass``): a pure-Python walk of the
same program costs 6.8 us for a 6-partition Fetch v12 and 11 us for a 6-partition
OffsetCommit v8 -- more than kio's whole decode of them (~3.3 us) -- on every request of
the hottest APIs; the C walk costs 0.2 us, call included (``bench/request_prepass.py``). The program also carries the field names, so
a refusal names the field (``FetchRequest.topics: array of ... overruns ...``).

Programs are cached per class in a dict that only grows (at most one per request class);
``problem_in`` is thread-safe (a race compiles a program twice, both identical).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, fields

from kio.serial._introspect import (
    EntityField,
    EntityTupleField,
    PrimitiveTupleField,
    classify_field,
    get_field_tag,
    get_schema_field_type,
    is_optional,
)

from headrace.protocol import _prepass

OP_FIXED, OP_STRING, OP_BYTES, OP_STRUCT, OP_ARRAY_FIXED, OP_ARRAY_STRING, OP_ARRAY_STRUCT = (
    range(7))
FIXED_WIDTH_BYTES = {
    "bool": 1, "int8": 1, "uint8": 1,
    "int16": 2, "uint16": 2, "error_code": 2,
    "int32": 4, "uint32": 4, "timedelta_i32": 4,
    "int64": 8, "uint64": 8, "timedelta_i64": 8, "datetime_i64": 8, "float64": 8,
    "uuid": 16,
}
LENGTH_PREFIXED = {"string": OP_STRING, "bytes": OP_BYTES, "records": OP_BYTES}
LEGACY_PREFIX_BYTES = {OP_STRING: 2, OP_BYTES: 4, OP_ARRAY_FIXED: 4, OP_ARRAY_STRING: 4,
                       OP_ARRAY_STRUCT: 4}
NULLABLE_STRUCT_MARKER_BYTES = 1
if array("i").itemsize != 4:  # the walker reads int32 words
    raise ImportError("the request pre-pass needs a 32-bit C int")


@dataclass(frozen=True, slots=True)
class Program:
    words: array  # native int32: the walker's program
    field_names: tuple[str, ...]  # per op: the dotted path of its field(s)


@dataclass(slots=True)
class _Struct:
    ops: list[tuple[int, int, int, int]]
    names: list[str]
    tags: list[tuple[int, tuple[int, int, int, int], str]]
    min_bytes: int


class _Compiler:
    """Compiles one request class (all its structs share its version's flexibility)."""

    def __init__(self, flexible: bool) -> None:
        self.flexible = flexible
        self.structs: list[_Struct] = []
        self.index: dict[type, int] = {}

    def struct(self, entity_class: type, path: str) -> int:
        if entity_class in self.index:
            return self.index[entity_class]
        number = self.index[entity_class] = len(self.structs)
        compiled = _Struct([], [], [], 1 if self.flexible else 0)
        self.structs.append(compiled)
        for field in fields(entity_class):
            name = f"{path}.{field.name}" if path else field.name
            op = self.field_op(field, name)
            tag = get_field_tag(field)
            if tag is not None:
                compiled.tags.append((tag, op, name))
                continue
            compiled.min_bytes += self.min_bytes(op)
            previous = compiled.ops[-1] if compiled.ops else None
            if op[0] == OP_FIXED and previous is not None and previous[0] == OP_FIXED:
                compiled.ops[-1] = (OP_FIXED, previous[1] + op[1], 0, 0)
                first_name = compiled.names[-1].split("..")[0]
                compiled.names[-1] = f"{first_name}..{field.name}"  # the run's first..last
            else:
                compiled.ops.append(op)
                compiled.names.append(name)
        return number

    def field_op(self, field, name: str) -> tuple[int, int, int, int]:
        kind = classify_field(field)
        nullable = int(is_optional(field))
        if isinstance(kind, EntityField):
            return (OP_STRUCT, self.struct(kind.type_, name), nullable, 0)
        if isinstance(kind, EntityTupleField):
            item = self.struct(kind.type_, name)
            return (OP_ARRAY_STRUCT, item, nullable, max(1, self.structs[item].min_bytes))
        kafka_type = get_schema_field_type(field)
        if isinstance(kind, PrimitiveTupleField):
            if kafka_type in FIXED_WIDTH_BYTES:
                return (OP_ARRAY_FIXED, FIXED_WIDTH_BYTES[kafka_type], nullable, 0)
            if kafka_type == "string":
                return (OP_ARRAY_STRING, 0, nullable, 0)
        elif kafka_type in FIXED_WIDTH_BYTES:
            return (OP_FIXED, FIXED_WIDTH_BYTES[kafka_type], 0, 0)
        elif kafka_type in LENGTH_PREFIXED:
            return (LENGTH_PREFIXED[kafka_type], 0, nullable, 0)
        raise TypeError(f"no pre-pass op for {name} of kafka type {kafka_type!r}")

    def min_bytes(self, op: tuple[int, int, int, int]) -> int:
        opcode, argument, nullable, _ = op
        if opcode == OP_FIXED:
            return argument
        if opcode == OP_STRUCT:
            return NULLABLE_STRUCT_MARKER_BYTES if nullable else self.structs[argument].min_bytes
        return 1 if self.flexible else LEGACY_PREFIX_BYTES[opcode]

    def program(self) -> Program:
        ops: list[tuple[int, int, int, int]] = []
        names: list[str] = []
        tags: list[tuple[int, int]] = []
        table: list[int] = []
        first_tag = 0  # each struct's tags sit together in the tag table, in struct order
        for compiled in self.structs:
            table += (len(ops), len(compiled.ops), first_tag, len(compiled.tags))
            ops += compiled.ops
            names += compiled.names
            first_tag += len(compiled.tags)
        for compiled in self.structs:  # tagged fields' ops follow every struct's own ops
            for tag, op, name in compiled.tags:
                tags.append((tag, len(ops)))
                ops.append(op)
                names.append(name)
        words = array("i", (int(self.flexible), len(self.structs), len(ops), len(tags)))
        words.extend(table)
        for op in ops:
            words.extend(op)
        for tag in tags:
            words.extend(tag)
        return Program(words, tuple(names))


def compile_program(entity_class: type) -> Program:
    """The pre-pass program of a request (or any top-level entity) class."""
    compiler = _Compiler(bool(entity_class.__flexible__))
    compiler.struct(entity_class, "")
    return compiler.program()


_programs: dict[type, Program] = {}


def problem_in(entity_class: type, frame: bytes | bytearray | memoryview,
               position: int) -> str | None:
    """What is malformed in the ``entity_class`` body at ``position`` of ``frame``: None if
    every length and count fits, else a message naming the field."""
    program = _programs.get(entity_class)
    if program is None:
        program = _programs[entity_class] = compile_program(entity_class)
    failure = _prepass.walk(program.words, frame, position)
    if failure is None:
        return None
    message, op_index = failure
    where = program.field_names[op_index] if op_index >= 0 else "tagged fields"
    return f"{entity_class.__name__}.{where}: {message}"
