"""A build context as the tar archive the Engine API's ``/build`` takes.

``.dockerignore`` is honoured for plain patterns (``*.log``, ``build/``, ``**/tmp``);
exceptions (``!pattern``) re-include what an earlier pattern left out, as Docker does.
"""

from __future__ import annotations

import fnmatch
import io
import tarfile
from pathlib import Path

from docker_variant.errors import InvalidInputError

__all__ = ["context_archive"]


def _ignore_rules(root: Path) -> list[tuple[bool, str]]:
    path = root / ".dockerignore"
    if not path.is_file():
        return []
    rules: list[tuple[bool, str]] = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keep = line.startswith("!")
        pattern = line.lstrip("!").strip().strip("/")
        if pattern.startswith("**/"):
            pattern = pattern[3:]
        rules.append((keep, pattern))
    return rules


def _ignored(relative: str, rules: list[tuple[bool, str]]) -> bool:
    ignored = False
    parts = relative.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for keep, pattern in rules:
        if any(fnmatch.fnmatchcase(p, pattern) for p in prefixes) or fnmatch.fnmatchcase(
            parts[-1], pattern
        ):
            ignored = not keep
    return ignored


def context_archive(root: Path, dockerfile: str) -> bytes:
    """The context under ``root`` as an uncompressed tar; ``dockerfile`` must be in it."""
    if not root.is_dir():
        raise InvalidInputError(f"build context {str(root)!r} is not a directory")
    target = (root / dockerfile).resolve()
    if not target.is_relative_to(root.resolve()):
        raise InvalidInputError(
            f"build context {str(root)!r}: dockerfile {dockerfile!r} leads outside it "
            f"(to {str(target)!r}); the engine sees only the context"
        )
    if not target.is_file():
        raise InvalidInputError(
            f"build context {str(root)!r} has no {dockerfile!r} (the matrix's dockerfile)"
        )
    rules = _ignore_rules(root)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for path in sorted(root.rglob("*")):
            relative = path.relative_to(root).as_posix()
            if relative != dockerfile and _ignored(relative, rules):
                continue
            archive.add(path, arcname=relative, recursive=False)
    return buffer.getvalue()
