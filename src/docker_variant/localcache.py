"""Small JSON entries under ``$XDG_CACHE_HOME/docker-variant`` (else ``~/.cache``), for what
a command should not pay for every time. Reads ignore anything missing, expired, corrupt or
unreadable; writes are atomic, so a crash never leaves a poisoned entry."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from docker_variant.errors import InvalidInputError
from docker_variant.jsondoc import read_json_file

__all__ = ["cache_dir", "read_entry", "write_entry"]

_ENTRY_LIMIT = 16 << 20


def cache_dir(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    base = env.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "docker-variant"


def read_entry(name: str, ttl: float, env: Mapping[str, str] | None = None) -> Any | None:
    """The value written as ``name`` less than ``ttl`` seconds ago, else ``None``."""
    path = cache_dir(env) / name
    with contextlib.suppress(InvalidInputError, ValueError, KeyError, TypeError):
        entry = read_json_file(path, f"cache entry {name}", max_bytes=_ENTRY_LIMIT)
        if time.time() - float(entry["created"]) < ttl:
            return entry["value"]
    return None


def write_entry(name: str, value: Any, env: Mapping[str, str] | None = None) -> None:
    """Store ``value`` (JSON) as ``name``; best effort, a cache that cannot be written is none."""
    path = cache_dir(env) / name
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".entry-", suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            json.dump({"created": time.time(), "value": value}, handle)
        os.replace(tmp, path)
