"""The file operations the storage engine performs, behind a small injectable interface.

Owns ``FileSystem`` (the protocol every storage module writes through) and ``RealFileSystem``
(thin wrappers over ``os``). Tests wrap the real one with a fault-injecting twin that tears or
drops writes which were not yet fsynced, so every durability claim is testable.

Files are addressed by path for namespace operations (rename, remove, listdir) and by integer
file descriptor for data operations (write, fsync, truncate), mirroring POSIX. Reads on the
hot path (``FileSlice.read_bytes`` and ``os.sendfile``) use the descriptors directly: faults
are only ever injected on the write side. Two hot writes bypass this interface and go from
the compiled kernel straight to a descriptor opened through it: a log whose file system is
exactly ``RealFileSystem`` (not a subclass or wrapper) writes plain produce batches that way
(``Log.append``'s single-batch path; any other file system sees every produce write), and the
cleaner's pass 2 writes the cleaned output of uncompressed batches to the ``.cleaned``
descriptor that way whatever the file system (opening, fsync and close still go through it, so
a double that models crashes by what was fsynced sees the same durable state).

Thread-safety: the real implementation is as thread-safe as the underlying system calls.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Protocol

APPEND_CREATE_FLAGS = os.O_RDWR | os.O_CREAT | os.O_APPEND
FILE_MODE = 0o644


class FileSystem(Protocol):
    def open(self, path: Path, flags: int) -> int: ...

    def close(self, fd: int) -> None: ...

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> int: ...

    def pread(self, fd: int, length: int, position: int) -> bytes: ...

    def fsync(self, fd: int) -> None: ...

    def truncate(self, fd: int, size_bytes: int) -> None: ...

    def size(self, fd: int) -> int: ...

    def rename(self, source: Path, target: Path) -> None: ...

    def remove(self, path: Path) -> None: ...

    def listdir(self, path: Path) -> list[str]: ...

    def mkdir(self, path: Path) -> None: ...

    def rmdir(self, path: Path) -> None: ...

    def exists(self, path: Path) -> bool: ...

    def is_dir(self, path: Path) -> bool: ...

    def fd_mtime_ms(self, fd: int) -> int: ...

    def set_mtime_ms(self, path: Path, mtime_ms: int) -> None: ...

    def fsync_dir(self, path: Path) -> None: ...


class RealFileSystem:
    """The operating system's file system."""

    def open(self, path: Path, flags: int) -> int:
        return os.open(path, flags, FILE_MODE)

    def close(self, fd: int) -> None:
        os.close(fd)

    def write(self, fd: int, data: bytes | bytearray | memoryview) -> int:
        written = os.write(fd, data)
        total = len(data)
        if written < total:  # short writes are legal; finish them
            view = memoryview(data)
            while written < total:
                written += os.write(fd, view[written:])
        return written

    def pread(self, fd: int, length: int, position: int) -> bytes:
        return os.pread(fd, length, position)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def truncate(self, fd: int, size_bytes: int) -> None:
        os.ftruncate(fd, size_bytes)

    def size(self, fd: int) -> int:
        return os.fstat(fd).st_size

    def rename(self, source: Path, target: Path) -> None:
        os.rename(source, target)

    def remove(self, path: Path) -> None:
        os.remove(path)

    def listdir(self, path: Path) -> list[str]:
        return os.listdir(path)

    def mkdir(self, path: Path) -> None:
        os.makedirs(path, exist_ok=True)

    def rmdir(self, path: Path) -> None:
        os.rmdir(path)

    def exists(self, path: Path) -> bool:
        return os.path.exists(path)

    def is_dir(self, path: Path) -> bool:
        return os.path.isdir(path)

    def fd_mtime_ms(self, fd: int) -> int:
        """The open file's last-modified time (still valid after a rename)."""
        return os.fstat(fd).st_mtime_ns // 1_000_000

    def set_mtime_ms(self, path: Path, mtime_ms: int) -> None:
        """Set the file's last-modified (and access) time, as Java's setLastModifiedTime."""
        mtime_ns = mtime_ms * 1_000_000
        os.utime(path, ns=(mtime_ns, mtime_ns))

    def fsync_dir(self, path: Path) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def write_file_atomically(fs: FileSystem, path: Path, content: bytes,
                          tmp_suffix: str = ".tmp") -> None:
    """Write ``content`` to ``path`` so that a crash leaves either the old or the new file:
    write a sibling named ``path`` + ``tmp_suffix``, fsync it, rename it over ``path``, fsync
    the directory."""
    tmp_path = path.with_name(path.name + tmp_suffix)
    fd = fs.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        fs.write(fd, content)
        fs.fsync(fd)
    finally:
        fs.close(fd)
    fs.rename(tmp_path, path)
    fs.fsync_dir(path.parent)


def read_whole_file(fs: FileSystem, path: Path) -> bytes:
    fd = fs.open(path, os.O_RDONLY)
    try:
        size_bytes = fs.size(fd)
        return fs.pread(fd, size_bytes, 0) if size_bytes else b""
    finally:
        fs.close(fd)


def remove_tree(fs: FileSystem, path: Path) -> None:
    """Remove a directory and everything in it (partition directories are flat)."""
    for name in fs.listdir(path):
        child = path / name
        if fs.is_dir(child):
            remove_tree(fs, child)
        else:
            fs.remove(child)
    fs.rmdir(path)
