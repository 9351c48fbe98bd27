"""Runs the installed ``headrace`` script in a subprocess, as a user would."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

HEADRACE = Path(sys.executable).parent / "headrace"
COMMAND_TIMEOUT_S = 60


def run(*args: str, stdin: bytes | None = None, env: dict[str, str] | None = None
        ) -> subprocess.CompletedProcess:
    """``headrace ARGS...``; stdout and stderr captured as bytes."""
    return subprocess.run([str(HEADRACE), *args], input=stdin, capture_output=True,
                          timeout=COMMAND_TIMEOUT_S, env=env)


def run_ok(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess:
    result = run(*args, stdin=stdin)
    assert result.returncode == 0, result.stderr.decode()
    return result


def run_json(*args: str, stdin: bytes | None = None) -> object:
    return json.loads(run_ok(*args, "--output", "json", stdin=stdin).stdout)


def assert_user_error(result: subprocess.CompletedProcess, fragment: str) -> None:
    """Non-zero exit, one line on stderr naming the problem, no traceback."""
    stderr = result.stderr.decode()
    assert result.returncode != 0
    assert fragment in stderr, stderr
    assert stderr.count("\n") == 1 and stderr.startswith("headrace: "), stderr
    assert "Traceback" not in stderr


def unique_topic(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"
