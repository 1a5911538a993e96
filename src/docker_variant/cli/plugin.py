"""``install-plugin``: make ``docker variant ...`` run this ``docker-variant``.

The plugin is a small shell script. Docker runs it twice per command: first with
``docker-cli-plugin-metadata`` (the probe), then with the command. The script answers the
probe itself, without starting Python, for as long as the console script is not newer than
the script (an upgrade rewrites it: the probe then goes to ``docker_variant.entry``, which
answers with the new version)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer

from docker_variant.entry import PLUGIN_METADATA_JSON
from docker_variant.errors import InvalidInputError

__all__ = ["install_plugin", "plugin_script"]


def plugin_script(executable: Path) -> str:
    """The plugin: answers Docker's metadata probe while ``executable`` is not newer than
    the script, and runs ``executable`` with its arguments otherwise."""
    command = shlex.quote(str(executable))
    # the JSON holds no single quote (entry.PLUGIN_METADATA_JSON), so it quotes as it is
    return (
        "#!/bin/sh\n"
        "# Written by `docker-variant install-plugin`: Docker CLI plugin for docker-variant.\n"
        f'if [ "$1" = docker-cli-plugin-metadata ] && ! [ {command} -nt "$0" ]; then\n'
        f"  echo '{PLUGIN_METADATA_JSON}'\n"
        "  exit 0\n"
        "fi\n"
        f'exec {command} "$@"\n'
    )


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
        tmp.write_text(plugin_script(Path(executable).resolve()))
        tmp.chmod(0o755)
        tmp.replace(target)
    except OSError as exc:
        raise InvalidInputError(
            f"--dir {str(root)!r}: cannot install the plugin there "
            f"({exc.strerror or type(exc).__name__}); it must be a writable directory"
        ) from exc
    sys.stdout.write(f"Installed the Docker CLI plugin at {target}; try: docker variant --help\n")
