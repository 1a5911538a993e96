"""The console script's entry: answers Docker's plugin metadata probe before importing the CLI.

Docker runs ``docker-variant docker-cli-plugin-metadata`` before every ``docker variant ...``
and for ``docker --help``; answering it without loading typer, rich and httpx keeps that
probe at bare interpreter start-up cost.
"""

from __future__ import annotations

import json
import sys

from docker_variant import __version__

PLUGIN_METADATA = {
    "SchemaVersion": "0.1.0",
    "Vendor": "docker-variant",
    "Version": __version__,
    "ShortDescription": "Pull the best PEP 817 variant of an image for this host",
}


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["docker-cli-plugin-metadata"]:
        sys.stdout.write(json.dumps(PLUGIN_METADATA) + "\n")
        return
    from docker_variant.cli import main as cli_main

    cli_main(args)
