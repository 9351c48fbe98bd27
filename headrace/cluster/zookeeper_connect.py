"""``zookeeper.connect`` parsed: the server list and the chroot (``ZooKeeperConnect``).

Owns the connect-string rules of ZooKeeper's ``ConnectStringParser``, apart from the session
so that the broker's config check imports no ZooKeeper client. Pure; thread-safe.
"""

from __future__ import annotations

from dataclasses import dataclass

from headrace.errors import InvalidConfig


@dataclass(frozen=True, slots=True)
class ZooKeeperConnect:
    """A parsed ``zookeeper.connect``: the server list and the chroot (None for the root)."""

    hosts: str
    chroot: str | None

    @property
    def connect_string(self) -> str:
        return self.hosts + (self.chroot or "")


def parse_zookeeper_connect(value: str) -> ZooKeeperConnect:
    """ZooKeeper's ConnectStringParser rules: the chroot starts at the first '/'; '/' alone is
    the root; a chroot must be a valid path (no trailing '/', no empty, '.' or '..' part)."""
    value = value.strip()
    hosts, slash, chroot = value.partition("/")
    if not hosts or any(not host.strip() for host in hosts.split(",")):
        raise InvalidConfig(f"Invalid value {value!r} for configuration zookeeper.connect: "
                            "expected host:port[,host:port...][/chroot]")
    if not slash or chroot == "":
        return ZooKeeperConnect(hosts, None)
    parts = chroot.split("/")
    if any(part in ("", ".", "..") for part in parts) or "\0" in chroot:
        raise InvalidConfig(f"Invalid value {value!r} for configuration zookeeper.connect: "
                            f"invalid chroot path /{chroot}")
    return ZooKeeperConnect(hosts, "/" + chroot)
