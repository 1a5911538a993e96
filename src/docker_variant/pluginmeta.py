"""The Docker CLI plugin's metadata: what ``docker-variant docker-cli-plugin-metadata``
answers, and what the installed plugin script echoes without starting Python. Kept apart
from the CLI so that the probe (``entry``) and ``install-plugin`` (``cli.plugin``) share it
without importing each other."""

from __future__ import annotations

from docker_variant import __version__

TYPE_CHECKING = False  # typing costs ~5 ms at start-up; type checkers read this as True

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "COMPLETION_COMMANDS",
    "PLUGIN_METADATA",
    "PLUGIN_METADATA_JSON",
    "PLUGIN_NAME",
    "SHIM_EXE_VARIABLE",
    "SHIM_VARIABLE",
    "VERSION_LINE",
    "plugin_script",
    "refresh_plugin_script",
]

#: What ``docker-variant --version`` prints: the entry answers it without the CLI, as it
#: does the probe, and the CLI's own ``--version`` (after other options) prints the same.
VERSION_LINE = f"docker-variant {__version__}\n"
PLUGIN_NAME = "variant"  # ``docker variant ...``: the plugin is docker-variant
#: How Docker asks a plugin to complete (cobra's protocol; Docker's bash script: NoDesc).
COMPLETION_COMMANDS = ("__complete", "__completeNoDesc")

PLUGIN_METADATA = {
    "SchemaVersion": "0.1.0",
    "Vendor": "docker-variant",
    "Version": __version__,
    "ShortDescription": "Pull the best PEP 817 variant of an image for this host",
}
#: ``json.dumps(PLUGIN_METADATA)``, written out: every value is ASCII without quotes or
#: backslashes (a PEP 440 version is), and the probe then needs no json module.
PLUGIN_METADATA_JSON = "{" + ", ".join(f'"{k}": "{v}"' for k, v in PLUGIN_METADATA.items()) + "}"

#: Set by the plugin script for the console script it runs: the script's own path, and the
#: console script's, so that a metadata probe the console script answers (after a reinstall)
#: can rewrite the script.
SHIM_VARIABLE = "DOCKER_VARIANT_PLUGIN_SCRIPT"
SHIM_EXE_VARIABLE = "DOCKER_VARIANT_PLUGIN_EXE"
_SHIM_MARK = "# Written by `docker-variant install-plugin`: Docker CLI plugin for docker-variant."
#: The exit status of a plugin script whose console script is gone (docs/reference/cli.md).
SHIM_BROKEN_EXIT = 4


def plugin_script(executable: Path) -> str:
    """The plugin: answers Docker's metadata probe itself while ``executable`` is not newer
    than the script (after a reinstall the console script answers it once, and rewrites the
    script: ``refresh_plugin_script``), and runs ``executable`` with its arguments. Where
    ``executable`` is gone, the probe is still answered (Docker keeps listing the plugin) and
    a command says how to repair it."""
    import shlex

    command = shlex.quote(str(executable))
    # the JSON holds no single quote (PLUGIN_METADATA_JSON), so it quotes as it is
    return (
        "#!/bin/sh\n"
        f"{_SHIM_MARK}\n"
        f"exe={command}\n"
        'if [ "$1" = docker-cli-plugin-metadata ] && ! [ "$exe" -nt "$0" ]; then\n'
        f"  echo '{PLUGIN_METADATA_JSON}'\n"
        "  exit 0\n"
        "fi\n"
        'if ! [ -x "$exe" ]; then\n'
        '  echo "docker-variant: error: the plugin runs $exe, which is gone" >&2\n'
        '  echo "hint: run \\`docker-variant install-plugin\\` with the docker-variant'
        ' to use" >&2\n'
        f"  exit {SHIM_BROKEN_EXIT}\n"
        "fi\n"
        f'{SHIM_VARIABLE}="$0" {SHIM_EXE_VARIABLE}="$exe" exec "$exe" "$@"\n'
    )


def refresh_plugin_script(script: str, executable: str) -> None:
    """Rewrite the plugin script at ``script`` (one ``install-plugin`` wrote) to run
    ``executable`` with this version's metadata: the console script was reinstalled, and
    Docker's next probes are answered by the script again, without starting Python. Quietly
    nothing where it cannot be (not such a script, a read-only directory): the probe is
    answered either way."""
    import os
    from pathlib import Path

    path = Path(script)
    try:
        with path.open("rb") as current:
            if _SHIM_MARK.encode() not in current.read(4096):
                return
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(plugin_script(Path(executable)))
        tmp.chmod(0o755)
        tmp.replace(path)
    except OSError:
        return
