"""Test double: a file system that loses or tears writes not yet fsynced when it 'crashes'."""

from __future__ import annotations

import os
import random
from pathlib import Path

from headrace.storage.fs import RealFileSystem


class CrashingFileSystem(RealFileSystem):
    """Tracks, per path, the size made durable by the last fsync. ``crash()`` then cuts every
    file back to a random point between that size and its current size and fills part of the
    lost range with garbage (an inode that grew before its data was written)."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.path_of_fd: dict[int, Path] = {}
        self.synced_size: dict[Path, int] = {}

    def open(self, path: Path, flags: int) -> int:
        fd = super().open(path, flags)
        self.path_of_fd[fd] = Path(path)
        self.synced_size.setdefault(Path(path), os.fstat(fd).st_size)
        return fd

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self.synced_size[self.path_of_fd[fd]] = os.fstat(fd).st_size

    def truncate(self, fd: int, size_bytes: int) -> None:
        super().truncate(fd, size_bytes)
        path = self.path_of_fd[fd]
        self.synced_size[path] = min(self.synced_size.get(path, 0), size_bytes)

    def rename(self, source: Path, target: Path) -> None:
        super().rename(source, target)
        if Path(source) in self.synced_size:
            self.synced_size[Path(target)] = self.synced_size.pop(Path(source))

    def crash(self) -> int:
        """Tear every file's unsynced tail; returns how many files were torn."""
        torn = 0
        for path, synced in list(self.synced_size.items()):
            if not path.exists():
                continue
            size = path.stat().st_size
            if size <= synced:
                continue
            keep = self.rng.randint(synced, size)
            with open(path, "r+b") as handle:
                handle.truncate(keep)
                if keep > synced and self.rng.random() < 0.5:
                    garbage_start = self.rng.randint(synced, keep)
                    handle.seek(garbage_start)
                    handle.write(self.rng.randbytes(keep - garbage_start))
            torn += 1
        self.synced_size.clear()
        self.path_of_fd.clear()
        return torn


class MetadataForgettingFileSystem(RealFileSystem):
    """A power loss that forgets the metadata changes not yet made durable: a truncation
    until an fsync of the file, a rename until an fsync of its directory. ``crash()`` puts
    back the truncated bytes and undoes the renames (data writes are kept: only metadata is
    modelled here)."""

    def __init__(self) -> None:
        self.path_of_fd: dict[int, Path] = {}
        self.content_before_truncation: dict[Path, bytes] = {}
        self.unsynced_renames: list[tuple[Path, Path]] = []

    def open(self, path: Path, flags: int) -> int:
        fd = super().open(path, flags)
        self.path_of_fd[fd] = Path(path)
        return fd

    def truncate(self, fd: int, size_bytes: int) -> None:
        path = self.path_of_fd[fd]
        if path not in self.content_before_truncation:
            self.content_before_truncation[path] = os.pread(fd, os.fstat(fd).st_size, 0)
        super().truncate(fd, size_bytes)

    def fsync(self, fd: int) -> None:
        super().fsync(fd)
        self.content_before_truncation.pop(self.path_of_fd.get(fd), None)

    def rename(self, source: Path, target: Path) -> None:
        super().rename(source, target)
        self.unsynced_renames.append((Path(source), Path(target)))

    def fsync_dir(self, path: Path) -> None:
        super().fsync_dir(path)
        self.unsynced_renames = [(source, target) for source, target in self.unsynced_renames
                                 if Path(target).parent != Path(path)]

    def crash(self) -> None:
        for source, target in reversed(self.unsynced_renames):
            if target.exists():
                os.rename(target, source)
        for path, content in self.content_before_truncation.items():
            if path.exists():
                path.write_bytes(content)
        self.unsynced_renames, self.content_before_truncation = [], {}
