"""Power-cut simulation: what a broker's data directory holds after the power fails.

Owns the LD_PRELOAD shim ``power_cut_shim.c`` (next to this module; ``build_shim`` compiles
it with gcc), ``record_baseline`` (the shadow directory a run starts from) and
``rebuild_after_power_cut`` (the data directory as a power cut would leave it). Used by the
fault harness's power nemesis and by ``tests/power_cut.py`` / ``bench/power_cuts.py``.

The shim records at sync points: every successful fsync/fdatasync of a file or directory
under the data directory copies what that call made durable (a file's content, a
directory's entries) into a shadow directory. No write is intercepted, so the broker's
production append path (the compiled kernel's writes included) is unchanged; a sync call the
shim does not know (sync_file_range, msync, syncfs, O_SYNC writes: headrace uses none) counts
as no sync, so an unknown call can only make the model stricter, never hide a loss.

Shadow directory format: ``files/<inode>`` the content of a file as of its last sync,
``dirs/<inode>`` its entries as of its last sync (lines ``f|d <inode> <name>``), ``root`` the
data directory's inode. ``record_baseline`` seeds it with the data directory as it is before
the broker starts (all of it durable: there was no power cut before the broker started).

The model after a cut: the data directory holds the entries of each directory's last sync
(an entry created or removed since is undone), each file the content of its last sync (a file
never synced is empty); with a ``random.Random``, each file whose current content extends its
durable content gets a seeded prefix of the unsynced extension (a torn tail). Limitations:
torn tails are prefixes (no later page persisted before an earlier one, no garbage); a file
copied at its sync may include writes another thread made after the sync (which a disk may
also have kept); a file never synced whose inode number reuses a deleted file's shows that
file's last synced content.

Thread-safety: none; one caller drives one broker's data directory.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SHIM_SOURCE = Path(__file__).with_name("power_cut_shim.c")


def shim_environment(data_dir: Path, shadow_dir: Path,
                     drop_fsync_suffix: str = "") -> dict[str, str]:
    """The variables the shim reads (``LD_PRELOAD`` is the caller's to compose)."""
    return {"POWER_CUT_DATA_DIR": str(data_dir), "POWER_CUT_SHADOW_DIR": str(shadow_dir),
            "POWER_CUT_DROP_FSYNC_SUFFIX": drop_fsync_suffix}


def shadow_dir_of(data_dir: Path) -> Path:
    return data_dir.with_name(data_dir.name + ".synced")


def build_shim(build_dir: Path) -> Path:
    """Compile the shim (once per source version) into ``build_dir``; returns the .so path."""
    return compile_preload_library(SHIM_SOURCE, build_dir)


def compile_preload_library(source: Path, build_dir: Path) -> Path:
    """Compile the LD_PRELOAD library ``source`` (once per source version) into
    ``build_dir``; returns the .so path."""
    build_dir.mkdir(parents=True, exist_ok=True)
    library = build_dir / f"{source.stem}-{source.stat().st_mtime_ns}.so"
    if not library.exists():
        partial = library.with_suffix(f".{os.getpid()}.tmp")
        subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Wextra", "-Werror",
                        "-pthread", "-o", str(partial), str(source), "-ldl"], check=True)
        partial.rename(library)
    return library


def record_baseline(data_dir: Path, shadow_dir: Path) -> None:
    """Reset ``shadow_dir`` to hold all of ``data_dir`` as durable."""
    shutil.rmtree(shadow_dir, ignore_errors=True)
    (shadow_dir / "files").mkdir(parents=True)
    (shadow_dir / "dirs").mkdir()
    (shadow_dir / "root").write_text(str(data_dir.stat().st_ino))
    for directory, subdirectories, files in os.walk(data_dir):
        lines = []
        for name in subdirectories:
            lines.append(f"d {(Path(directory) / name).stat().st_ino} {name}\n")
        for name in files:
            path = Path(directory) / name
            inode = path.stat().st_ino
            shutil.copyfile(path, shadow_dir / "files" / str(inode))
            lines.append(f"f {inode} {name}\n")
        inode = Path(directory).stat().st_ino
        (shadow_dir / "dirs" / str(inode)).write_text("".join(lines))


def _listing(shadow_dir: Path, inode: str) -> list[tuple[str, str, str]]:
    path = shadow_dir / "dirs" / inode
    if not path.exists():
        return []
    return [tuple(line.split(" ", 2)) for line in path.read_text().splitlines()]


def _current_files_by_inode(data_dir: Path) -> dict[str, Path]:
    found = {}
    for directory, _, files in os.walk(data_dir):
        for name in files:
            path = Path(directory) / name
            found[str(path.stat().st_ino)] = path
    return found


@dataclass
class CutOutcome:
    """What a cut did to unsynced bytes: how many it dropped, how many it kept as torn
    tails."""

    dropped_bytes: int = 0
    torn_tail_bytes: int = 0


def _durable_content(shadow_dir: Path, inode: str, current: bytes | None,
                     rng: random.Random | None, outcome: CutOutcome) -> bytes:
    synced_path = shadow_dir / "files" / inode
    durable = synced_path.read_bytes() if synced_path.exists() else b""
    if current is None:
        return durable
    if rng is not None and len(current) > len(durable) and current.startswith(durable):
        kept = rng.randint(0, len(current) - len(durable))
        outcome.torn_tail_bytes += kept
        durable = current[:len(durable) + kept]
    outcome.dropped_bytes += max(0, len(current) - len(durable))
    return durable


def _materialise(shadow_dir: Path, inode: str, target: Path, current: dict[str, Path],
                 rng: random.Random | None, outcome: CutOutcome) -> None:
    target.mkdir()
    for kind, entry_inode, name in _listing(shadow_dir, inode):
        if kind == "d":
            _materialise(shadow_dir, entry_inode, target / name, current, rng, outcome)
            continue
        source = current.get(entry_inode)
        current_content = source.read_bytes() if source is not None else None
        (target / name).write_bytes(
            _durable_content(shadow_dir, entry_inode, current_content, rng, outcome))


def rebuild_after_power_cut(data_dir: Path, shadow_dir: Path,
                            rng: random.Random | None = None) -> CutOutcome:
    """Replace ``data_dir`` (its writer dead) by what a power cut would have left of it."""
    outcome = CutOutcome()
    staging = data_dir.with_name(data_dir.name + ".after-power-cut")
    shutil.rmtree(staging, ignore_errors=True)
    root_inode = (shadow_dir / "root").read_text()
    _materialise(shadow_dir, root_inode, staging, _current_files_by_inode(data_dir), rng,
                 outcome)
    shutil.rmtree(data_dir)
    staging.rename(data_dir)
    return outcome
