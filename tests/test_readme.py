"""The defaults the documentation states are the declared ones: README.md's defaults table and
``headrace broker --help`` against the broker's config declarations (``BROKER_CONFIGS``, which
takes the coordinator's and the topic configs' defaults from their own declarations)."""

import re
from pathlib import Path

from headrace.broker.config import BROKER_CONFIGS, parse_listener
from headrace.cli import main
from headrace.cli.cleaner import DEFAULT_LOG_DIR
from headrace.cli.common import DEFAULT_BOOTSTRAP_SERVER

README = Path(__file__).resolve().parent.parent / "README.md"
TABLE_ROW = re.compile(r"^\| `(?P<name>[a-z.]+)` \| `(?P<default>[^`]*)`(?: \((?P<gloss>[^)]*)\))? \|")
BYTE_UNITS = {"MiB": 1 << 20, "KiB": 1 << 10}


def _readme_defaults() -> dict[str, tuple[str, str | None]]:
    rows = (TABLE_ROW.match(line) for line in README.read_text().splitlines())
    return {row["name"]: (row["default"], row["gloss"]) for row in rows if row}


def test_the_readme_defaults_table_matches_the_declarations():
    documented = _readme_defaults()
    assert len(documented) >= 10, "the README's defaults table was not found"
    wrong = {name: (default, BROKER_CONFIGS[name].default if name in BROKER_CONFIGS else None)
             for name, (default, _) in documented.items()
             if name not in BROKER_CONFIGS or BROKER_CONFIGS[name].default != default}
    assert not wrong, f"README default -> declared default: {wrong}"


def test_the_readme_glosses_say_the_same_number():
    for name, (default, gloss) in _readme_defaults().items():
        sized = re.fullmatch(r"(\d+) (MiB|KiB)(/s)?", gloss or "")
        if sized:
            assert int(sized[1]) * BYTE_UNITS[sized[2]] == int(default), name


def test_broker_help_names_the_default_listener_and_log_dir():
    host, port = parse_listener(BROKER_CONFIGS["listeners"].default)
    assert f"default {host}:{port}, data under {BROKER_CONFIGS['log.dir'].default})" in \
        main.broker.__doc__


def test_the_client_commands_default_to_the_default_broker():
    host, port = parse_listener(BROKER_CONFIGS["listeners"].default)
    assert DEFAULT_BOOTSTRAP_SERVER == f"{host}:{port}"
    assert DEFAULT_LOG_DIR == Path(BROKER_CONFIGS["log.dir"].default)
