"""What this machine's kernel, CPU and test file system offer, and whether tests may
mount a tmpfs (to make a full disk), for the ``required_where`` marker.

A test that skips because a feature is missing (cachestat on kernels before 6.5, O_DIRECT on
tmpfs, a CRC-32C variant the CPU lacks, root with ip and iptables for network namespaces,
libfaketime) is marked ``@pytest.mark.required_where("feature", ...)``; the conftest hook
turns its skip into a failure when every named feature's probe here finds the feature present,
so a skip never hides a broken test on a machine meant to run it. Probes run once per process
(cached); each is a system call or a look at the kernel module.
Thread-safety: the cache is functools.cache; probes touch only their own temporary files.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import subprocess
import tempfile

CACHESTAT_SYSCALL = 451  # the same number on every architecture


class _CachestatRange(ctypes.Structure):
    _fields_ = [("off", ctypes.c_uint64), ("len", ctypes.c_uint64)]


class _Cachestat(ctypes.Structure):
    _fields_ = [(name, ctypes.c_uint64) for name in (
        "nr_cache", "nr_dirty", "nr_writeback", "nr_evicted", "nr_recently_evicted")]


def cachestat(fd: int) -> _Cachestat | None:
    """The page-cache figures of the whole file ``fd``, or None where cachestat(2) fails."""
    libc = ctypes.CDLL(None, use_errno=True)
    result = _Cachestat()
    if libc.syscall(CACHESTAT_SYSCALL, fd, ctypes.byref(_CachestatRange(0, 0)),
                    ctypes.byref(result), 0) != 0:
        return None
    return result


@functools.cache
def _cachestat_present() -> bool:
    with tempfile.TemporaryFile() as probe:
        return cachestat(probe.fileno()) is not None


@functools.cache
def _o_direct_present() -> bool:
    """Whether the file system of the temporary directory (where pytest's tmp_path lives)
    accepts O_DIRECT."""
    with tempfile.TemporaryDirectory() as directory:
        try:
            os.close(os.open(os.path.join(directory, "probe"),
                             os.O_WRONLY | os.O_CREAT | os.O_DIRECT))
        except OSError as error:
            if error.errno != errno.EINVAL:
                raise
            return False
    return True


@functools.cache
def _tmpfs_mount_present() -> bool:
    """Whether this process may mount a size-limited tmpfs (root, as on CI): tests that need a
    full disk make one that way."""
    with tempfile.TemporaryDirectory() as directory:
        if not mount_tmpfs(directory, size_bytes=1 << 20):
            return False
        unmount(directory)
    return True


def mount_tmpfs(directory: str, size_bytes: int) -> bool:
    """Mount a tmpfs of ``size_bytes`` on ``directory``; False where mounting is not allowed."""
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs",
                             directory], capture_output=True, check=False)
    return result.returncode == 0


def unmount(directory: str) -> None:
    subprocess.run(["umount", "-l", directory], capture_output=True, check=True)


def _crc32c_variant_present(variant: str) -> bool:
    from headrace.protocol import kernel  # imported when asked: conftest loads this module

    return variant in kernel.CRC32C_VARIANTS_SUPPORTED


def _netns_present() -> bool:
    """Root, iproute2 and iptables: what the fault harness needs for namespaces and cuts."""
    from headrace.faults.namespace import missing_tools

    return not missing_tools()


def _faketime_present() -> bool:
    from headrace.faults.node import libfaketime_path

    return libfaketime_path() is not None


FEATURE_PROBES = {
    "netns": _netns_present,
    "faketime": _faketime_present,
    "cachestat": _cachestat_present,
    "o_direct": _o_direct_present,
    "tmpfs_mount": _tmpfs_mount_present,
    **{f"crc32c_{variant}": functools.partial(_crc32c_variant_present, variant)
       for variant in ("portable", "interleaved", "folded")},
}


def present(feature: str) -> bool:
    """Whether ``feature`` (a key of FEATURE_PROBES) is available here."""
    return FEATURE_PROBES[feature]()
