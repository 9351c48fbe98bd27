"""A network namespace for nodes under test, their loopback addresses, and iptables cuts.

``Namespace`` owns one ``ip netns`` namespace named ``hr-<pid>-<n>``: its loopback is brought
up and given the 127.0.0.x addresses the nodes listen on, so a rule can cut the link between
two chosen addresses. Processes run inside it through ``command_prefix`` (``ip netns exec``
execs the command without forking, so a node's pid is the broker's own); code of this process
runs inside it through ``run_inside`` (a fresh thread that joins the namespace with setns(2):
sockets it opens, and threads it starts, such as librdkafka's, live there).

Cuts are iptables rules in the namespace's INPUT chain, each ``-s FROM -d TO -j DROP`` with a
comment naming the rule (``hr-cut-<n>``); ``heal`` deletes one by its exact specification,
``remove`` deletes every rule and then the namespace, by name. Only loopback addresses are
ever used. Needs root, ``ip`` (iproute2) and ``iptables``; ``missing_tools`` says what is not
there.

Thread-safety: one thread drives a ``Namespace``; ``run_inside`` may be called from any.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

CLONE_NEWNET = 0x40000000
COMMAND_TIMEOUT_S = 10.0
NETNS_DIR = "/run/netns"
REQUIRED_TOOLS = ("ip", "iptables")
_names = itertools.count()
Result = TypeVar("Result")


def missing_tools() -> list[str]:
    """What this machine lacks to create namespaces and rules (empty when nothing)."""
    missing = [tool for tool in REQUIRED_TOOLS if shutil.which(tool) is None]
    if os.geteuid() != 0:
        missing.append("root")
    return missing


@dataclass(frozen=True)
class Cut:
    """One iptables rule dropping packets from ``source`` to ``destination``."""

    rule_id: str
    source: str
    destination: str

    def spec(self) -> list[str]:
        return ["INPUT", "-s", self.source, "-d", self.destination, "-m", "comment",
                "--comment", self.rule_id, "-j", "DROP"]


class Namespace:
    def __init__(self) -> None:
        self.name = f"hr-{os.getpid()}-{next(_names)}"
        self.addresses: list[str] = []
        self.cuts: list[Cut] = []
        self._rule_ids = itertools.count()
        self._created = False

    def create(self, addresses: list[str]) -> None:
        _run(["ip", "netns", "add", self.name])
        self._created = True
        self._inside(["ip", "link", "set", "lo", "up"])
        for address in addresses:
            self.add_address(address)

    def add_address(self, address: str) -> None:
        if not address.startswith("127."):
            raise ValueError(f"{address}: only loopback addresses are used")
        if address != "127.0.0.1":
            self._inside(["ip", "addr", "add", f"{address}/8", "dev", "lo"])
        self.addresses.append(address)

    def command_prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.name]

    def cut(self, source: str, destination: str) -> Cut:
        """Drop every packet from ``source`` to ``destination`` (a one-way cut)."""
        cut = Cut(f"hr-cut-{next(self._rule_ids)}", source, destination)
        self._inside(["iptables", "-w", "-A", *cut.spec()])
        self.cuts.append(cut)
        return cut

    def cut_both_ways(self, one: str, other: str) -> list[Cut]:
        return [self.cut(one, other), self.cut(other, one)]

    def heal(self, cut: Cut) -> None:
        self._inside(["iptables", "-w", "-D", *cut.spec()])
        self.cuts.remove(cut)

    def heal_all(self) -> None:
        for cut in list(self.cuts):
            self.heal(cut)

    def dropped_packets(self, cut: Cut) -> int:
        """How many packets ``cut`` has dropped so far (its rule's counter)."""
        listing = self._inside(["iptables", "-w", "-L", "INPUT", "-v", "-x", "-n"])
        for line in listing.splitlines():
            if f"/* {cut.rule_id} */" in line:
                return int(line.split()[0])
        raise LookupError(f"no rule {cut.rule_id} in namespace {self.name}")

    def remove(self) -> None:
        """Delete every rule made here, then the namespace (its processes must be gone)."""
        if not self._created:
            return
        try:
            self.heal_all()
        finally:
            _run(["ip", "netns", "delete", self.name])
            self._created = False

    def run_inside(self, function: Callable[[], Result], timeout_s: float) -> Result:
        """Call ``function`` on a new thread inside the namespace; its result or exception."""
        outcome: dict[str, object] = {}

        def body() -> None:
            try:
                self.enter_current_thread()
                outcome["result"] = function()
            except BaseException as error:  # noqa: BLE001 -- handed to the caller
                outcome["error"] = error

        thread = threading.Thread(target=body, name=f"in-{self.name}", daemon=True)
        thread.start()
        thread.join(timeout_s)
        if thread.is_alive():
            raise TimeoutError(f"call inside {self.name} took over {timeout_s} s")
        if "error" in outcome:
            raise outcome["error"]
        return outcome["result"]

    def enter_current_thread(self) -> None:
        """Move the calling thread (only it) into the namespace, for good."""
        libc = ctypes.CDLL(None, use_errno=True)
        descriptor = os.open(os.path.join(NETNS_DIR, self.name), os.O_RDONLY)
        try:
            if libc.setns(descriptor, CLONE_NEWNET) != 0:
                error = ctypes.get_errno()
                raise OSError(error, f"setns into {self.name}: {os.strerror(error)}")
        finally:
            os.close(descriptor)

    def _inside(self, command: list[str]) -> str:
        return _run([*self.command_prefix(), *command])

    def __enter__(self) -> Namespace:
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def _run(command: list[str]) -> str:
    completed = subprocess.run(command, capture_output=True, text=True,
                               timeout=COMMAND_TIMEOUT_S)
    if completed.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed: {completed.stderr.strip()}")
    return completed.stdout
