"""Where commands write: rich consoles (made on first use), JSON, warnings."""

from __future__ import annotations

import functools
import json
import sys
from typing import TYPE_CHECKING, Any

from docker_variant.safetext import safe_text

if TYPE_CHECKING:
    from rich.console import Console

__all__ = ["emit_json", "stderr_console", "stdout_console", "warn"]


@functools.cache
def stdout_console() -> Console:
    """rich's console for tables, made on first use (rich.console costs ~15 ms to import).
    Without emoji codes: none is meant, and their table costs 5 to 12 ms more to load."""
    from rich.console import Console

    return Console(soft_wrap=True, emoji=False)


@functools.cache
def stderr_console() -> Console:
    """rich's console for progress bars and the tables that go with errors."""
    from rich.console import Console

    return Console(stderr=True, soft_wrap=True, emoji=False)


def emit_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def warn(message: str) -> None:
    """One line on stderr; ``message`` may quote outside text (shown safely)."""
    sys.stderr.write(f"docker-variant: warning: {safe_text(message, markup=False)}\n")
