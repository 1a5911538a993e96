"""The console script's entry: answers Docker's plugin metadata probe before importing the CLI.

Docker runs ``docker-variant docker-cli-plugin-metadata`` before every ``docker variant ...``
and for ``docker --help``; answering it without loading typer, rich and httpx keeps that
probe at bare interpreter start-up cost.

Every other command goes to ``docker_variant.cli``, whose commands import what they use.
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


#: Optional imports that libraries make whenever the package is installed, and that this
#: process never uses. Each library falls back cleanly when the import fails, which a ``None``
#: in ``sys.modules`` makes it do.
UNUSED_OPTIONAL_IMPORTS = (
    # httpx imports its own command line (click, rich.syntax, pygments lexers) whenever rich
    # is installed: 30 to 50 ms of every registry command; the fallback is a stub httpx.main.
    "httpx._main",
    # httpcore imports trio, if installed (selenium brings it), to support running under
    # trio: 120 to 250 ms here (trio, attrs). This process runs asyncio only.
    "trio",
)


def _skip_unused_optional_imports() -> None:
    for name in UNUSED_OPTIONAL_IMPORTS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: cannot import


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["docker-cli-plugin-metadata"]:
        sys.stdout.write(json.dumps(PLUGIN_METADATA) + "\n")
        return
    _skip_unused_optional_imports()
    from docker_variant.cli import main as cli_main

    cli_main(args)
