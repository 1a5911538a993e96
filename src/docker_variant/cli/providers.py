"""``providers``: what this host supports."""

from __future__ import annotations

from typing import Annotated

import typer

from docker_variant import vendors
from docker_variant.cli.options import options_of
from docker_variant.cli.output import emit_json, stdout_console
from docker_variant.render import host_table
from docker_variant.safetext import safe_text

__all__ = ["providers"]


def providers(
    ctx: typer.Context,
    devices: Annotated[
        bool, typer.Option("--devices", help="Also each device's own lists.")
    ] = False,
    refresh: Annotated[bool, typer.Option("--refresh", help="Ignore the detection cache.")] = False,
) -> None:
    """Print what this host supports (docs: reference/host-properties)."""
    opts = options_of(ctx)
    report = opts.host(refresh)
    if opts.json:
        emit_json(report.to_json() if devices else report.host)
        return
    stdout_console().print(host_table(report.host))
    for namespace, answered_by in report.sources.items():
        stdout_console().print(safe_text(f"{namespace} answered by {answered_by}", markup=True))
    if devices:
        for kind, by_id in report.devices.items():
            for device_id, lists in by_id.items():
                described = vendors.describe(kind, lists.get(kind, {}))
                heading = safe_text(
                    f"{kind} device {device_id}" + (f": {described}" if described else ""),
                    markup=True,
                )
                stdout_console().print(f"\n[bold]{heading}[/]")
                stdout_console().print(host_table(lists))
