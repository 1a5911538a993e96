"""``install-plugin``: make ``docker variant ...`` run this ``docker-variant``.

The plugin is a small shell script (``pluginmeta.plugin_script``). Docker runs it twice per
command: first with ``docker-cli-plugin-metadata`` (the probe), then with the command. The
script answers the probe itself, without starting Python, for as long as the console script
is not newer than the script; after a reinstall the probe goes to ``docker_variant.entry``
once, which answers with the new version and rewrites the script."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from docker_variant.errors import InvalidInputError
from docker_variant.pluginmeta import PLUGIN_NAME, plugin_script

__all__ = ["install_plugin", "plugin_args", "plugin_script"]

# The Docker CLI runs a plugin with its own whole command line, its global options included
# (``docker --context ci variant ls R`` runs ``docker-variant --context ci variant ls R``),
# so that a plugin can honour them. Those that choose an engine or a config become the
# variables that say the same; the rest (logging, the engine's TLS) do not apply here.
_DOCKER_VALUE_OPTIONS = {
    "--config": "DOCKER_CONFIG",
    "--context": "DOCKER_CONTEXT",
    "-c": "DOCKER_CONTEXT",
    "--host": "DOCKER_HOST",
    "-H": "DOCKER_HOST",
    "--log-level": "",
    "-l": "",
    "--tlscacert": "",
    "--tlscert": "",
    "--tlskey": "",
}
_DOCKER_FLAGS = frozenset({"--debug", "-D", "--tls", "--tlsverify"})


def plugin_args(args: list[str]) -> tuple[list[str], dict[str, str]] | None:
    """``args`` as the Docker CLI runs its plugin: Docker's global options, then
    ``variant``, then ours. The arguments after ``variant``, and the variables that say
    what Docker's options said (``DOCKER_HOST``, ``DOCKER_CONTEXT``, ``DOCKER_CONFIG``);
    ``None`` where ``args`` are not in that form (the console script run by hand)."""
    env: dict[str, str] = {}
    at = 0
    while at < len(args) and args[at] != PLUGIN_NAME:
        arg = args[at]
        name, eq, value = arg.partition("=")
        if name in _DOCKER_FLAGS:
            at += 1
            continue
        if name not in _DOCKER_VALUE_OPTIONS:
            short = arg[:2]  # pflag's -Hunix:///x
            if len(arg) > 2 and short in _DOCKER_VALUE_OPTIONS and not arg.startswith("--"):
                name, eq, value = short, "=", arg[2:]
            else:
                return None
        if not eq:
            if at + 1 >= len(args):
                return None
            value = args[at + 1]
            at += 1
        if variable := _DOCKER_VALUE_OPTIONS[name]:
            env[variable] = value
        at += 1
    if at >= len(args):
        return None
    return args[at + 1 :], env


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
