"""The command line in a subprocess, as a user runs it: the one way the CLI tests start it."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

__all__ = ["cli_env", "run_cli", "run_in_process"]

#: Settings of the caller's environment that would change what a command does (the engine,
#: Docker's config and credentials, a providers file or host root, forced NVIDIA values).
CLEARED_PREFIXES = ("DOCKER_", "NV_VARIANT")


def cli_env(env: Mapping[str, str] | None = None, tmp: Path | None = None) -> dict[str, str]:
    """This process's environment less ``CLEARED_PREFIXES``, plus ``env``; with ``tmp``, the
    detection cache and the user's descriptor directory under it."""
    full = {k: v for k, v in os.environ.items() if not k.startswith(CLEARED_PREFIXES)}
    if tmp is not None:
        full |= {"XDG_CACHE_HOME": str(tmp / "cache"), "XDG_CONFIG_HOME": str(tmp / "config")}
    return full | dict(env or {})


def run_cli(
    *args: str,
    env: Mapping[str, str] | None = None,
    tmp: Path | None = None,
    timeout: float = 60,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """``docker-variant ARGS`` (as ``python -m docker_variant``) in ``cli_env(env, tmp)``."""
    return subprocess.run(
        [sys.executable, "-m", "docker_variant", *args],
        capture_output=True,
        text=True,
        env=cli_env(env, tmp),
        timeout=timeout,
        cwd=cwd,
    )


def run_in_process(
    main: Callable[[list[str]], int], argv: list[str], capsys: pytest.CaptureFixture[str]
) -> tuple[int, str]:
    """A command's ``main(argv)`` in this process: (exit code, what it wrote to stderr)."""
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = int(exit_.code or 0)
    return code, capsys.readouterr().err
