"""Where commands write: rich consoles (made on first use), JSON, warnings."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NoReturn

from docker_variant.errors import EXIT_BROKEN_PIPE
from docker_variant.safetext import safe_text

if TYPE_CHECKING:
    from rich.console import Console

__all__ = [
    "broken_pipe",
    "emit_json",
    "error",
    "json_on_one_line",
    "layer_progress",
    "stderr_console",
    "stderr_is_terminal",
    "stdout_console",
    "warn",
]


def broken_pipe() -> NoReturn:
    """stdout's reader went away (``| head``): stdout muted on /dev/null, so that no later
    write or the final flush fails again, and the exit status a broken pipe's
    (``EXIT_BROKEN_PIPE``), never 1 ("no compatible variant")."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    raise SystemExit(EXIT_BROKEN_PIPE)


# The width a table gets in a pipe or a log: none to fit, so no cell is cut over lines.
_UNBOUNDED_WIDTH = 1 << 14


def _console(stderr: bool) -> Console:
    """rich's console, made on first use (rich.console costs ~15 ms to import). Without
    emoji codes: none is meant, and their table costs 5 to 12 ms more to load. On a
    terminal, tables fit its width; elsewhere (a pipe, a log, a test) a row is one line
    however long, so that grep finds a whole reason or property (rich would fold them at
    80 columns), unless ``COLUMNS`` says otherwise."""
    from rich.console import Console

    class CliConsole(Console):
        def on_broken_pipe(self) -> None:
            """rich's own (stdout muted on /dev/null), but the exit status is a broken
            pipe's, not 1 ("no compatible variant")."""
            self.quiet = True
            broken_pipe()

    console = CliConsole(stderr=stderr, soft_wrap=True, emoji=False)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = _UNBOUNDED_WIDTH
    return console


@functools.cache
def stdout_console() -> Console:
    """The console for tables."""
    return _console(stderr=False)


@functools.cache
def stderr_console() -> Console:
    """The console for progress bars and the tables that go with errors."""
    return _console(stderr=True)


#: ``--format '{{json .}}'``: JSON on one line, as docker writes it (``json_on_one_line``).
_ONE_LINE: list[bool] = [False]


def json_on_one_line(wanted: bool) -> None:
    """Whether ``emit_json`` writes one line (``--format '{{json .}}'``) or indents."""
    _ONE_LINE[0] = wanted


def emit_json(data: Any) -> None:
    if _ONE_LINE[0]:
        sys.stdout.write(json.dumps(data, separators=(",", ":")) + "\n")
    else:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")


def error(message: str, hint: str | None = None) -> None:
    """The one style of every failure: ``docker-variant: error: MESSAGE`` on stderr, then
    ``hint: HINT`` where there is something to do about it. ``message`` may quote outside
    text (a fuzzed index key held a newline, a registry may send a terminal escape): shown
    as escapes, it stays one line and harmless."""
    sys.stderr.write(f"docker-variant: error: {safe_text(message, markup=False)}\n")
    if hint:
        sys.stderr.write(f"hint: {safe_text(hint, markup=False)}\n")


def warn(message: str) -> None:
    """One line on stderr; ``message`` may quote outside text (shown safely)."""
    sys.stderr.write(f"docker-variant: warning: {safe_text(message, markup=False)}\n")


def stderr_is_terminal() -> bool:
    """Whether stderr is a terminal, decided as rich decides it (``TTY_COMPATIBLE``, then
    ``FORCE_COLOR``, then the file), without importing rich."""
    compatible = os.environ.get("TTY_COMPATIBLE", "")
    if compatible in ("0", "1"):
        return compatible == "1"
    forced = os.environ.get("FORCE_COLOR")
    if forced is not None:
        return forced != ""
    try:
        return sys.stderr.isatty()
    except ValueError:  # closed
        return False


def layer_progress(
    action: str, image: str, *, shown: bool = True
) -> contextlib.AbstractContextManager[Callable[[dict[str, Any]], None]]:
    """What takes the engine's events of a pull or push of ``image``: rich bars on a
    terminal; in a log or pipe, one plain line per layer when it is done, naming the image
    (no rich loaded); nothing when not ``shown`` (``--json``)."""
    if not shown:
        return contextlib.nullcontext(lambda event: None)
    if stderr_is_terminal():
        from docker_variant.docker.progress import LayerProgress

        return LayerProgress(action, console=stderr_console())
    from docker_variant.docker.events import LayerLines

    return LayerLines(action, sys.stderr, image)
