"""Shell completion: typer's for ``docker-variant`` itself (``--install-completion``,
``--show-completion``: bash, zsh, fish), and cobra's protocol for ``docker variant <TAB>``.

Docker completes a CLI plugin by running it as ``docker-variant __complete ARGS... INCOMPLETE``
(``__completeNoDesc`` from Docker's bash script, which leaves the plugin's own name out): one
candidate a line (``value<TAB>description`` with ``__complete``), then ``:DIRECTIVE``, cobra's
``ShellCompDirective`` (4: no file completion; 0: the shell's default, files). Both ways go
through click's completion of the same commands, so they list the same commands and options.

Image references complete their tags from the registry (``reg/app:<TAB>``), within a short
timeout; a registry that cannot be reached completes nothing, silently, as completion must.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from docker_variant.errors import DockerVariantError
from docker_variant.pluginmeta import PLUGIN_NAME

__all__ = ["complete_reference", "run_cobra_completion"]

_NO_FILE_COMPLETION = 4  # cobra.ShellCompDirectiveNoFileComp
_DEFAULT = 0  # cobra.ShellCompDirectiveDefault: the shell completes file names
_PATHS = ("file", "dir")  # click's completion types that the shell completes itself
_TAG_TIMEOUT_S = 2.0
_MAX_TAGS = 500


def complete_reference(incomplete: str) -> list[str]:
    """``registry/name:TAG`` for each tag of the repository that starts as typed; nothing
    before the colon (a repository is not listed: registries' catalogs are off or huge)."""
    repository, colon, prefix = incomplete.rpartition(":")
    if not colon or "/" not in repository or "/" in prefix:
        return []
    from docker_variant.oci.client import SyncRegistryClient
    from docker_variant.oci.grammar import tag_problem
    from docker_variant.oci.reference import parse_reference

    try:
        reference = parse_reference(repository)
        with SyncRegistryClient.for_registry(reference.registry, timeout=_TAG_TIMEOUT_S) as client:
            tags = client.list_tags(reference.repository)
    except (DockerVariantError, OSError):
        return []
    # only tags of the grammar: Docker's bash script expands each candidate (``compgen -W``),
    # so a registry's ``$(...)`` would run in the user's shell
    valid = (tag for tag in sorted(tags) if tag_problem(tag) is None)
    return [f"{repository}:{tag}" for tag in valid if tag.startswith(prefix)][:_MAX_TAGS]


def run_cobra_completion(command: click.Command, args: Sequence[str]) -> int:
    """Answer ``__complete``/``__completeNoDesc ARGS... INCOMPLETE`` on stdout; exit code 0."""
    from click.shell_completion import CompletionItem, ShellComplete  # only when completing

    asked, *words = args
    if words[:1] == [PLUGIN_NAME]:  # Docker's own ``docker __complete variant ...``
        words = words[1:]
    *before, incomplete = words or [""]
    completer = ShellComplete(command, {}, "docker-variant", "_DOCKER_VARIANT_COMPLETE")
    try:
        items: list[CompletionItem] = completer.get_completions(before, incomplete)
    except (click.ClickException, click.exceptions.Exit, DockerVariantError):
        items = []
    lines = []
    for item in items:
        if item.type in _PATHS:
            continue  # the directive below hands those to the shell
        value = str(item.value)
        if asked == "__complete" and item.help:
            value += "\t" + " ".join(str(item.help).split())
        lines.append(value)
    wants_files = any(item.type in _PATHS for item in items) or not items
    directive = _DEFAULT if wants_files else _NO_FILE_COMPLETION
    sys.stdout.write("".join(f"{line}\n" for line in lines) + f":{directive}\n")
    sys.stderr.write(f"Completion ended with directive: {directive}\n")
    return 0
