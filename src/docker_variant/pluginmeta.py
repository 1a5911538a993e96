"""The Docker CLI plugin's metadata: what ``docker-variant docker-cli-plugin-metadata``
answers, and what the installed plugin script echoes without starting Python. Kept apart
from the CLI so that the probe (``entry``) and ``install-plugin`` (``cli.plugin``) share it
without importing each other."""

from __future__ import annotations

from docker_variant import __version__

__all__ = [
    "COMPLETION_COMMANDS",
    "PLUGIN_METADATA",
    "PLUGIN_METADATA_JSON",
    "PLUGIN_NAME",
    "VERSION_LINE",
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
