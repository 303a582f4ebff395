"""``lerobot plugins``: each plugin, its package and version, and what it registered."""

from __future__ import annotations

import json

import click

from lerobot_kit.cli.errors import command_errors


@click.command(help="List installed plugins and what each registered.")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def command(as_json: bool) -> None:
    from lerobot_kit.core.registry.registry import get_registry

    with command_errors(as_json=as_json):
        registry = get_registry()
        rows = []
        for plugin in registry.plugins:
            provided = [{"kind": r.kind, "name": r.name} for r in registry.by_plugin(plugin.name)]
            rows.append(
                {"plugin": plugin.name, "package": plugin.package, "version": plugin.version,
                 "builtin": plugin.builtin, "registered": provided}
            )
        if as_json:
            click.echo(json.dumps(rows, indent=2))
            return
        for row in rows:
            origin = "built-in" if row["builtin"] else "entry point"
            click.echo(f"{row['plugin']}  ({row['package']} {row['version']}, {origin})")
            for item in row["registered"]:
                click.echo(f"    {item['kind']}: {item['name']}")
