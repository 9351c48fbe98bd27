"""Python environments built the way a user builds them, for the install and cluster tests.

Owns: copying the checkout's packaging files and packages (``copy_checkout``, so that building
them never rewrites the compiled extensions a running broker has loaded), building a wheel of
that copy (``build_wheel``), a fresh virtual environment (``new_environment``) whose
site-packages reaches this interpreter's dependencies (pyspark, pyarrow, confluent-kafka,
setuptools) through a .pth path entry instead of downloading them again, installing into it
(``pip_install``), and the environment of a shell with no virtual environment activated
(``user_environment``).

The .pth entry adds this interpreter's site-packages as a plain path: the .pth files found
there (this checkout's editable install among them) are not processed, so headrace is
importable in a new environment only once something installs it there.
Stateless; every function blocks until its subprocess is done.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

REPOSITORY_ROOT = Path(__file__).resolve().parents[2]
CHECKOUT_ENTRIES = ("pyproject.toml", "setup.py", "README.md", "headrace", "pyspark_headrace",
                    "examples")
INSTALL_TIMEOUT_S = 300
# Variables that would let Spark or Python find the checkout or the test's interpreter
# without the installation: a user's shell has none of them.
SCRUBBED_VARIABLES = ("PYTHONPATH", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV",
                      "SPARK_HOME", "PYTHONHOME", "SPARK_CONF_DIR")


def copy_checkout(destination: Path) -> Path:
    ignore = shutil.ignore_patterns("__pycache__", "*.so", "*.egg-info")
    destination.mkdir()
    for entry in CHECKOUT_ENTRIES:
        source = REPOSITORY_ROOT / entry
        if source.is_dir():
            shutil.copytree(source, destination / entry, ignore=ignore)
        else:
            shutil.copy2(source, destination / entry)
    return destination


def build_wheel(checkout: Path, wheel_dir: Path) -> Path:
    """``pip wheel`` of ``checkout`` (no downloads, no build isolation); the wheel's path."""
    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-index",
                             "--no-build-isolation", "--wheel-dir", str(wheel_dir),
                             str(checkout)],
                            capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr
    (wheel,) = wheel_dir.glob("headrace-*.whl")
    return wheel


def new_environment(directory: Path) -> Path:
    """A venv whose site-packages reaches this interpreter's dependencies; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)],
                   check=True, timeout=INSTALL_TIMEOUT_S)
    python = directory / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_path('purelib'))"],
                             check=True, capture_output=True, text=True).stdout.strip()
    Path(purelib, "headrace-test-dependencies.pth").write_text(
        sysconfig.get_path("purelib") + "\n")
    return python


def pip_install(python: Path, *arguments: str) -> None:
    command = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps",
               "--no-index", "--no-build-isolation", *arguments]
    result = subprocess.run(command, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S)
    assert result.returncode == 0, result.stdout + result.stderr


def user_environment() -> dict[str, str]:
    """os.environ as in a shell with no virtual environment activated."""
    environment = {key: value for key, value in os.environ.items()
                   if key not in SCRUBBED_VARIABLES}
    paths = environment.get("PATH", "").split(os.pathsep)
    environment["PATH"] = os.pathsep.join(path for path in paths
                                          if not Path(path, "pyvenv.cfg").exists()
                                          and not Path(path, "..", "pyvenv.cfg").exists())
    return environment


def without_java_frames(stderr: str, limit_chars: int = 6000) -> str:
    lines = [line for line in stderr.splitlines()
             if not line.lstrip().startswith(("at ", "... "))]
    return "\n".join(lines)[-limit_chars:]
