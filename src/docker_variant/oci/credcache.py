"""One command's credentials: within ``credentials_once`` each registry's are read once.

A command that reads a registry and then has the Docker engine pull from it would otherwise
run the registry's credential helper (a keychain prompt, a cloud CLI) twice. Light on
purpose: the CLI enters it for every command, most of which load no HTTP stack.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Hashable, Iterator
from typing import TypeVar

__all__ = ["credentials_once", "once_per_command"]

T = TypeVar("T")

_memo: dict[Hashable, object] | None = None
_lock = threading.Lock()


@contextlib.contextmanager
def credentials_once() -> Iterator[None]:
    """Within it, ``once_per_command`` reads each key once (the CLI: one command)."""
    global _memo
    with _lock:
        outer, _memo = _memo, {}
    try:
        yield
    finally:
        with _lock:
            _memo = outer


def once_per_command(key: Hashable, read: Callable[[], T]) -> T:
    """``read()``, or within ``credentials_once`` what it gave for ``key`` the first time."""
    with _lock:
        memo = _memo
    if memo is None:
        return read()
    if key not in memo:
        memo[key] = read()
    found: T = memo[key]  # type: ignore[assignment]
    return found
