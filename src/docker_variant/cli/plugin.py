"""``install-plugin``: make ``docker variant ...`` run this ``docker-variant``. (Docker's
metadata probe is answered by ``docker_variant.entry``, before this package is imported.)"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from docker_variant.errors import InvalidInputError

__all__ = ["install_plugin"]


def install_plugin(
    directory: Annotated[
        Path | None,
        typer.Option("--dir", help="Plugin directory (default $DOCKER_CONFIG/cli-plugins)."),
    ] = None,
) -> None:
    """Make `docker variant ...` run this docker-variant."""
    import os
    import shutil

    root = (
        directory
        or Path(os.environ.get("DOCKER_CONFIG") or Path.home() / ".docker") / "cli-plugins"
    )
    executable = shutil.which("docker-variant") or str(
        Path(sys.executable).parent / "docker-variant"
    )
    if not Path(executable).exists():
        raise InvalidInputError(
            f"cannot find the docker-variant executable (looked at {executable})"
        )
    target = root / "docker-variant"
    tmp = target.with_suffix(".tmp")
    try:
        root.mkdir(parents=True, exist_ok=True)
        # A wrapper, not a copy: the console script needs its own interpreter and environment.
        tmp.write_text(f'#!/bin/sh\nexec "{Path(executable).resolve()}" "$@"\n')
        tmp.chmod(0o755)
        tmp.replace(target)
    except OSError as exc:
        raise InvalidInputError(
            f"--dir {str(root)!r}: cannot install the plugin there "
            f"({exc.strerror or type(exc).__name__}); it must be a writable directory"
        ) from exc
    sys.stdout.write(f"Installed the Docker CLI plugin at {target}; try: docker variant --help\n")
