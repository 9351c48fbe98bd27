"""Group coordinator benchmark: commit throughput and latency, rebalance time; headrace and the
Tansu peer measured in the same run.

Figures (confluent-kafka clients on 127.0.0.1):

* sustained synchronous OffsetCommits per second from one consumer (assign(), one partition,
  a new offset each time) for ``--commit-seconds``, with p50/p99 commit latency in ms;
* the time for a 10-member group (10 partitions, range assignor, eager protocol) to be
  stable again after one member leaves (close() sends LeaveGroup): from close() until the 9
  remaining members own every partition exactly once. Median of ``--rebalance-repeats``.

Usage::

    .venv/bin/python bench/groups.py                       # headrace, then Tansu (run-peer.sh)
    .venv/bin/python bench/groups.py --bootstrap HOST:PORT # one broker, one JSON line

Scratch data under /tmp/groups-bench. Runs on the main thread plus one thread per member.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO = Path(__file__).resolve().parent.parent
PEER_RUNNER = Path(__file__).resolve().parents[2] / "shared" / "bench" / "run-peer.sh"
SCRATCH = Path("/tmp/groups-bench")
GROUP_MEMBERS = 10
TIMEOUT_S = 60
POLL_INTERVAL_S = 0.05
STARTUP_TIMEOUT_S = 30


def _create_topic(bootstrap: str, partitions: int) -> str:
    topic = f"gbench-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(TIMEOUT_S)
    return topic


def measure_commits(bootstrap: str, seconds: float) -> dict:
    topic = _create_topic(bootstrap, 1)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"commits-{uuid.uuid4()}",
                         "enable.auto.commit": False})
    latencies_ms: list[float] = []
    try:
        consumer.commit(offsets=[TopicPartition(topic, 0, 0)], asynchronous=False)  # warm up
        start = time.perf_counter()
        offset = 1
        while time.perf_counter() - start < seconds:
            before = time.perf_counter()
            consumer.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
            latencies_ms.append((time.perf_counter() - before) * 1000)
            offset += 1
        elapsed_s = time.perf_counter() - start
    finally:
        consumer.close()
    latencies_ms.sort()
    return {"commits_per_s": round(len(latencies_ms) / elapsed_s, 1),
            "commit_p50_ms": round(latencies_ms[len(latencies_ms) // 2], 3),
            "commit_p99_ms": round(latencies_ms[int(len(latencies_ms) * 0.99)], 3)}


class _Member(threading.Thread):
    def __init__(self, bootstrap: str, group: str, topic: str, board: threading.Condition):
        super().__init__(daemon=True)
        self.board = board
        self.owned: set[int] = set()
        self.leave = threading.Event()
        self.left = threading.Event()
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                                  "session.timeout.ms": 10000, "heartbeat.interval.ms": 500,
                                  "partition.assignment.strategy": "range"})
        self.consumer.subscribe([topic], on_assign=self._assigned, on_revoke=self._revoked)

    def _assigned(self, _consumer, partitions) -> None:
        with self.board:
            self.owned = {p.partition for p in partitions}
            self.board.notify_all()

    def _revoked(self, _consumer, _partitions) -> None:
        with self.board:
            self.owned = set()
            self.board.notify_all()

    def run(self) -> None:
        while not self.leave.is_set():
            self.consumer.poll(POLL_INTERVAL_S)
        self.consumer.close()
        self.left.set()


def _settled(members: list[_Member], partitions: int) -> bool:
    owned = [p for m in members for p in m.owned]
    return (all(m.owned for m in members) and len(owned) == len(set(owned))
            and set(owned) == set(range(partitions)))


def _wait(board: threading.Condition, condition) -> None:
    deadline = time.monotonic() + TIMEOUT_S
    with board:
        while not condition():
            if time.monotonic() > deadline:
                raise TimeoutError("the group did not settle")
            board.wait(deadline - time.monotonic())


def measure_rebalance(bootstrap: str) -> float:
    """Seconds from one member's close() until the other nine own every partition."""
    topic = _create_topic(bootstrap, GROUP_MEMBERS)
    board = threading.Condition()
    group = f"rebalance-{uuid.uuid4()}"
    members = [_Member(bootstrap, group, topic, board) for _ in range(GROUP_MEMBERS)]
    for member in members:
        member.start()
    try:
        _wait(board, lambda: _settled(members, GROUP_MEMBERS))
        leaver, stayers = members[0], members[1:]
        started = time.perf_counter()
        leaver.leave.set()
        leaver.left.wait(TIMEOUT_S)
        _wait(board, lambda: _settled(stayers, GROUP_MEMBERS)
              and all(len(m.owned) >= 1 for m in stayers)
              and sum(len(m.owned) for m in stayers) == GROUP_MEMBERS
              and max(len(m.owned) for m in stayers) == 2)
        return time.perf_counter() - started
    finally:
        for member in members:
            member.leave.set()
        for member in members:
            member.join(TIMEOUT_S)


def run_one(bootstrap: str, commit_seconds: float, repeats: int) -> dict:
    figures = measure_commits(bootstrap, commit_seconds)
    rebalances = [measure_rebalance(bootstrap) for _ in range(repeats)]
    figures["rebalance_after_leave_s_median"] = round(statistics.median(rebalances), 3)
    figures["rebalance_after_leave_s_all"] = [round(r, 3) for r in rebalances]
    return figures


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _start_headrace() -> tuple[subprocess.Popen, str]:
    data_dir = SCRATCH / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    port = _free_port()
    command = [sys.executable, "-m", "headrace.cli.main", "broker",
               "--override", f"listeners=PLAINTEXT://127.0.0.1:{port}",
               "--override", f"log.dirs={data_dir}"]
    log_file = open(SCRATCH / "broker.log", "wb")  # noqa: SIM115 -- owned by the subprocess
    process = subprocess.Popen(command, stdout=log_file, stderr=subprocess.STDOUT, cwd=REPO)
    log_file.close()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError("headrace did not start")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", help="measure this broker only and print one JSON line")
    parser.add_argument("--commit-seconds", type=float, default=5.0)
    parser.add_argument("--rebalance-repeats", type=int, default=3)
    args = parser.parse_args()
    if args.bootstrap:
        print(json.dumps(run_one(args.bootstrap, args.commit_seconds, args.rebalance_repeats)))
        return
    SCRATCH.mkdir(parents=True, exist_ok=True)
    process, bootstrap = _start_headrace()
    try:
        headrace = run_one(bootstrap, args.commit_seconds, args.rebalance_repeats)
    finally:
        process.terminate()
        process.wait(TIMEOUT_S)
    own_command = (f"{sys.executable} {Path(__file__).resolve()} --bootstrap $BOOTSTRAP "
                   f"--commit-seconds {args.commit_seconds} "
                   f"--rebalance-repeats {args.rebalance_repeats}")
    peer_run = subprocess.run([str(PEER_RUNNER), "--", "sh", "-c", own_command],
                              capture_output=True, text=True, env={**os.environ})
    peer_lines = [line for line in peer_run.stdout.splitlines() if line.startswith("{")]
    peer = json.loads(peer_lines[-1]) if peer_lines else {"error": peer_run.stderr[-500:]}
    print("command: " + " ".join([sys.executable, *sys.argv]))
    print(f"{'figure':34} {'headrace':>12} {'tansu':>12}")
    for key in ("commits_per_s", "commit_p50_ms", "commit_p99_ms",
                "rebalance_after_leave_s_median"):
        print(f"{key:34} {headrace.get(key)!s:>12} {peer.get(key, '-')!s:>12}")
    print(json.dumps({"headrace": headrace, "tansu": peer}))


if __name__ == "__main__":
    main()
