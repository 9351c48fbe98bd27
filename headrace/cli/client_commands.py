"""Registers the client-side command groups on the ``headrace`` typer app.

Kept apart from ``main.py`` (which owns ``headrace broker``) so the two halves of the command
line change independently. Import-time only; no state.
"""

from __future__ import annotations

import typer

from headrace.cli import bench, cluster, configs, consume, dump_log, produce, repair, topics


def register(app: typer.Typer) -> None:
    app.add_typer(topics.app, name="topics")
    app.command("produce")(produce.produce)
    app.command("consume")(consume.consume)
    app.command("dump-log")(dump_log.dump_log)
    app.command("repair")(repair.repair)
    app.add_typer(configs.app, name="configs")
    app.add_typer(cluster.app, name="cluster")
    app.add_typer(bench.app, name="bench")
