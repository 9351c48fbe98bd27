"""What the request pre-pass costs per request, and why its walker is C.

For a few typical requests -- a 6-partition Fetch v12 and v4 (a consumer's poll), Metadata
v12 with 3 topics, Heartbeat v4, OffsetCommit v8 with 6 partitions, a 1-partition Produce
v9 -- prints microseconds per request (median of ``--runs``) for

* ``prepass``: ``prepass.problem_in`` as ``wire.decode_request`` calls it (C walker);
* ``python walk``: the same compiled program walked by a plain Python interpreter of its
  ops (defined here only to measure the alternative; the broker never runs it);
* ``decode``: the whole ``wire.decode_request`` (header, pre-pass, kio's native reader),
  for scale.

    .venv/bin/python bench/request_prepass.py [--requests 20000] [--runs 5]
"""

from __future__ import annotations

import argparse
import statistics
import struct
import time
from functools import partial

from headrace.protocol import prepass, wire
from headrace.protocol.varint import read_unsigned
from headrace.protocol.wire import MalformedFrame

FETCH_PARTITIONS = 6
_INT16, _INT32 = struct.Struct(">h"), struct.Struct(">i")


def typical_requests() -> dict[str, bytes]:
    """Request frames (without length prefix) as clients send them."""
    fetch = {"replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 52428800,
             "session_epoch": -1, "topics": [{"topic": "orders", "partitions": [
                 {"partition": p, "fetch_offset": 1000 + p, "partition_max_bytes": 1048576}
                 for p in range(FETCH_PARTITIONS)]}]}
    commit = {"group_id": "consumers", "generation_id_or_member_epoch": 3,
              "member_id": "rdkafka-1f2e", "topics": [{"name": "orders", "partitions": [
                  {"partition_index": p, "committed_offset": 1000 + p}
                  for p in range(FETCH_PARTITIONS)]}]}
    produce = {"acks": -1, "timeout": 30000, "topic_data": [
        {"name": "orders", "partition_data": [{"index": 0, "records": b"\x00" * 512}]}]}
    described = {
        "Fetch v12, 6 partitions": (1, 12, fetch),
        "Fetch v4, 6 partitions": (1, 4, fetch),
        "Metadata v12, 3 topics": (3, 12, {"topics": [{"name": f"topic-{i}"} for i in range(3)]}),
        "Heartbeat v4": (12, 4, {"group_id": "consumers", "generation_id": 3,
                                 "member_id": "rdkafka-1f2e"}),
        "OffsetCommit v8, 6 partitions": (8, 8, commit),
        "Produce v9, 512 B": (0, 9, produce),
    }
    return {name: wire.encode_request(key, version, 1, "rdkafka",
                                      wire.build(wire.request_class(key, version), values))[4:]
            for name, (key, version, values) in described.items()}


class PythonWalk:
    """The pre-pass program walked in Python: the alternative the C walker replaced."""

    def __init__(self, program: prepass.Program) -> None:
        words = program.words.tolist()
        self.flexible, struct_count, op_count, tag_count = words[:4]
        at = 4
        self.structs = [words[at + 4 * i: at + 4 * i + 4] for i in range(struct_count)]
        at += 4 * struct_count
        self.ops = [tuple(words[at + 4 * i: at + 4 * i + 4]) for i in range(op_count)]
        at += 4 * op_count
        self.tags = [tuple(words[at + 2 * i: at + 2 * i + 2]) for i in range(tag_count)]

    def check(self, frame: bytes, position: int) -> int:
        return self.struct(frame, position, 0)

    def struct(self, frame: bytes, position: int, index: int) -> int:
        first_op, op_count, first_tag, tag_count = self.structs[index]
        for op in self.ops[first_op:first_op + op_count]:
            position = self.op(frame, position, op)
        if self.flexible:
            count, position = self.uvarint(frame, position)
            known = dict(self.tags[first_tag:first_tag + tag_count])
            for _ in range(count):
                tag, position = self.uvarint(frame, position)
                size, position = self.uvarint(frame, position)
                end = position + size
                if tag in known and self.op(frame, position, self.ops[known[tag]]) != end:
                    raise ValueError("tagged field size")
                position = end
        return position

    def op(self, frame: bytes, position: int, op: tuple) -> int:
        opcode, argument, nullable, item_min_bytes = op
        if opcode == prepass.OP_FIXED:
            return self.fits(frame, position + argument)
        if opcode in (prepass.OP_STRING, prepass.OP_BYTES):
            length, position = self.length(frame, position, _INT16 if opcode ==
                                           prepass.OP_STRING else _INT32)
            return position if length < 0 else self.fits(frame, position + length)
        if opcode == prepass.OP_STRUCT:
            return self.struct(frame, position, argument)
        count, position = self.length(frame, position, _INT32)
        if count > (len(frame) - position) // max(1, item_min_bytes or argument or 1):
            raise ValueError("count")
        for _ in range(max(count, 0)):
            if opcode == prepass.OP_ARRAY_STRUCT:
                position = self.struct(frame, position, argument)
            elif opcode == prepass.OP_ARRAY_FIXED:
                position = self.fits(frame, position + argument)
            else:
                length, position = self.length(frame, position, _INT16)
                position = self.fits(frame, position + length)
        return position

    def length(self, frame: bytes, position: int, legacy: struct.Struct) -> tuple[int, int]:
        if self.flexible:
            value, position = self.uvarint(frame, position)
            return value - 1, position
        return legacy.unpack_from(frame, position)[0], position + legacy.size

    uvarint = staticmethod(partial(read_unsigned, error=MalformedFrame))

    @staticmethod
    def fits(frame: bytes, end: int) -> int:
        if end > len(frame):
            raise ValueError("overrun")
        return end


def microseconds_per_call(call, requests: int, runs: int) -> float:
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        for _ in range(requests):
            call()
        timings.append((time.perf_counter() - started) / requests * 1e6)
    return statistics.median(timings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    print(f"{'request':32} {'bytes':>6} {'prepass µs':>11} {'python walk µs':>15} "
          f"{'decode µs':>10}")
    for name, frame in typical_requests().items():
        header, position = wire.parse_request_header(frame)
        body_class = wire.request_class(header.api_key, header.api_version)
        if body_class.__flexible__:
            position = wire.skip_tagged_fields(frame, position)
        assert prepass.problem_in(body_class, frame, position) is None
        walk = PythonWalk(prepass.compile_program(body_class))
        assert walk.check(frame, position) <= len(frame)
        figures = [microseconds_per_call(call, args.requests, args.runs) for call in (
            partial(prepass.problem_in, body_class, frame, position),
            partial(walk.check, frame, position),
            partial(wire.decode_request, frame))]
        print(f"{name:32} {len(frame):>6} {figures[0]:>11.2f} {figures[1]:>15.2f} "
              f"{figures[2]:>10.2f}")


if __name__ == "__main__":
    main()
