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


def test_binary_config_file_is_a_one_line_error(tmp_path):
    config = tmp_path / "server.properties"
    config.write_bytes(b"listeners=PLAINTEXT://127.0.0.1:0\n\x89PNG\r\n\x1a\n\x00\xff\xfe")
    result = _headrace("broker", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr, result.stderr
    assert str(config) in result.stderr and "byte 34" in result.stderr, result.stderr


def test_config_file_with_a_nul_byte_is_a_one_line_error(tmp_path):
    config = tmp_path / "server.properties"
    text = f"listeners=PLAINTEXT://127.0.0.1:0\nlog.dirs={tmp_path / 'data'}\n".encode()
    config.write_bytes(text + b"\x00\x00")
    result = _headrace("broker", "--config", str(config))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"NUL byte at byte {len(text)}" in result.stderr, result.stderr


def _leaf_commands(command, path: tuple[str, ...] = ()):
    if hasattr(command, "commands"):
        for name, sub in command.commands.items():
            yield from _leaf_commands(sub, (*path, name))
    else:
        yield " ".join(path), command


def test_every_client_command_takes_output_json():
    """README: every command but the broker itself prints JSON with ``--output json``."""
    main.register_client_commands()
    without = {path for path, command in _leaf_commands(typer.main.get_command(main.app))
               if "--output" not in {name for param in command.params for name in param.opts}}
    assert without == {"broker"}
