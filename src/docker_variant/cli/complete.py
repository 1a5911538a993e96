"""Shell completion: typer's for ``docker-variant`` itself (``--install-completion``,
``--show-completion``: bash, zsh, fish), and cobra's protocol for ``docker variant <TAB>``.

Docker completes a CLI plugin by running it as ``docker-variant __complete ARGS... INCOMPLETE``
(``__completeNoDesc`` from Docker's bash script, which leaves the plugin's own name out): one
candidate a line (``value<TAB>description`` with ``__complete``), then ``:DIRECTIVE``, cobra's
``ShellCompDirective`` (4: no file completion; 0: the shell's default, files). Both ways go
through click's completion of the same commands, so they list the same commands and options.

Image references complete their tags from the registry (``reg/app:<TAB>``), all of it within
2 s (less when ``DOCKER_VARIANT_REGISTRY_TIMEOUT`` says less) and the page cap of a command's
reads; a registry that cannot be reached, or is too slow or too long, completes nothing,
silently, as completion must: the user's shell waits on it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from types import FrameType

import click

from docker_variant.errors import DockerVariantError
from docker_variant.pluginmeta import PLUGIN_NAME

__all__ = ["complete_reference", "run_cobra_completion"]

_NO_FILE_COMPLETION = 4  # cobra.ShellCompDirectiveNoFileComp
_DEFAULT = 0  # cobra.ShellCompDirectiveDefault: the shell completes file names
_PATHS = ("file", "dir")  # click's completion types that the shell completes itself
_TAG_TIMEOUT_S = 2.0
_MAX_TAGS = 500
_ALARM_MARGIN_S = 0.5  # the client's own deadline ends it first, cleanly


class _TimeUp(Exception):
    """The completion's time is up (``_hard_deadline``)."""


@contextmanager
def _hard_deadline(seconds: float) -> Iterator[None]:
    """Raise ``_TimeUp`` in this thread after ``seconds``: the client's deadline is checked
    between reads and chunks, this also ends a slow name lookup, a slow credential helper or
    a response head sent a byte at a time. Only in the main thread (signals go there), which
    is where ``__complete`` runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: FrameType | None) -> None:
        raise _TimeUp

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def complete_reference(incomplete: str) -> list[str]:
    """``registry/name:TAG`` for each tag of the repository that starts as typed; nothing
    before the colon (a repository is not listed: registries' catalogs are off or huge)."""
    repository, colon, prefix = incomplete.rpartition(":")
    if not colon or "/" not in repository or "/" in prefix:
        return []
    from docker_variant.oci.client import SyncRegistryClient, read_limits
    from docker_variant.oci.grammar import tag_problem
    from docker_variant.oci.reference import parse_reference

    try:
        reference = parse_reference(repository)
        deadline = min(read_limits()[0], _TAG_TIMEOUT_S)
        with (
            _hard_deadline(deadline + _ALARM_MARGIN_S),
            SyncRegistryClient.for_registry(
                reference.registry, timeout=deadline, deadline=deadline
            ) as client,
        ):
            tags = client.list_tags(reference.repository)
    except (DockerVariantError, OSError, _TimeUp):
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
