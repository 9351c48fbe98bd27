"""``headrace cluster up``: a real ensemble and three brokers; the printed bootstrap list works
for kcat; Ctrl-C (SIGINT) stops every process it started, checked by pid."""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kazoo.client import KazooClient

STARTUP_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 60.0
KCAT_TIMEOUT_S = 30.0


def _read_values(process: subprocess.Popen, prefixes: tuple[str, ...],
                 timeout_s: float) -> list[str]:
    """What follows each prefix on the first stdout line starting with it, within
    ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    buffered = b""
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            lines = buffered.decode(errors="replace").splitlines()
            found = {prefix: line.removeprefix(prefix) for prefix in prefixes
                     for line in lines if line.startswith(prefix)}
            if len(found) == len(prefixes):
                return [found[prefix] for prefix in prefixes]
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0 or not selector.select(remaining_s):
                pytest.fail(f"not all of {prefixes} within {timeout_s} s: {buffered!r}")
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                pytest.fail(f"cluster up exited ({process.wait()}): {buffered!r}")
            buffered += chunk


def _children_of(pid: int) -> set[int]:
    children = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                children.add(int(entry.name))
    return children


def _alive(pid: int) -> bool:
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat not installed")
def test_cluster_up_serves_three_registered_brokers_and_ctrl_c_stops_every_process(tmp_path):
    command = [sys.executable, "-m", "headrace.cli.main", "cluster", "up", "--brokers", "3",
               "--base-dir", str(tmp_path), "--first-port", "0"]
    up = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                          stdin=subprocess.DEVNULL)
    started: set[int] = set()
    try:
        connect, bootstrap = _read_values(
            up, ("zookeeper.connect: ", "bootstrap servers: "), STARTUP_TIMEOUT_S)
        started = _children_of(up.pid)
        assert len(started) == 3 + 3  # three brokers, three ZooKeeper nodes

        client = KazooClient(hosts=connect)
        client.start(timeout=KCAT_TIMEOUT_S)
        assert sorted(client.get_children("/brokers/ids")) == ["1", "2", "3"]
        client.stop()
        client.close()
        listing = subprocess.run(["kcat", "-L", "-b", bootstrap, "-m", str(int(KCAT_TIMEOUT_S))],
                                 capture_output=True, text=True, timeout=KCAT_TIMEOUT_S * 2)
        assert listing.returncode == 0, listing.stderr
        assert "brokers:" in listing.stdout

        up.send_signal(signal.SIGINT)
        assert up.wait(timeout=STOP_TIMEOUT_S) == 0
        assert [pid for pid in started if _alive(pid)] == []
    finally:  # after a failure: leave nothing behind, by pid
        if up.poll() is None:
            started |= _children_of(up.pid)
            up.kill()
            up.wait()
        for pid in started:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
