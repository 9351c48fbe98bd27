"""The ``headrace`` entry point: lazy registration still offers every command, and
``headrace broker`` imports none of the client command modules (real subprocesses)."""

from __future__ import annotations

import subprocess
import sys

import typer

from headrace.cli import main

CLIENT_COMMAND_MODULES = ("headrace.cli.client_commands", "headrace.cli.groups",
                          "headrace.cli.cleaner", "headrace.cli.spark")


def _registered_command_names() -> set[str]:
    main.register_client_commands()
    group = typer.main.get_command(main.app)
    return set(group.commands)


def _headrace(*arguments: str, python_options: tuple[str, ...] = ()):
    return subprocess.run([sys.executable, *python_options, "-m", "headrace.cli.main",
                           *arguments], capture_output=True, text=True, timeout=120)


def test_help_lists_every_registered_command():
    names = _registered_command_names()
    assert {"broker", "topics", "produce", "consume", "groups", "cleaner", "spark"} <= names
    result = _headrace("--help")
    assert result.returncode == 0, result.stderr
    listed = {line.split()[1] for line in result.stdout.splitlines()
              if line.startswith("│ ") and len(line.split()) > 1}
    assert names <= listed


def test_broker_path_imports_no_client_command_module():
    result = _headrace("broker", "--help", python_options=("-X", "importtime"))
    assert result.returncode == 0 and "--override" in result.stdout
    imported = {line.rsplit("|", 1)[1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "headrace.cli" in imported  # the package of the module run as __main__
    assert not imported & set(CLIENT_COMMAND_MODULES)
