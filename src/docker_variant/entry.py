"""The console script's entry: answers Docker's plugin metadata probe before importing the CLI.

Docker runs ``docker-variant docker-cli-plugin-metadata`` before every ``docker variant ...``
and for ``docker --help``; answering it without loading typer, rich and httpx keeps that
probe at bare interpreter start-up cost; ``docker-variant --version`` is answered the same way.

Every other command goes to ``docker_variant.cli``, whose commands import what they use,
with two start-up savings: no cyclic garbage collection while the CLI's modules load (they
live as long as the process: collecting would only traverse them again and again; they are
frozen out of later collections), and an exit without the interpreter's teardown once the
output is flushed and the exit handlers ran.
"""

from __future__ import annotations

import atexit
import gc
import os
import sys

from docker_variant.errors import EXIT_BROKEN_PIPE
from docker_variant.pluginmeta import (
    PLUGIN_METADATA_JSON,
    SHIM_EXE_VARIABLE,
    SHIM_VARIABLE,
    VERSION_LINE,
    refresh_plugin_script,
)

#: Optional imports that libraries make whenever the package is installed, and that this
#: process never uses. Each library falls back cleanly when the import fails, which a ``None``
#: in ``sys.modules`` makes it do.
UNUSED_OPTIONAL_IMPORTS = (
    # httpx imports its own command line (click, rich.syntax, pygments lexers) whenever rich
    # is installed: 30 to 50 ms of every registry command; the fallback is a stub httpx.main.
    # A private name with no public switch: tests/test_private_names.py fails if httpx
    # stops importing it (this line would then do nothing).
    "httpx._main",
    # httpcore imports trio, if installed (selenium brings it), to support running under
    # trio: 120 to 250 ms here (trio, attrs). This process runs asyncio only.
    "trio",
)


def _skip_unused_optional_imports() -> None:
    for name in UNUSED_OPTIONAL_IMPORTS:
        sys.modules.setdefault(name, None)  # type: ignore[arg-type]  # None: cannot import


def _exit_code(status: object) -> int:
    """``SystemExit.code`` as the interpreter turns it into an exit status."""
    if status is None:
        return 0
    if isinstance(status, int):
        return status
    sys.stderr.write(f"{status}\n")
    return 1


def _exit_now(code: int) -> None:
    """Exit as the interpreter would, less its teardown of every module and object (tens
    of ms once typer, httpx and rich are loaded): stdout and stderr are flushed and the
    ``atexit`` handlers run first. With a thread still running it exits the usual way, so
    that the thread is waited for."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away (``| head``), a closed file
            if stream is sys.stdout:
                code = code or EXIT_BROKEN_PIPE  # the reader went away before the last flush
    import threading  # loaded by then (httpx, typer): a look-up

    if threading.active_count() > 1:
        sys.exit(code)
    # No public API runs the atexit handlers and then skips the teardown: this private one
    # is what the interpreter itself calls (tests/test_private_names.py keeps it so).
    atexit._run_exitfuncs()
    os._exit(code)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["docker-cli-plugin-metadata"]:
        sys.stdout.write(PLUGIN_METADATA_JSON + "\n")
        script, executable = os.environ.get(SHIM_VARIABLE), os.environ.get(SHIM_EXE_VARIABLE)
        if script and executable:  # asked through a plugin script that went stale
            refresh_plugin_script(script, executable)
        return
    if args == ["--version"]:  # as cheap as the probe (tests/test_startup_imports.py)
        sys.stdout.write(VERSION_LINE)
        return
    gc.disable()
    _skip_unused_optional_imports()
    from docker_variant.cli import main as cli_main

    gc.freeze()  # what start-up made stays: later collections skip it
    gc.enable()
    try:
        cli_main(args)
    except SystemExit as done:
        _exit_now(_exit_code(done.code))
    _exit_now(0)
